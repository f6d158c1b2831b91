package fusefs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Spill files of a lost session.
//
// A process that dies with files open leaves their spill files in the cache
// directory. While a keeper holds the mount, its state region names them
// and the next server uploads them (adopt.go). When the keeper died too, the
// region is gone and the mount with it; the spill files would stay there,
// unknown, for ever. So every spill file carries its own record: which blob
// it is for, whether it holds changes the store does not have, and the
// condition under which the store still holds what the session started from
// (the ETag it loaded or last committed, the ETag it truncated, or absence).
// The next filesystem on the same cache directory (New) uploads each dirty
// orphan under that condition, and moves it to lost+found when the blob
// changed meanwhile; it removes clean ones.
//
// The record is an extended attribute of the spill file, not a file beside
// it: setting one is a single atomic syscall (a process killed mid-update
// leaves the old record or the new one), it follows the spill file through
// the pool's renames, and it costs no inode (allocating inodes is what
// makes small files slow on the cache disk, see spillpool.go). The spill
// file's length is the size of its valid data: a WRITE is answered only
// once its bytes are in it, and a truncate cuts it. Where the cache
// directory's file system keeps no user extended attributes, orphans can
// only go to lost+found; New says so once.
//
// Only one filesystem may recover a directory's orphans, and none while
// another one uses the directory: each holds a flock on the spill directory
// for its life (released by the kernel when the process dies), exclusive
// while it recovers and shared after; one that cannot take it exclusively
// leaves the files alone.

// spillRecordXattr names the record's extended attribute.
const spillRecordXattr = "user.blobfs.spill"

// spillRecord is what a spill file says about itself. No secrets.
type spillRecord struct {
	// Store is Options.StoreID of the filesystem that wrote it.
	Store string `json:"store,omitempty"`
	// Blob is the blob's name when the record was written.
	Blob string `json:"blob"`
	// Dirty: the spill file holds changes the store does not have.
	Dirty bool `json:"dirty"`
	// IfMatch is the ETag of the blob the spill file's content started
	// from; empty with IfNoneMatch when the blob did not exist.
	IfMatch     string `json:"ifMatch,omitempty"`
	IfNoneMatch bool   `json:"ifNoneMatch,omitempty"`
	// Nonce names a commit that may have reached the store without its
	// answer reaching the dead process (blobstore.MetaCommit).
	Nonce string `json:"nonce,omitempty"`
	// Attrs are the file's POSIX attributes as metadata keys (attrs.go):
	// a file created here and not yet committed has them nowhere else.
	Attrs map[string]string `json:"attrs,omitempty"`
	// Pooled names the spill file of a record that holds nothing: the
	// file went back to the pool (clearSpillRecord).
	Pooled string `json:"pooled,omitempty"`
	// Unlinked: the file was unlinked (or replaced by a rename) through
	// its mount while open; a process adopting the mount keeps it so.
	// (Records written before it existed lack it: false.)
	Unlinked bool `json:"unlinked,omitempty"`
}

// recordLocked writes the spill file's record, if it changed; dirty says
// whether it holds changes the store lacks. The caller holds of.mu.
func (of *openFile) recordLocked(dirty bool) {
	if of.spill == nil {
		return
	}
	fs := of.fs
	path, ok := fs.pathOf(of.n)
	rec := spillRecord{Store: fs.opts.StoreID, Blob: path, Dirty: dirty && ok && !of.unlinked, Unlinked: of.unlinked, Nonce: of.commitNonce, Attrs: map[string]string{}}
	fs.mu.Lock()
	fs.attrsMetaLocked(of.n, rec.Attrs)
	fs.mu.Unlock()
	if of.mtime != nil {
		// A utime that waits for the next commit: a successor's commit
		// must store it too.
		rec.Attrs[blobstore.MetaMtime] = strconv.FormatInt(of.mtime.UnixNano(), 10)
	}
	// The commit's own condition; where that is unknown (none), an
	// orphan goes up only where no blob is in its way.
	c := of.conditionsLocked()
	rec.IfMatch, rec.IfNoneMatch = c.IfMatch, c.IfMatch == ""
	b, err := json.Marshal(rec)
	if err != nil || string(b) == of.recorded {
		return
	}
	if fs.noSpillRecords.Load() {
		return
	}
	if err := unix.Fsetxattr(int(of.spill.Fd()), spillRecordXattr, b, 0); err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			fs.noSpillRecords.Store(true)
			fs.log.Warn("the cache directory keeps no extended attributes: files being written when blobfs is killed with its keeper will go to lost+found instead of being uploaded",
				"dir", fs.spillDir, "err", err)
		} else {
			fs.log.Warn("spill file: cannot record what it holds", "spill", of.spillPath, "err", err)
		}
		return
	}
	of.recorded = string(b)
}

// recordLoading gives a spill file about to receive a copy of blob a
// record that says it holds nothing unsaved: a process killed during the
// download leaves a file with the store's bytes (and holes), which
// recovery must remove, not keep in lost+found as data it could not
// upload. The record of the change that needed the copy (recordLocked)
// replaces it before that change is applied.
func (fs *FS) recordLoading(f *os.File, blob string) {
	if fs.noSpillRecords.Load() {
		return // said once, by recordLocked
	}
	b, err := json.Marshal(spillRecord{Store: fs.opts.StoreID, Blob: blob})
	if err != nil {
		return
	}
	if err := unix.Fsetxattr(int(f.Fd()), spillRecordXattr, b, 0); err != nil {
		fs.log.Debug("spill file: cannot record that it is being loaded", "spill", f.Name(), "err", err)
	}
}

// readSpillRecord reads a spill file's record; ok is false when it has
// none, or the empty one of a pooled file (clearSpillRecord), which
// rec.Pooled then names.
func readSpillRecord(f *os.File) (rec spillRecord, ok bool) {
	buf := make([]byte, 4096)
	n, err := unix.Fgetxattr(int(f.Fd()), spillRecordXattr, buf)
	if err != nil || json.Unmarshal(buf[:n], &rec) != nil {
		return spillRecord{}, false
	}
	if rec.Pooled != "" {
		return spillRecord{Pooled: rec.Pooled}, false
	}
	return rec, true
}

// clearSpillRecord replaces a spill file's record with one that names no
// blob and holds nothing unsaved: the file goes back to the pool, emptied,
// and holds nothing of anyone's. Orphan recovery removes such a file, even
// one a dead process left before emptying it, and a process adopting the
// mount takes nothing from it.
//
// Why not remove the attribute: a record is longer than the room for
// attributes inside an ext4 inode, so it lives in a block of its own, and
// removing it frees that block. That took 70-180 µs on this project's
// machines (ext4 mounted with discard), the costliest step of a small
// file's life here, against 4-8 µs to overwrite the block in place. So the
// empty record is padded to the length of the one it replaces (a shorter
// value that fits in the inode would move there and free the block all
// the same), and it names the spill file: ext4 shares identical attribute
// blocks between inodes, and a block that became identical to another
// would be freed in favour of it.
func clearSpillRecord(f *os.File) {
	fd := int(f.Fd())
	n, err := unix.Fgetxattr(fd, spillRecordXattr, nil)
	if err != nil {
		return // none (ENODATA), or no attributes here at all
	}
	b, _ := json.Marshal(spillRecord{Blob: "", Pooled: filepath.Base(f.Name())})
	if len(b) < n {
		b = append(b, bytes.Repeat([]byte{' '}, n-len(b))...) // JSON allows trailing space
	}
	if unix.Fsetxattr(fd, spillRecordXattr, b, 0) != nil {
		unix.Fremovexattr(fd, spillRecordXattr)
	}
}

// lostFoundPath names a new file in CacheDir/lost+found for data of
// blobName that could not be uploaded.
// A file whose name is no longer known (its directory was removed while
// it was open) is kept as "<time>-unnamed", not "<time>-.".
func (fs *FS) lostFoundPath(blobName string) string {
	dir := filepath.Join(fs.opts.CacheDir, "lost+found")
	os.MkdirAll(dir, 0o700)
	base := filepath.Base(blobName)
	if blobName == "" || base == "." || base == "/" {
		base = "unnamed"
	}
	return filepath.Join(dir, fmt.Sprintf("%d-%s", time.Now().UnixNano(), base))
}

// lockSpillDir takes this filesystem's flock on the spill directory, held
// until Close (or the process's death). It returns true when the lock is
// exclusive: no other filesystem uses the directory, and this one may
// recover the orphans (then shareSpillDir makes it shared). Otherwise it
// holds a shared lock, or waits for one in the background while another
// filesystem recovers, so that no later one takes this one's spill files
// for orphans.
func (fs *FS) lockSpillDir() (exclusive bool) {
	d, err := os.Open(fs.spillDir)
	if err != nil {
		fs.log.Warn("cannot lock the spill directory; spill files of earlier sessions are not recovered", "dir", fs.spillDir, "err", err)
		return false
	}
	fs.spillLock = d
	fd := int(d.Fd())
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
		return true
	}
	fs.log.Warn("the cache directory is in use by another mount; spill files of earlier sessions are left to it", "dir", fs.opts.CacheDir)
	if unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) != nil {
		// The other one is recovering (exclusive): it shares once done.
		// Control holds a reference, so a Close meanwhile does not
		// free the descriptor under the blocked call.
		if rc, err := d.SyscallConn(); err == nil {
			go rc.Control(func(fd uintptr) { unix.Flock(int(fd), unix.LOCK_SH) })
		}
	}
	return false
}

// shareSpillDir turns the exclusive lock into a shared one. On Linux a
// flock's conversion happens under one spinlock, so no other filesystem
// can take the exclusive lock in between.
func (fs *FS) shareSpillDir() {
	if err := unix.Flock(int(fs.spillLock.Fd()), unix.LOCK_SH); err != nil {
		fs.log.Warn("cannot share the spill directory's lock", "dir", fs.spillDir, "err", err)
	}
}

// recoverOrphans finds the spill files that no live file refers to: those
// a dead process left (see the top of this file). Live ones are those of
// the files restored from the state region. It lists them at once, before
// the filesystem makes spill files of its own, and uploads them in the
// background: a store that cannot be reached now (the node's network not up
// yet after a reboot) is tried again until it can be, or until Close; the
// files stay in place meanwhile.
func (fs *FS) recoverOrphans(ctx context.Context) {
	if fs.opts.ReadOnly {
		// Nothing can be uploaded: leave them to a read-write mount.
		if left, _ := filepath.Glob(filepath.Join(fs.spillDir, spillPrefix+"*")); len(left) > 0 {
			fs.log.Warn("spill files of an earlier session are left for the next read-write mount", "dir", fs.spillDir, "files", len(left))
		}
		close(fs.orphansDone)
		return
	}
	if !fs.lockSpillDir() {
		close(fs.orphansDone)
		return
	}
	live := map[string]bool{}
	fs.mu.Lock()
	for _, n := range fs.nodes.byID {
		if of := n.file; of != nil && of.spillPath != "" {
			live[of.spillPath] = true
		}
	}
	fs.mu.Unlock()
	entries, err := os.ReadDir(fs.spillDir)
	if err != nil {
		fs.log.Warn("cannot list the spill directory; spill files of earlier sessions are not recovered", "dir", fs.spillDir, "err", err)
	}
	var orphans []string
	for _, e := range entries {
		path := filepath.Join(fs.spillDir, e.Name())
		if e.Type().IsRegular() && strings.HasPrefix(e.Name(), spillPrefix) && !live[path] {
			orphans = append(orphans, path)
		}
	}
	found := len(orphans)
	renames := fs.renameRecords()
	fs.bg.Add(1)
	go func() {
		defer fs.bg.Done()
		defer close(fs.orphansDone)
		defer fs.shareSpillDir()
		delay := time.Second
		var count [orphanOutcomes]int
		defer func() {
			if found == 0 {
				return
			}
			// One line that sums up the repair's data, whatever each
			// file's own line said.
			fs.log.Info("files left open by a lost session: recovery ended",
				"dir", fs.spillDir, "uploaded", count[orphanUploaded], "kept_in_lost_found", count[orphanKept],
				"nothing_to_save", count[orphanNothingToSave], "left_in_place", count[orphanLeftInPlace]+len(orphans))
		}()
		for {
			var again []string
			for _, path := range orphans {
				outcome, err := fs.recoverOrphan(ctx, path)
				if err != nil {
					again = append(again, path)
					continue
				}
				count[outcome]++
			}
			// After the orphans: a file written while renamed goes up
			// under the name its record gives, before the rename that
			// moved it is finished (or found changed, and left).
			var renamesAgain []string
			for _, path := range renames {
				if err := fs.finishRename(ctx, path); err != nil {
					renamesAgain = append(renamesAgain, path)
				}
			}
			orphans, renames = again, renamesAgain
			if len(orphans)+len(renames) == 0 || ctx.Err() != nil {
				return
			}
			fs.log.Warn("the store cannot be reached; files left open or renamed by a lost session wait in the cache directory",
				"files", len(orphans), "renames", len(renames), "dir", fs.spillDir, "retry_in", delay)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Minute)
		}
	}()
}

// orphanOutcome is what became of one orphan spill file.
type orphanOutcome int

const (
	orphanUploaded      orphanOutcome = iota // its data is in the store
	orphanKept                               // moved to lost+found
	orphanNothingToSave                      // no unsaved data: removed
	orphanLeftInPlace                        // could not be read or moved
	orphanOutcomes
)

// recoverOrphan uploads one orphan spill file when the blob is as the dead
// session left it, and otherwise moves it to lost+found. It returns an
// error, and leaves the file in place, when the store could not be reached
// (or the filesystem is closing): the upload is to be tried again.
func (fs *FS) recoverOrphan(ctx context.Context, path string) (orphanOutcome, error) {
	f, err := os.Open(path)
	if err != nil {
		fs.log.Warn("orphan spill file: cannot open it; left in place", "spill", path, "err", err)
		return orphanLeftInPlace, nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		fs.log.Warn("orphan spill file: cannot stat it; left in place", "spill", path, "err", err)
		return orphanLeftInPlace, nil
	}
	rec, ok := readSpillRecord(f)
	switch {
	case !ok && (st.Size() == 0 || rec.Pooled != ""):
		// Made and never written (a record is set before the first
		// WRITE into a spill file is answered), or on its way back to
		// the pool: its removal was journaled and its record cleared,
		// its data committed or given up, before it was emptied.
		os.Remove(path)
		return orphanNothingToSave, nil
	case !ok:
		return fs.keepOrphan(path, "", st.Size(), errors.New("it has no record of the blob it belongs to")), nil
	case rec.Store != fs.opts.StoreID:
		return fs.keepOrphan(path, rec.Blob, st.Size(), fmt.Errorf("it was written for another store (%s), not this one (%s)", rec.Store, fs.opts.StoreID)), nil
	case !rec.Dirty:
		// The store has its content (or the file was deleted).
		os.Remove(path)
		fs.log.Debug("orphan spill file held no unsaved data; removed", "spill", path, "blob", rec.Blob)
		return orphanNothingToSave, nil
	}
	retry := func(err error) bool { return ctx.Err() != nil || blobstore.Retryable(err) }
	opts := blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: rec.IfMatch, IfNoneMatch: rec.IfNoneMatch}}
	if rec.IfMatch != "" {
		// The blob as it was: keep its metadata (POSIX attributes), as
		// the session's own commit would have.
		a, err := fs.store.Stat(ctx, rec.Blob)
		if err != nil && retry(err) {
			return orphanLeftInPlace, err
		}
		if err == nil && a.ETag == rec.IfMatch {
			opts.Metadata = meta.Copy(a.Metadata)
		}
	}
	if opts.Metadata == nil {
		opts.Metadata = map[string]string{}
	}
	// The content is new: its times are now's, unless the session set
	// the modification time after its last change (in its record).
	meta.Delete(opts.Metadata, blobstore.MetaCtime)
	meta.Delete(opts.Metadata, blobstore.MetaMtime)
	meta.Delete(opts.Metadata, blobstore.MetaRcloneMtime)
	for k, v := range rec.Attrs {
		meta.Set(opts.Metadata, k, v) // the attributes the session gave the file
	}
	delete(opts.Metadata, blobstore.MetaCommit)
	up := func() (blobstore.Attrs, error) {
		return blobstore.Upload(ctx, fs.store, rec.Blob, f, st.Size(), blobstore.UploadOptions{
			BlockSize:   fs.opts.UploadBlockSize,
			Concurrency: fs.opts.UploadConcurrency,
			PutOptions:  opts,
			Buffers:     fs.up.Buffers,
		})
	}
	_, err = up()
	if err != nil && !retry(err) && rec.Nonce != "" {
		// The dead process's own commit may have landed, its answer
		// lost: the condition then fails on our own data.
		a, serr := fs.store.Stat(ctx, rec.Blob)
		if serr != nil && retry(serr) {
			return orphanLeftInPlace, serr
		}
		if serr == nil {
			if v, ok := meta.Value(a.Metadata, blobstore.MetaCommit); ok && v == rec.Nonce {
				opts.Conditions = blobstore.Conditions{IfMatch: a.ETag}
				_, err = up()
			}
		}
	}
	if err != nil && retry(err) {
		return orphanLeftInPlace, err
	}
	if err != nil {
		return fs.keepOrphan(path, rec.Blob, st.Size(), err), nil
	}
	os.Remove(path)
	fs.log.Info("uploaded a file left open by a lost session", "path", rec.Blob, "bytes", st.Size())
	return orphanUploaded, nil
}

// keepOrphan moves an orphan spill file to lost+found and says why.
func (fs *FS) keepOrphan(path, blob string, size int64, why error) orphanOutcome {
	name := blob
	if name == "" {
		name = filepath.Base(path)
	}
	dst := fs.lostFoundPath(name)
	if err := os.Rename(path, dst); err != nil {
		fs.log.Error("orphan spill file: cannot move it to lost+found; left in place", "spill", path, "path", blob, "err", err)
		return orphanLeftInPlace
	}
	fs.log.Warn("a file left open by a lost session could not be uploaded; its data is kept in lost+found",
		"path", blob, "kept", dst, "bytes", size, "reason", why)
	return orphanKept
}
