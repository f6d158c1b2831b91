package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Locking: the attributes live in node.attrs, guarded by FS.mu.

// newAttrs are the attributes of a node made now by the caller (uid, gid)
// with the mode the request asked for (the kernel has applied the
// process's umask already). In a directory with the set-group-ID bit the
// group is the directory's, and a new directory inherits the bit, as on
// Linux file systems.
func (fs *FS) newAttrsLocked(parent *node, uid, gid, mode uint32, kind meta.Kind, now time.Time) meta.Posix {
	if fs.opts.NoAttrWrites {
		return meta.Posix{} // the mount's defaults
	}
	p := meta.Posix{Perm: mode & 0o7777, HasPerm: true, UID: uid, GID: gid, HasUID: true, HasGID: true, Atime: now, Ctime: now}
	if kind == meta.KindSymlink {
		p.Perm = 0o777
	}
	if pa := fs.attrOf(parent); pa.perm&syscall.S_ISGID != 0 {
		p.GID = pa.gid
		if kind == meta.KindDir {
			p.Perm |= syscall.S_ISGID
		}
	}
	if kind == meta.KindSpecial {
		p.Special = mode & syscall.S_IFMT
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
	case meta.KindDir:
		s.perm = 0o777 &^ fs.opts.Umask
		if fs.opts.DirMode != 0 {
			s.perm = fs.opts.DirMode
		}
	case meta.KindSymlink:
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
	if p.HasPerm && !fs.opts.ForcePerm && n.kind != meta.KindSymlink {
		s.perm = p.Perm
	}
	if !fs.opts.ForceOwner {
		if p.HasUID {
			s.uid = p.UID
		}
		if p.HasGID {
			s.gid = p.GID
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
	meta.WritePosix(md, n.kind, n.attrs)
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
	if errors.Is(err, blobstore.ErrNotFound) && kind == meta.KindDir {
		a, err = fs.makeMarker(ctx, n, path, mtime)
	}
	if err != nil {
		return err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.applyEntryLocked(n, meta.EntryOf(a))
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
	md := meta.Copy(a.Metadata)
	fs.fillAttrMeta(n, md, a.ModTime, mtime)
	after, err := fs.store.SetMetadata(ctx, path, md, blobstore.Conditions{IfMatch: a.ETag})
	if errors.Is(err, blobstore.ErrPreconditionFailed) {
		// The store may have made this very change and its answer been
		// lost: the retry then fails on the ETag the change gave. The
		// blob holding exactly this metadata over the same content is
		// that (or another client making the same change, which comes to
		// the same).
		if now, serr := fs.store.Stat(ctx, path); serr == nil && meta.Same(now.Metadata, md) &&
			now.Size == a.Size && bytes.Equal(now.ContentMD5, a.ContentMD5) {
			fs.log.Debug("a retried attribute change found it made already (the first answer was lost)", "path", path)
			return a.ETag, now, nil
		}
	}
	return a.ETag, after, err
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
		meta.Set(md, blobstore.MetaMtime, strconv.FormatInt(mtime.UnixNano(), 10))
	default:
		if _, ok := meta.Mtime(md); !ok && !stored.IsZero() {
			meta.Set(md, blobstore.MetaMtime, strconv.FormatInt(stored.UnixNano(), 10))
		}
	}
}

// makeMarker gives a directory that exists only as a prefix a marker blob
// carrying its attributes. Another client may make one meanwhile: then its
// metadata is updated instead.
func (fs *FS) makeMarker(ctx context.Context, n *node, path string, mtime *time.Time) (blobstore.Attrs, error) {
	md := meta.Copy(folderMeta)
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
func (fs *FS) newMeta(base map[string]string, kind meta.Kind, p meta.Posix) map[string]string {
	md := meta.Copy(base)
	if !fs.opts.NoAttrWrites {
		meta.WritePosix(md, kind, p)
	}
	return md
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
	at := n.attrs.Atime
	if at.IsZero() || !at.After(n.mtime) || now.Sub(at) > 24*time.Hour {
		n.attrs.Atime = now
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
	kill := p.Perm & syscall.S_ISUID
	if p.Perm&(syscall.S_ISGID|0o010) == syscall.S_ISGID|0o010 {
		kill |= syscall.S_ISGID
	}
	if kill == 0 {
		return false
	}
	p.Perm &^= kill
	p.Ctime = time.Now()
	return true
}
