package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// POSIX attributes: a file's, symlink's or special file's mode, owner,
// group, access and change times and device number live in its blob's
// metadata (blobstore.MetaMode, MetaUID, ...); a directory's on its marker
// blob (hdi_isfolder), which is created when a directory without one is
// given an attribute. They ride on requests blobfs makes anyway: the Put or
// CommitBlockList that writes a file, the Put of a marker, symlink or
// special file, and listings, which return metadata; only chmod, chown and
// utimensat on a file that is not being written cost a request of their
// own (Set Blob Metadata).
//
// A blob without the keys shows the mount's defaults (Options.UID, GID,
// Umask), so containers written by other tools (blobfuse2's layout) keep
// working. Options.ForceOwner and ForcePerm make the defaults win over
// what is stored, for a mount that wants one owner for everything. The
// root directory is the container and has no blob: it shows the defaults,
// with Options.RootMode as its mode when set, and a chmod or chown of it
// lasts for the mount's life only.
//
// Times:
//   - mtime: blobfs_mtime when set explicitly (utimensat), else rclone's
//     "mtime", else the blob's Last-Modified.
//   - ctime: blobfs_ctime when an attribute changed after the content, else
//     the content's time. A commit drops the key: Last-Modified is then
//     the change time.
//   - atime: blobfs_atime when set explicitly, else mtime. Reads update
//     it in memory only, with relatime's rule (when it is older than mtime
//     or a day old); writing it back would cost a request per file read.
//   - A directory's mtime and ctime follow the entries made, removed and
//     renamed in it through this mount, in memory (storing them would cost
//     a request per create); utimensat on a directory stores them.
//
// Locking: the attributes live in node.attrs, guarded by FS.mu.

// posixAttrs are the attributes a blob's metadata may carry. A zero field
// that has no "has" flag is unset: the node shows the mount's default.
type posixAttrs struct {
	perm    uint32 // permission bits, 07777
	hasPerm bool
	// special is the file type of a FIFO, socket or device node
	// (S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK); 0 for anything else.
	special        uint32
	uid, gid       uint32
	hasUID, hasGID bool
	atime, ctime   time.Time // zero: unset
	rdev           uint32
}

// blobMeta is what blobfs reads from a blob's metadata, found in one pass
// over its keys: a listing reads it for every entry (a map lookup per key
// that a blob lacks, each falling back to a case-insensitive scan, made
// reading four keys cost 600 ns an entry; one pass costs a fraction).
// Azure treats keys case-insensitively: listings return them as stored,
// headers canonicalised ("Hdi_isfolder").
type blobMeta struct {
	isFolder, isSymlink bool
	mtime               time.Time // blobfs_mtime, else rclone's mtime; zero if neither
	posix               posixAttrs
}

func readMeta(md map[string]string) blobMeta {
	var m blobMeta
	var rclone string
	for k, v := range md {
		switch lowerASCII(k) {
		case blobstore.MetaIsFolder:
			m.isFolder = strings.EqualFold(v, "true")
		case blobstore.MetaIsSymlink:
			m.isSymlink = strings.EqualFold(v, "true")
		case blobstore.MetaMtime:
			m.mtime = unixNanos(v)
		case blobstore.MetaRcloneMtime:
			rclone = v
		case blobstore.MetaMode:
			if mode, err := strconv.ParseUint(v, 8, 32); err == nil {
				m.posix.perm, m.posix.hasPerm = uint32(mode)&0o7777, true
				switch t := uint32(mode) & syscall.S_IFMT; t {
				case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
					m.posix.special = t
				}
			}
		case blobstore.MetaUID:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.posix.uid, m.posix.hasUID = uint32(n), true
			}
		case blobstore.MetaGID:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.posix.gid, m.posix.hasGID = uint32(n), true
			}
		case blobstore.MetaAtime:
			m.posix.atime = unixNanos(v)
		case blobstore.MetaCtime:
			m.posix.ctime = unixNanos(v)
		case blobstore.MetaRdev:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.posix.rdev = uint32(n)
			}
		}
	}
	if m.mtime.IsZero() && rclone != "" {
		if t, err := time.Parse(time.RFC3339Nano, rclone); err == nil {
			m.mtime = t
		}
	}
	return m
}

// lowerASCII lower-cases s, without allocating when it is lower case
// already (keys as blobfs writes them).
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// unixNanos reads a time in Unix nanoseconds; zero when it does not parse.
func unixNanos(v string) time.Time {
	if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// parsePOSIX reads the attributes of a blob's metadata. Values that do not
// parse are ignored (the default shows), never an error: a listing must not
// fail because another tool wrote a key oddly.
func parsePOSIX(md map[string]string) posixAttrs { return readMeta(md).posix }

// metaMtime is the modification time the metadata sets, if any: blobfs's
// own key, else rclone's.
func metaMtime(md map[string]string) (time.Time, bool) {
	t := readMeta(md).mtime
	return t, !t.IsZero()
}

// setMetaKey sets key in md, replacing a key that differs only in case
// (Azure treats keys case-insensitively and reports them canonicalised).
func setMetaKey(md map[string]string, key, value string) {
	deleteMetaKey(md, key)
	md[key] = value
}

func deleteMetaKey(md map[string]string, key string) {
	for k := range md {
		if strings.EqualFold(k, key) {
			delete(md, k)
		}
	}
}

// writePOSIX puts p's set attributes into md. kind's type bits are part of
// the mode, so that a blob says what it is even to a reader that knows
// only the mode.
func writePOSIX(md map[string]string, kind nodeKind, p posixAttrs) {
	if p.hasPerm {
		setMetaKey(md, blobstore.MetaMode, strconv.FormatUint(uint64(kindType(kind, p.special)|p.perm), 8))
	}
	if p.hasUID {
		setMetaKey(md, blobstore.MetaUID, strconv.FormatUint(uint64(p.uid), 10))
	}
	if p.hasGID {
		setMetaKey(md, blobstore.MetaGID, strconv.FormatUint(uint64(p.gid), 10))
	}
	if !p.atime.IsZero() {
		setMetaKey(md, blobstore.MetaAtime, strconv.FormatInt(p.atime.UnixNano(), 10))
	}
	if !p.ctime.IsZero() {
		setMetaKey(md, blobstore.MetaCtime, strconv.FormatInt(p.ctime.UnixNano(), 10))
	}
	if p.special == syscall.S_IFCHR || p.special == syscall.S_IFBLK {
		setMetaKey(md, blobstore.MetaRdev, strconv.FormatUint(uint64(p.rdev), 10))
	}
}

// kindType is the S_IFMT bits of a node.
func kindType(kind nodeKind, special uint32) uint32 {
	switch kind {
	case kindDir:
		return syscall.S_IFDIR
	case kindSymlink:
		return syscall.S_IFLNK
	case kindSpecial:
		return special
	}
	return syscall.S_IFREG
}

// newAttrs are the attributes of a node made now by the caller (uid, gid)
// with the mode the request asked for (the kernel has applied the
// process's umask already). In a directory with the set-group-ID bit the
// group is the directory's, and a new directory inherits the bit, as on
// Linux file systems.
func (fs *FS) newAttrsLocked(parent *node, uid, gid, mode uint32, kind nodeKind, now time.Time) posixAttrs {
	if fs.opts.NoAttrWrites {
		return posixAttrs{} // the mount's defaults
	}
	p := posixAttrs{perm: mode & 0o7777, hasPerm: true, uid: uid, gid: gid, hasUID: true, hasGID: true, atime: now, ctime: now}
	if kind == kindSymlink {
		p.perm = 0o777
	}
	if pa := fs.attrOf(parent); pa.perm&syscall.S_ISGID != 0 {
		p.gid = pa.gid
		if kind == kindDir {
			p.perm |= syscall.S_ISGID
		}
	}
	if kind == kindSpecial {
		p.special = mode & syscall.S_IFMT
	}
	return p
}

// shownAttrs is what a node shows: its stored attributes where it has
// them, the mount's defaults elsewhere (and wherever the mount forces
// them). The caller holds FS.mu.
type shownAttrs struct {
	perm, uid, gid uint32
}

func (fs *FS) attrOf(n *node) shownAttrs {
	s := shownAttrs{uid: fs.opts.UID, gid: fs.opts.GID}
	switch n.kind {
	case kindDir:
		s.perm = 0o777 &^ fs.opts.Umask
		if fs.opts.DirMode != 0 {
			s.perm = fs.opts.DirMode
		}
	case kindSymlink:
		s.perm = 0o777
	default:
		s.perm = 0o666 &^ fs.opts.Umask
		if fs.opts.FileMode != 0 {
			s.perm = fs.opts.FileMode
		}
	}
	if n.id == fuse.FUSE_ROOT_ID && fs.opts.RootMode != 0 {
		s.perm = fs.opts.RootMode
	}
	p := n.attrs
	if p.hasPerm && !fs.opts.ForcePerm && n.kind != kindSymlink {
		s.perm = p.perm
	}
	if !fs.opts.ForceOwner {
		if p.hasUID {
			s.uid = p.uid
		}
		if p.hasGID {
			s.gid = p.gid
		}
	}
	return s
}

// attrsMetaLocked writes into md the keys that store n's attributes as
// they are now, for a request that replaces a blob's metadata. The caller
// holds FS.mu.
func (fs *FS) attrsMetaLocked(n *node, md map[string]string) {
	if fs.opts.NoAttrWrites {
		return
	}
	writePOSIX(md, n.kind, n.attrs)
}

// storeAttrs writes n's attributes (and mtime, when setMtime) to the store
// at path: into the pending commit of a file being written, else with Set
// Blob Metadata conditional on the ETag it reads. A directory without a
// marker blob gets one. The modification time is pinned in the metadata
// when it is not set: Set Blob Metadata moves Last-Modified, which must
// not move a file's mtime.
func (fs *FS) storeAttrs(ctx context.Context, n *node, path string, mtime *time.Time) error {
	fs.mu.Lock()
	of, kind := n.file, n.kind
	if of != nil {
		of.refs++
	}
	fs.mu.Unlock()
	if of != nil {
		defer fs.releaseFile(of)
		if handled, err := of.setAttrs(ctx, path, mtime); handled || err != nil {
			return err
		}
	}
	if path == "" {
		// The root (no blob: kept in memory for the mount's life), or
		// an unlinked file (nothing to store).
		return nil
	}
	a, err := fs.setAttrsInStore(ctx, n, path, "", mtime)
	if errors.Is(err, blobstore.ErrNotFound) && kind == kindDir {
		a, err = fs.makeMarker(ctx, n, path, mtime)
	}
	if err != nil {
		return err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.applyEntryLocked(n, entryFromAttrs(a))
	return nil
}

// setAttrsInStore replaces the metadata of the blob at path with its
// current metadata plus n's attributes, conditional on ifMatch if given
// (else on the ETag it reads).
func (fs *FS) setAttrsInStore(ctx context.Context, n *node, path, ifMatch string, mtime *time.Time) (blobstore.Attrs, error) {
	_, a, err := fs.setAttrsInStoreFrom(ctx, n, path, ifMatch, mtime)
	return a, err
}

// setAttrsInStoreFrom is setAttrsInStore that also returns the ETag the
// blob had just before this change: the change is conditional on it, so
// the blob went from that ETag to the returned one by this change alone.
func (fs *FS) setAttrsInStoreFrom(ctx context.Context, n *node, path, ifMatch string, mtime *time.Time) (before string, _ blobstore.Attrs, _ error) {
	a, err := fs.store.Stat(ctx, path)
	if err != nil {
		return "", blobstore.Attrs{}, err
	}
	if ifMatch != "" && a.ETag != ifMatch {
		return "", blobstore.Attrs{}, fmt.Errorf("set attributes of %q: %w", path, blobstore.ErrPreconditionFailed)
	}
	md := copyMeta(a.Metadata)
	fs.fillAttrMeta(n, md, a.ModTime, mtime)
	after, err := fs.store.SetMetadata(ctx, path, md, blobstore.Conditions{IfMatch: a.ETag})
	if errors.Is(err, blobstore.ErrPreconditionFailed) {
		// The store may have made this very change and its answer been
		// lost: the retry then fails on the ETag the change gave. The
		// blob holding exactly this metadata over the same content is
		// that (or another client making the same change, which comes to
		// the same).
		if now, serr := fs.store.Stat(ctx, path); serr == nil && sameMeta(now.Metadata, md) &&
			now.Size == a.Size && bytes.Equal(now.ContentMD5, a.ContentMD5) {
			fs.log.Debug("a retried attribute change found it made already (the first answer was lost)", "path", path)
			return a.ETag, now, nil
		}
	}
	return a.ETag, after, err
}

// sameMeta tells whether two sets of blob metadata are the same, names
// compared without case as Azure does.
func sameMeta(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := metaValue(b, k); !ok || w != v {
			return false
		}
	}
	return true
}

// fillAttrMeta writes n's attributes into md, and the modification time:
// the one given, else the one md already pins, else stored's (the blob's
// Last-Modified before this change).
func (fs *FS) fillAttrMeta(n *node, md map[string]string, stored time.Time, mtime *time.Time) {
	fs.mu.Lock()
	fs.attrsMetaLocked(n, md)
	fs.mu.Unlock()
	switch {
	case mtime != nil:
		setMetaKey(md, blobstore.MetaMtime, strconv.FormatInt(mtime.UnixNano(), 10))
	default:
		if _, ok := metaMtime(md); !ok && !stored.IsZero() {
			setMetaKey(md, blobstore.MetaMtime, strconv.FormatInt(stored.UnixNano(), 10))
		}
	}
}

// makeMarker gives a directory that exists only as a prefix a marker blob
// carrying its attributes. Another client may make one meanwhile: then its
// metadata is updated instead.
func (fs *FS) makeMarker(ctx context.Context, n *node, path string, mtime *time.Time) (blobstore.Attrs, error) {
	md := copyMeta(folderMeta)
	fs.fillAttrMeta(n, md, time.Time{}, mtime)
	a, err := fs.store.Put(ctx, path, nil, blobstore.PutOptions{Metadata: md, Conditions: blobstore.Conditions{IfNoneMatch: true}})
	if errors.Is(err, blobstore.ErrAlreadyExists) {
		return fs.setAttrsInStore(ctx, n, path, "", mtime)
	}
	if a.Metadata == nil {
		a.Metadata = md
	}
	return a, err
}

// newMeta is the metadata of a blob made for a new node: the layout's keys
// (base, may be nil) plus the node's attributes.
func (fs *FS) newMeta(base map[string]string, kind nodeKind, p posixAttrs) map[string]string {
	md := copyMeta(base)
	if !fs.opts.NoAttrWrites {
		writePOSIX(md, kind, p)
	}
	return md
}

// madeEntry is the entry of a blob this mount just wrote with metadata md
// (a store's answer to a Put need not repeat the metadata).
func madeEntry(a blobstore.Attrs, md map[string]string) dirEntry {
	if a.Metadata == nil {
		a.Metadata = md
	}
	return entryFromAttrs(a)
}

// touchDirLocked records that an entry of dir was made, removed or renamed
// now: its mtime and ctime move (attrs.go). The caller holds FS.mu.
func touchDirLocked(dir *node, now time.Time) {
	if dir != nil && now.After(dir.touched) {
		dir.touched = now
	}
}

// relatimeLocked updates n's access time for a read, with relatime's rule:
// when it is not after the modification time, or is a day old. In memory
// only (attrs.go); a later attribute change stores it. The caller holds
// FS.mu.
func relatimeLocked(n *node, now time.Time) {
	at := n.attrs.atime
	if at.IsZero() || !at.After(n.mtime) || now.Sub(at) > 24*time.Hour {
		n.attrs.atime = now
	}
}

// killPrivLocked clears the set-user-ID bit, and the set-group-ID bit of a
// group-executable file, after a write by a process without CAP_FSETID, as
// Linux file systems do. The kernel asks for it with a SETATTR on writes
// through its page cache, and with FUSE_WRITE_KILL_SUIDGID on direct-I/O
// writes, which write-only handles use (writeOnlyFlags). The change goes
// up with the write's commit. It reports whether a bit was cleared. The
// caller holds FS.mu.
func killPrivLocked(n *node) bool {
	p := &n.attrs
	kill := p.perm & syscall.S_ISUID
	if p.perm&(syscall.S_ISGID|0o010) == syscall.S_ISGID|0o010 {
		kill |= syscall.S_ISGID
	}
	if kill == 0 {
		return false
	}
	p.perm &^= kill
	p.ctime = time.Now()
	return true
}
