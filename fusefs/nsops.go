package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
)

var folderMeta = map[string]string{blobstore.MetaIsFolder: "true"}

// renameConcurrency bounds the copies in flight while renaming a directory.
const renameConcurrency = 16

// newChild binds a freshly made name and hands it to the kernel,
// completing the request's intent in the same journal write.
func (fs *FS) newChild(dir *node, dirPath, name string, e meta.Entry, out *fuse.EntryOut, intent uint64) {
	fs.lists.Set(dirPath, name, e)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	touchDirLocked(dir, time.Now())
	fs.batchLocked(func() {
		n := fs.nodes.bind(dir.id, name, e.Kind)
		fs.applyEntryLocked(n, e)
		fs.nodes.ref(n)
		fs.completeIntentLocked(intent, n.id, 0)
		fs.fillEntry(n, out)
	})
}

// resentMade answers a resent mkdir, mknod or symlink whose name exists:
// if it exists as the kind the request makes, the first run made it, and
// the answer is the entry the first reply carried. ok is false when the
// request must fail with EEXIST after all.
func (fs *FS) resentMade(ctx context.Context, it journal.Intent, dir *node, dirPath, name string, kind meta.Kind, out *fuse.EntryOut) (ok bool) {
	n, err := fs.resolve(ctx, dir, dirPath, name)
	if err != nil || n.kind != kind {
		return false
	}
	fs.answerResent(it, n, out)
	return true
}

// forgetName drops the binding of a name that is gone from the store and
// completes the request's intent.
func (fs *FS) forgetName(dir *node, dirPath, name string, intent uint64) {
	fs.lists.Remove(dirPath, name)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	touchDirLocked(dir, time.Now())
	fs.batchLocked(func() {
		if n := fs.nodes.child(dir.id, name); n != nil {
			fs.nodes.detach(n)
		}
		fs.completeIntentLocked(intent, 0, 0)
	})
}

func (fs *FS) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	c, st := fs.newName(&in.InHeader, "mkdir", name, nil)
	if !st.Ok() {
		return st
	}
	ctx, cf := fs.reqContext()
	defer cf()
	c.begin()
	if _, err := fs.resolve(ctx, c.dir, c.dirPath, name); err == nil {
		if c.isResent && fs.resentMade(ctx, c.resent, c.dir, c.dirPath, name, meta.KindDir, out) {
			return fuse.OK
		}
		return fuse.Status(syscall.EEXIST)
	} else if !errors.Is(err, blobstore.ErrNotFound) {
		return toStatus(err)
	}
	st, made := fs.makeName(ctx, c, meta.KindDir, in.Mode, 0, folderMeta, nil, out, func(a blobstore.Attrs, md map[string]string, attrs meta.Posix) meta.Entry {
		return meta.Entry{Kind: meta.KindDir, Mtime: a.ModTime, Attrs: attrs}
	})
	if made {
		// The new directory is known to be empty: lookups in it need
		// no request.
		fs.lists.Put(meta.JoinPath(c.dirPath, name), map[string]*meta.Entry{})
		fs.crashPoint("mkdir", "reply", name)
	}
	return st
}

// A naming is a request that makes a new name (Mkdir, Mknod, Symlink),
// checked: the directory, the name, and what a resent request's first run
// journaled.
type naming struct {
	fs       *FS
	op       string // "mkdir", "mknod", "symlink": the crash points' names
	h        *fuse.InHeader
	dir      *node
	dirPath  string
	name     string
	resent   journal.Intent
	isResent bool
}

// newName checks a request that makes name in the directory it names: the
// directory exists, the mount is writable, what the operation checks of
// its own (check, if not nil), and name may be made there (checkNew), in
// that order.
func (fs *FS) newName(h *fuse.InHeader, op, name string, check func() fuse.Status) (*naming, fuse.Status) {
	dir, dirPath, st := fs.node(h.NodeId)
	if !st.Ok() {
		return nil, st
	}
	if fs.opts.ReadOnly {
		return nil, fuse.EROFS
	}
	if check != nil {
		if st := check(); !st.Ok() {
			return nil, st
		}
	}
	if st := fs.checkNew(dir, dirPath, name); !st.Ok() {
		return nil, st
	}
	return &naming{fs: fs, op: op, h: h, dir: dir, dirPath: dirPath, name: name}, fuse.OK
}

// begin marks the request begun (a crash point) and finds what its first
// run journaled, if it is resent.
func (c *naming) begin() {
	c.fs.crashPoint(c.op, "begin", c.name)
	c.resent, c.isResent = c.fs.resentIntent(c.h, c.dir.id, 0, c.name, "")
}

// makeName writes the blob of a new name of kind (metadata base, content)
// exactly once across a restart, and answers with the new child, whose
// entry entryOf builds from the blob written. The intent is journaled
// before the Put. A Put that finds the name taken is this request's own
// first run when it is resent and that run journaled it (resentMade): its
// Put may reach the store after its process died, while this one looked;
// the answer is then that run's, and made is false (nothing was made
// here). Otherwise it answers the store's error (EEXIST).
func (fs *FS) makeName(ctx context.Context, c *naming, kind meta.Kind, mode, rdev uint32, base map[string]string, content []byte, out *fuse.EntryOut,
	entryOf func(a blobstore.Attrs, md map[string]string, attrs meta.Posix) meta.Entry) (_ fuse.Status, made bool) {
	intent := fs.beginIntent(c.h, c.dir.id, 0, c.name, "")
	fs.mu.Lock()
	attrs := fs.newAttrsLocked(c.dir, c.h.Caller.Uid, c.h.Caller.Gid, mode, kind, time.Now())
	fs.mu.Unlock()
	attrs.Rdev = rdev
	md := fs.newMeta(base, kind, attrs)
	a, err := fs.putNew(ctx, meta.JoinPath(c.dirPath, c.name), content, md)
	if err != nil {
		if errors.Is(err, blobstore.ErrAlreadyExists) {
			fs.foundInStore(c.dirPath, c.name)
			if c.isResent && fs.resentMade(ctx, c.resent, c.dir, c.dirPath, c.name, kind, out) {
				return fuse.OK, false
			}
		}
		fs.dropIntent(intent)
		return toStatus(err), false
	}
	fs.crashPoint(c.op, "store", c.name)
	fs.newChild(c.dir, c.dirPath, c.name, entryOf(a, md, attrs), out, intent)
	return fuse.OK, true
}

// foundInStore is told that name exists in the store after all (a
// conditional Put found it there): a cached listing of dirPath without it
// is out of date, and is dropped so that the next lookup asks the store.
// Kept, it would answer ENOENT for the name that EEXIST was just answered
// for, and a resent request whose first run's Put landed after the listing
// was fetched would resolve the name through it and answer EEXIST for its
// own work (resentMade).
func (fs *FS) foundInStore(dirPath, name string) {
	if _, found, listed := fs.lists.Lookup(dirPath, name); listed && !found {
		fs.lists.Invalidate(dirPath)
	}
}

// Mknod makes empty regular files, FIFOs, sockets and device nodes: each a
// zero-length blob whose mode says what it is (the kernel serves FIFOs and
// sockets itself; device nodes are not opened, the mount is nodev).
func (fs *FS) Mknod(_ <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	kind := meta.KindFile
	c, st := fs.newName(&in.InHeader, "mknod", name, func() fuse.Status {
		switch in.Mode & syscall.S_IFMT {
		case 0, syscall.S_IFREG:
		case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
			if fs.opts.NoAttrWrites {
				return fuse.EPERM // its type could not be stored
			}
			kind = meta.KindSpecial
		default:
			return fuse.EINVAL
		}
		return fuse.OK
	})
	if !st.Ok() {
		return st
	}
	ctx, cf := fs.reqContext()
	defer cf()
	c.begin()
	st, made := fs.makeName(ctx, c, kind, in.Mode, in.Rdev, nil, nil, out, func(a blobstore.Attrs, md map[string]string, _ meta.Posix) meta.Entry {
		return meta.MadeEntry(a, md)
	})
	if made {
		fs.crashPoint("mknod", "reply", name)
	}
	return st
}

func (fs *FS) Symlink(_ <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	c, st := fs.newName(h, "symlink", name, nil)
	if !st.Ok() {
		return st
	}
	ctx, cf := fs.reqContext()
	defer cf()
	c.begin()
	st, made := fs.makeName(ctx, c, meta.KindSymlink, 0o777, 0, map[string]string{blobstore.MetaIsSymlink: "true"}, []byte(target), out,
		func(a blobstore.Attrs, md map[string]string, _ meta.Posix) meta.Entry {
			e := meta.MadeEntry(a, md)
			e.Target = target
			return e
		})
	if made {
		fs.crashPoint("symlink", "reply", name)
	}
	return st
}

func (fs *FS) Readlink(_ <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	n, path, st := fs.node(h.NodeId)
	if !st.Ok() {
		return nil, st
	}
	if n.kind != meta.KindSymlink {
		return nil, fuse.EINVAL
	}
	fs.mu.Lock()
	target := n.target
	fs.mu.Unlock()
	if target != "" {
		return []byte(target), fuse.OK
	}
	ctx, cf := fs.readContext(h.Unique, h.Pid)
	defer cf()
	buf := make([]byte, 4096)
	got, err := fs.store.ReadAt(ctx, path, buf, 0, "")
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, toStatus(err)
	}
	fs.mu.Lock()
	n.target = string(buf[:got])
	fs.mu.Unlock()
	return buf[:got], fuse.OK
}

func (fs *FS) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	dir, dirPath, st := fs.node(h.NodeId)
	if !st.Ok() {
		return st
	}
	if fs.opts.ReadOnly {
		return fuse.EROFS
	}
	ctx, cf := fs.reqContext()
	defer cf()
	fs.crashPoint("unlink", "begin", name)
	resent, isResent := fs.resentIntent(h, dir.id, 0, name, "")
	n, err := fs.resolve(ctx, dir, dirPath, name)
	if err != nil {
		if isResent && errors.Is(err, blobstore.ErrNotFound) {
			// The first run removed it.
			fs.forgetName(dir, dirPath, name, resent.Unique)
			fs.keepDir(ctx, dirPath)
			return fuse.OK
		}
		return toStatus(err)
	}
	if n.kind == meta.KindDir {
		return fuse.Status(syscall.EISDIR)
	}
	fs.mu.Lock()
	inStore := n.inStore
	of := n.file
	fs.mu.Unlock()
	if of != nil {
		// Its writers may still change it: what they change must
		// still be reachable once the blob is gone.
		if err := of.keepContent(ctx); err != nil {
			return toStatus(err)
		}
	}
	intent := fs.beginIntent(h, dir.id, 0, name, "")
	path := meta.JoinPath(dirPath, name)
	if of != nil {
		// Open handles keep reading the local copy; nothing is uploaded.
		of.mu.Lock()
		of.unlinked = true
		of.recordLocked(false) // a lost session must not bring it back
		of.mu.Unlock()
	}
	if inStore || of == nil {
		if err := fs.store.Delete(ctx, path, blobstore.Conditions{}); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
			fs.dropIntent(intent)
			return toStatus(err)
		}
	}
	fs.crashPoint("unlink", "store", name)
	fs.lists.Remove(dirPath, name)
	fs.mu.Lock()
	now := time.Now()
	touchDirLocked(dir, now)
	n.attrs.Ctime = now // an open file's link count changed
	fs.batchLocked(func() {
		fs.nodes.detach(n)
		fs.completeIntentLocked(intent, 0, 0)
	})
	fs.mu.Unlock()
	fs.keepDir(ctx, dirPath)
	fs.crashPoint("unlink", "reply", name)
	return fuse.OK
}

// keepDir makes sure a directory that may have lost its last child still
// exists in the store, by writing its marker blob. Without it, removing the
// last file of a directory made by another tool (prefix only) would make
// the directory vanish.
func (fs *FS) keepDir(ctx context.Context, dirPath string) {
	if dirPath == "" {
		return
	}
	page, err := fs.store.List(ctx, blobstore.ListOptions{Prefix: dirPath + "/", MaxResults: 1})
	if err != nil || len(page.Blobs) > 0 || len(page.Prefixes) > 0 {
		return
	}
	_, err = fs.store.Put(ctx, dirPath, nil, blobstore.PutOptions{Metadata: folderMeta, Conditions: blobstore.Conditions{IfNoneMatch: true}})
	if err != nil && !errors.Is(err, blobstore.ErrAlreadyExists) {
		fs.log.Warn("could not keep directory marker", "path", dirPath, "err", err)
	}
}

// dirEmpty tells whether dirPath has no children in the store or here.
func (fs *FS) dirEmpty(ctx context.Context, n *node, dirPath string) (bool, error) {
	page, err := fs.store.List(ctx, blobstore.ListOptions{Prefix: dirPath + "/", Delimiter: "/", MaxResults: 1})
	if err != nil {
		return false, err
	}
	if len(page.Blobs) > 0 || len(page.Prefixes) > 0 {
		return false, nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if n.children > 0 {
		for k, c := range fs.nodes.byName {
			if k.parent == n.id && !c.inStore {
				return false, nil
			}
		}
	}
	return true, nil
}

func (fs *FS) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	dir, dirPath, st := fs.node(h.NodeId)
	if !st.Ok() {
		return st
	}
	if fs.opts.ReadOnly {
		return fuse.EROFS
	}
	ctx, cf := fs.reqContext()
	defer cf()
	fs.crashPoint("rmdir", "begin", name)
	resent, isResent := fs.resentIntent(h, dir.id, 0, name, "")
	path := meta.JoinPath(dirPath, name)
	n, err := fs.resolve(ctx, dir, dirPath, name)
	if err != nil {
		if isResent && errors.Is(err, blobstore.ErrNotFound) {
			// The first run removed it.
			fs.lists.InvalidateTree(path)
			fs.forgetName(dir, dirPath, name, resent.Unique)
			fs.keepDir(ctx, dirPath)
			return fuse.OK
		}
		return toStatus(err)
	}
	if n.kind != meta.KindDir {
		return fuse.ENOTDIR
	}
	empty, err := fs.dirEmpty(ctx, n, path)
	if err != nil {
		return toStatus(err)
	}
	if !empty {
		return fuse.Status(syscall.ENOTEMPTY)
	}
	intent := fs.beginIntent(h, dir.id, 0, name, "")
	if err := fs.store.Delete(ctx, path, blobstore.Conditions{}); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
		fs.dropIntent(intent)
		return toStatus(err)
	}
	fs.crashPoint("rmdir", "store", name)
	fs.lists.Remove(dirPath, name)
	fs.lists.InvalidateTree(path)
	fs.mu.Lock()
	touchDirLocked(dir, time.Now())
	fs.batchLocked(func() {
		fs.nodes.detach(n)
		fs.completeIntentLocked(intent, 0, 0)
	})
	fs.mu.Unlock()
	fs.keepDir(ctx, dirPath)
	fs.crashPoint("rmdir", "reply", name)
	return fuse.OK
}

func (fs *FS) Rename(_ <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	const renameNoReplace, renameExchange = 1, 2
	if in.Flags&renameExchange != 0 {
		return fuse.EINVAL // not possible atomically on a blob store
	}
	srcDir, srcDirPath, st := fs.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	dstDir, dstDirPath, st := fs.node(in.Newdir)
	if !st.Ok() {
		return st
	}
	if fs.opts.ReadOnly {
		return fuse.EROFS
	}
	if st := fs.checkNew(dstDir, dstDirPath, newName); !st.Ok() {
		return st
	}
	ctx, cf := fs.reqContext()
	defer cf()
	fs.crashPoint("rename", "begin", oldName)
	resent, isResent := fs.resentIntent(&in.InHeader, srcDir.id, dstDir.id, oldName, newName)
	src, err := fs.resolve(ctx, srcDir, srcDirPath, oldName)
	if err != nil {
		if isResent && errors.Is(err, blobstore.ErrNotFound) {
			if _, err := fs.resolve(ctx, dstDir, dstDirPath, newName); err == nil {
				// The first run moved it.
				fs.finishResentRename(ctx, resent, srcDir, srcDirPath, oldName, dstDir, dstDirPath, newName)
				return fuse.OK
			}
		}
		return toStatus(err)
	}
	srcPath, dstPath := meta.JoinPath(srcDirPath, oldName), meta.JoinPath(dstDirPath, newName)
	if srcPath == dstPath {
		return fuse.OK
	}
	if src.kind == meta.KindDir && strings.HasPrefix(dstPath+"/", srcPath+"/") {
		return fuse.EINVAL // into itself
	}
	dst, st := fs.renameTarget(ctx, src, dstDir, dstDirPath, newName, in.Flags&renameNoReplace != 0, isResent)
	if !st.Ok() {
		return st
	}
	if dst != nil && dst != src && dst.kind != meta.KindDir && !isResent {
		// A file the rename replaces lives on for its open handles:
		// its writers must still reach its content once the copy has
		// replaced the blob (as for unlink).
		if dof := fs.fileOf(dst); dof != nil {
			if err := dof.keepContent(ctx); err != nil {
				return toStatus(err)
			}
		}
	}
	intent := fs.beginIntent(&in.InHeader, srcDir.id, dstDir.id, oldName, newName)
	record := "" // a file rename's record, kept until the old name's directory is
	if src.kind == meta.KindDir {
		err = fs.renameDir(ctx, src, srcPath, dstPath, dst != nil, isResent)
	} else {
		record, err = fs.renameBlob(ctx, src, srcPath, dstPath, isResent)
	}
	defer renameDone(record)
	if err != nil {
		fs.dropIntent(intent)
		fs.log.Warn("rename failed", "from", srcPath, "to", dstPath, "err", err)
		return toStatus(err)
	}
	fs.crashPoint("rename", "store", oldName)
	if dst != nil && dst != src {
		// A file the rename replaced lives on for its open handles,
		// without a name: nothing of it is uploaded (as for unlink).
		if dof := fs.fileOf(dst); dof != nil {
			dof.mu.Lock()
			dof.unlinked = true
			dof.recordLocked(false)
			dof.mu.Unlock()
		}
	}

	fs.mu.Lock()
	now := time.Now()
	touchDirLocked(srcDir, now)
	touchDirLocked(dstDir, now)
	src.attrs.Ctime = now // in memory, as a directory's times: a rename is a status change
	e := meta.Entry{Kind: src.kind, Size: src.size, Mtime: src.mtime, ETag: src.etag, Sum: src.sum, Pending: !src.inStore, Attrs: src.attrs}
	fs.batchLocked(func() {
		fs.nodes.move(src, dstDir.id, newName)
		fs.completeIntentLocked(intent, 0, 0)
	})
	fs.mu.Unlock()
	fs.lists.Remove(srcDirPath, oldName)
	fs.lists.Set(dstDirPath, newName, e)
	fs.keepDir(ctx, srcDirPath)
	fs.crashPoint("rename", "reply", oldName)
	return fuse.OK
}

// renameTarget resolves what a rename to newName in dstDir replaces (nil:
// nothing) and checks that src may replace it: not with noReplace, a
// directory only by a directory, and only an empty one. A resent rename
// whose first run began copying finds the target (partly) there: the
// checks passed before that first run touched the store, so they are not
// made again.
func (fs *FS) renameTarget(ctx context.Context, src, dstDir *node, dstDirPath, newName string, noReplace, isResent bool) (*node, fuse.Status) {
	dst, err := fs.resolve(ctx, dstDir, dstDirPath, newName)
	switch {
	case errors.Is(err, blobstore.ErrNotFound):
		return nil, fuse.OK
	case err != nil:
		return nil, toStatus(err)
	case isResent && dst.kind == src.kind:
	case noReplace:
		return nil, fuse.Status(syscall.EEXIST)
	case src.kind == meta.KindDir && dst.kind != meta.KindDir:
		return nil, fuse.ENOTDIR
	case src.kind != meta.KindDir && dst.kind == meta.KindDir:
		return nil, fuse.Status(syscall.EISDIR)
	case dst.kind == meta.KindDir:
		empty, err := fs.dirEmpty(ctx, dst, meta.JoinPath(dstDirPath, newName))
		if err != nil {
			return nil, toStatus(err)
		}
		if !empty {
			return nil, fuse.Status(syscall.ENOTEMPTY)
		}
	}
	return dst, fuse.OK
}

// fileOf is n's open file, if it has one.
func (fs *FS) fileOf(n *node) *openFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return n.file
}

// finishResentRename completes a rename that the first run of a resent
// request made in the store: the node, if the journal still binds it to
// the old name, follows it.
func (fs *FS) finishResentRename(ctx context.Context, it journal.Intent, srcDir *node, srcDirPath, oldName string, dstDir *node, dstDirPath, newName string) {
	fs.mu.Lock()
	fs.batchLocked(func() {
		if n := fs.nodes.child(srcDir.id, oldName); n != nil {
			fs.nodes.move(n, dstDir.id, newName)
		}
		fs.completeIntentLocked(it.Unique, 0, 0)
	})
	fs.mu.Unlock()
	fs.lists.Remove(srcDirPath, oldName)
	fs.lists.Invalidate(dstDirPath)
	fs.lists.InvalidateTree(meta.JoinPath(srcDirPath, oldName))
	fs.keepDir(ctx, srcDirPath)
}

// renameBlob moves a file or symlink: commit local changes first, then a
// server-side copy and a delete. resent is set for a resent request whose
// first run may have moved the blob already. It returns the rename's record
// (renamerecord.go), for the caller to remove once the old name's
// directory is kept; on an error the record is gone already.
func (fs *FS) renameBlob(ctx context.Context, n *node, srcPath, dstPath string, resent bool) (record string, err error) {
	fs.mu.Lock()
	of := n.file
	inStore := n.inStore
	fs.mu.Unlock()
	if of != nil {
		if err := of.commit(ctx); err != nil {
			return "", err
		}
		fs.mu.Lock()
		inStore = n.inStore
		fs.mu.Unlock()
	}
	if !inStore {
		return "", nil // nothing stored yet: the next commit uses the new name
	}
	// A process that dies between the Copy and the Delete, with its
	// keeper, leaves both names: the record lets the next one on this
	// cache directory finish the move (renamerecord.go).
	record = fs.recordRename(srcPath, dstPath)
	defer func() {
		if err != nil {
			renameDone(record)
			record = ""
		}
	}()
	srcETag := ""
	if of != nil && of.needsSourceETag() {
		// What the Copy will copy, for the open file's condition
		// (followCopy): its content cannot tell.
		if a, err := fs.store.Stat(ctx, srcPath); err == nil {
			srcETag = a.ETag
		}
	}
	a, err := fs.store.Copy(ctx, dstPath, srcPath)
	if resent && errors.Is(err, blobstore.ErrNotFound) {
		// The source was there when this run resolved it (through a
		// listing, or a probe, made before the dead process's Delete
		// landed) and is gone now. That Delete follows its Copy, so the
		// destination holds the source's content: the move is done.
		a, err = fs.store.Stat(ctx, dstPath)
	}
	if err != nil {
		return record, err
	}
	fs.crashPoint("rename", "copied", srcPath)
	if err := fs.store.Delete(ctx, srcPath, blobstore.Conditions{}); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
		return record, err
	}
	fs.followCopy(n, of, a, srcETag)
	return record, nil
}

// followCopy gives a node whose blob a rename copied the copy's ETag, and
// carries the condition of its open file's next commit to the new name,
// but only when the copy is of the version that condition stands for: the
// copy's content is the one the condition saw (Content-MD5 and size), or,
// where that is unknown, srcETag (the source's ETag just before the Copy,
// "" if not known) is the condition's. Another writer's version copied
// leaves the condition as it is: the next commit fails (ESTALE), as it
// would have under the old name, instead of writing over that version.
func (fs *FS) followCopy(n *node, of *openFile, copied blobstore.Attrs, srcETag string) {
	fs.mu.Lock()
	n.etag = copied.ETag
	fs.mu.Unlock()
	if of == nil {
		return
	}
	of.mu.Lock()
	defer of.mu.Unlock()
	cond := of.conditionsLocked()
	if cond.IfMatch == "" {
		return // none, or that there is no blob: nothing to carry
	}
	seen, _ := of.seenContentLocked()
	same := srcETag != "" && srcETag == cond.IfMatch
	if seen.sum.Known() {
		same = contentsum.Of(copied.ContentMD5) == seen.sum && copied.Size == seen.size
	}
	if !same {
		return
	}
	if of.baseETag != "" {
		of.baseETag = copied.ETag
	} else {
		of.openETag = copied.ETag
	}
	// A successor that adopts the mount before the rename's reply learns
	// the condition from the journal: its resent rename finds the old
	// name gone and cannot tell which version the Copy took.
	of.journalLocked(of.dirty())
}

// deleteDirMarker deletes the marker of the empty directory at path that a
// rename replaces, on the condition that it is still the marker just seen.
// Unconditional, a Delete sent by a process that died with it on its way
// could land after the successor's resent rename had put the marker back,
// and the directory the rename made would be gone. Each attempt's If-Match
// names the marker it saw, so a late Delete finds a different one and
// fails.
func (fs *FS) deleteDirMarker(ctx context.Context, path string) error {
	const attempts = 3
	for i := 1; ; i++ {
		a, err := fs.store.Stat(ctx, path)
		if errors.Is(err, blobstore.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !meta.True(a.Metadata, blobstore.MetaIsFolder) {
			// Replaced by a file since the checks: not ours to delete.
			return fmt.Errorf("replace %q: no longer a directory: %w", path, syscall.ENOTDIR)
		}
		err = fs.store.Delete(ctx, path, blobstore.Conditions{IfMatch: a.ETag})
		if err == nil || errors.Is(err, blobstore.ErrNotFound) {
			return nil
		}
		// A new marker came between the Stat and the Delete (a resent
		// run's own, or another client's mkdir): look again.
		if !errors.Is(err, blobstore.ErrPreconditionFailed) || i == attempts {
			return err
		}
	}
}

// renameDir moves every blob under srcPath, and its marker. It is not
// atomic: a failure half-way leaves both trees partly populated and is
// reported; running the rename again completes it. resent is set for a
// resent request whose first run may have moved some blobs already.
func (fs *FS) renameDir(ctx context.Context, n *node, srcPath, dstPath string, replaceEmpty, resent bool) error {
	// Local changes under the tree go to the store first, under the old
	// names, so that the copies below carry them.
	if err := fs.commitBelow(ctx, srcPath); err != nil {
		return err
	}
	if replaceEmpty {
		if err := fs.deleteDirMarker(ctx, dstPath); err != nil {
			return err
		}
	}
	names, listed, err := fs.listBelow(ctx, srcPath)
	if err != nil {
		return err
	}
	hasMarker := false
	if _, err := fs.store.Stat(ctx, srcPath); err == nil {
		hasMarker = true
	} else if !errors.Is(err, blobstore.ErrNotFound) {
		return err
	}
	// The copies' ETags, by old name: open files below follow them.
	var copiedMu sync.Mutex
	copied := make(map[string]blobstore.Attrs, len(names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(renameConcurrency)
	for _, name := range names {
		g.Go(func() error {
			a, err := fs.store.Copy(gctx, dstPath+strings.TrimPrefix(name, srcPath), name)
			if resent && errors.Is(err, blobstore.ErrNotFound) {
				// Listed above, gone now: the dead process's Delete
				// landed after the listing. It deletes only once every
				// copy has landed, so this blob is in place already.
				return nil
			}
			if err == nil {
				copiedMu.Lock()
				copied[name] = a
				copiedMu.Unlock()
			}
			return err
		})
	}
	switch {
	case hasMarker:
		// Copied, not made anew: the marker carries the directory's
		// attributes.
		g.Go(func() error {
			_, err := fs.store.Copy(gctx, dstPath, srcPath)
			if resent && errors.Is(err, blobstore.ErrNotFound) {
				return nil // moved by the first run, as above
			}
			return err
		})
	case len(names) == 0:
		fs.mu.Lock()
		md := fs.newMeta(folderMeta, meta.KindDir, n.attrs)
		fs.mu.Unlock()
		g.Go(func() error {
			_, err := fs.store.Put(gctx, dstPath, nil, blobstore.PutOptions{Metadata: md})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := fs.deleteAll(ctx, append(names, srcPath)); err != nil {
		return err
	}
	fs.lists.InvalidateTree(srcPath)
	fs.lists.InvalidateTree(dstPath)
	fs.followMovedTree(srcPath, copied, listed)
	return nil
}

// commitBelow commits every open file below dirPath.
func (fs *FS) commitBelow(ctx context.Context, dirPath string) error {
	fs.mu.Lock()
	var open []*openFile
	for _, d := range fs.nodes.descendants(dirPath) {
		if d.file != nil {
			open = append(open, d.file)
		}
	}
	fs.mu.Unlock()
	for _, of := range open {
		if err := of.commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// listBelow lists every blob below dirPath, flat: their names, and their
// ETags by name.
func (fs *FS) listBelow(ctx context.Context, dirPath string) (names []string, etags map[string]string, err error) {
	etags = map[string]string{}
	opts := blobstore.ListOptions{Prefix: dirPath + "/"}
	for {
		page, err := fs.store.List(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		for _, b := range page.Blobs {
			names = append(names, b.Name)
			etags[b.Name] = b.ETag
		}
		if page.NextMarker == "" {
			return names, etags, nil
		}
		opts.Marker = page.NextMarker
	}
}

// deleteAll deletes the blobs names, renameConcurrency at a time; a blob
// already gone is not an error.
func (fs *FS) deleteAll(ctx context.Context, names []string) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(renameConcurrency)
	for _, name := range names {
		g.Go(func() error {
			if err := fs.store.Delete(gctx, name, blobstore.Conditions{}); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
				return err
			}
			return nil
		})
	}
	return g.Wait()
}

// followMovedTree tells the nodes below a directory moved from srcPath
// that their blobs were copied (copied, by old name; listed holds the
// sources' ETags): cached attributes still describe the same content,
// and open files follow their copies. A node not seen copied asks the
// store again.
func (fs *FS) followMovedTree(srcPath string, copied map[string]blobstore.Attrs, listed map[string]string) {
	type follower struct {
		n      *node
		of     *openFile
		copied blobstore.Attrs
		src    string // the source's ETag in the listing
	}
	var followers []follower
	fs.mu.Lock()
	now := time.Now()
	for _, d := range fs.nodes.descendants(srcPath) {
		if p, ok := fs.nodes.path(d); ok {
			if a, ok := copied[p]; ok {
				followers = append(followers, follower{d, d.file, a, listed[p]})
				continue
			}
		}
		d.attrExpiry = now // not seen copied: ask the store again
	}
	fs.mu.Unlock()
	for _, f := range followers {
		fs.followCopy(f.n, f.of, f.copied, f.src)
	}
}
