package fusefs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Renames of a lost session.
//
// A blob store has no rename: blobfs renames a file with a server-side Copy
// to the new name and a Delete of the old one. A process that dies between
// the two leaves both names. While a keeper holds the mount, the kernel
// resends the rename to the next server, which finishes it (exactlyonce.go).
// When the keeper died too, nobody would: so before the Copy, the rename
// writes a small record file into the spill directory (renamePrefix), and
// removes it once the old name is deleted and its directory kept (a
// directory that only the file made would otherwise go with it, while the
// application renamed a file, not a directory). The next filesystem on the same
// cache directory, holding the directory's exclusive lock (spillrecover.go),
// finishes what each record it finds began:
//
//   - the old name gone: the rename was done (or the file deleted): only
//     the old name's directory is kept, as the rename would have;
//   - the new name missing: the Copy never landed: the file keeps its old
//     name (the rename was never acknowledged);
//   - both there, the new one a copy of the old one (the same size, and the
//     same blobfs commit nonce or Content-MD5, which a Copy carries): the old
//     name is deleted, on the condition of the ETag just seen, and its
//     directory kept;
//   - both there with other content (someone wrote either name since): both
//     are left, with a warning that names them.
//
// The record is written without fsync: it is for the death of processes,
// which leaves the page cache; after a crash of the whole node both names
// can remain (docs/semantics.md). Renames of directories copy many blobs and
// are not recorded; a resent rename completes them while the keeper lives.

// renamePrefix names the rename records in the spill directory.
const renamePrefix = "rename-"

// renameRecord is what a rename record says. No secrets.
type renameRecord struct {
	Store string `json:"store,omitempty"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// recordRename writes the record of a rename about to copy from to to, and
// returns its path ("" if it could not be written: the rename goes on, as
// it did before records existed, and says so at DEBUG).
func (fs *FS) recordRename(from, to string) string {
	b, err := json.Marshal(renameRecord{Store: fs.opts.StoreID, From: from, To: to})
	if err != nil {
		return ""
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	path := filepath.Join(fs.spillDir, renamePrefix+hex.EncodeToString(id[:]))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		fs.log.Debug("rename: cannot record it in the cache directory", "from", from, "to", to, "err", err)
		return ""
	}
	return path
}

// renameDone removes a rename's record once the old name is deleted and
// its directory kept, or the rename failed before its Copy could land.
func renameDone(record string) {
	if record != "" {
		os.Remove(record)
	}
}

// renameRecords lists the rename records in the spill directory.
func (fs *FS) renameRecords() []string {
	entries, _ := os.ReadDir(fs.spillDir)
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), renamePrefix) {
			out = append(out, filepath.Join(fs.spillDir, e.Name()))
		}
	}
	return out
}

// finishRename completes the rename a dead session recorded at path. It
// returns an error, leaving the record, when the store could not be
// reached: to be tried again.
func (fs *FS) finishRename(ctx context.Context, path string) error {
	b, err := os.ReadFile(path)
	var rec renameRecord
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil || rec.From == "" || rec.To == "" {
		fs.log.Warn("a rename record of a lost session cannot be read; removed", "record", path, "err", err)
		os.Remove(path)
		return nil
	}
	if rec.Store != fs.opts.StoreID {
		fs.log.Warn("a rename record of a lost session names another store; removed", "record", path, "store", rec.Store, "path", rec.From, "to", rec.To)
		os.Remove(path)
		return nil
	}
	retry := func(err error) bool { return err != nil && !errors.Is(err, blobstore.ErrNotFound) }
	src, serr := fs.store.Stat(ctx, rec.From)
	if retry(serr) {
		return serr
	}
	dst, derr := fs.store.Stat(ctx, rec.To)
	if retry(derr) {
		return derr
	}
	fromDir, _ := meta.SplitPath(rec.From) // kept, as the rename would have
	switch {
	case serr != nil:
		fs.log.Debug("a rename of a lost session had finished", "path", rec.From, "to", rec.To)
		fs.keepDir(ctx, fromDir)
	case derr != nil:
		fs.log.Info("a rename of a lost session did not reach the store; the file keeps its old name", "path", rec.From, "to", rec.To)
	case sameContent(src, dst):
		err := fs.store.Delete(ctx, rec.From, blobstore.Conditions{IfMatch: src.ETag})
		switch {
		case err == nil || errors.Is(err, blobstore.ErrNotFound):
			fs.log.Info("finished a rename of a lost session: its copy was made, the old name is removed", "path", rec.From, "to", rec.To)
			fs.keepDir(ctx, fromDir)
		case errors.Is(err, blobstore.ErrPreconditionFailed):
			fs.log.Warn("a rename of a lost session left both names, and the old one changed since: both are kept", "path", rec.From, "to", rec.To)
		default:
			return err
		}
	default:
		fs.log.Warn("a rename of a lost session left both names, and the new one is not known to be a copy of the old one (written since, or without a commit nonce or Content-MD5 to compare): both are kept", "path", rec.From, "to", rec.To)
	}
	os.Remove(path)
	return nil
}

// sameContent tells whether dst is a Copy of src: a Copy carries the
// metadata (blobfs's commit nonce) and the Content-MD5 along with the
// bytes. Blobs with neither cannot be told apart, and are not.
func sameContent(src, dst blobstore.Attrs) bool {
	if src.Size != dst.Size {
		return false
	}
	if a, ok := meta.Value(src.Metadata, blobstore.MetaCommit); ok {
		b, ok := meta.Value(dst.Metadata, blobstore.MetaCommit)
		return ok && a == b
	}
	return len(src.ContentMD5) > 0 && string(src.ContentMD5) == string(dst.ContentMD5)
}
