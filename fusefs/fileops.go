package fusefs

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// handle is an open file or directory, named by the id the kernel holds.
type handle struct {
	id    uint64
	n     *node
	of    *openFile // files only
	write bool
	// io is how the open reply set the kernel's io mode (passthrough.go).
	io journal.IOMode
	// opened is the OPEN request that made the handle and the flags its
	// reply carries: a resent OPEN is answered with this handle
	// (resentOpenLocked). Zero for handles made otherwise.
	opened journal.OpenReply

	raMu     sync.Mutex
	raNext   int64 // where a sequential read continues
	raSeq    int64 // bytes read sequentially since the last seek
	raWindow int   // blocks read ahead; grows while reads stay sequential
	raSeeks  int   // reads in a row that did not continue the one before
	raReads  bool  // the handle has read
	// raRandom: the handle reads at random (readAhead); raClose counts
	// its reads in a row near the one before, two of which make it
	// sequential again.
	raRandom bool
	raClose  int
	// raPassed is the last block the stream passed (blockCache.pass),
	// valid while raWindow > 0.
	raPassed int64
	// raFilled: the handle asked for its file to be fetched whole into
	// the disk cache (fillDisk), once.
	raFilled bool

	dirMu sync.Mutex
	dir   *dirStream // the directory pass; guarded by dirMu
}

func (fs *FS) newHandleLocked(n *node, of *openFile, write bool, io journal.IOMode, opened journal.OpenReply) *handle {
	h := &handle{id: fs.nextHandle, n: n, of: of, write: write, io: io, opened: opened}
	fs.nextHandle++
	if of != nil && write {
		of.writers++
	}
	fs.handles[h.id] = h
	if fs.nodes.state != nil {
		fs.nodes.state.Append(handleRecord(nil, h))
	}
	return h
}

// dropHandleLocked forgets a released handle.
func (fs *FS) dropHandleLocked(fh uint64) *handle {
	h := fs.handles[fh]
	if h == nil {
		return nil
	}
	delete(fs.handles, fh)
	if fs.nodes.state != nil {
		fs.nodes.state.Append(journal.IDRecord(nil, journal.RecHandleDrop, fh))
	}
	return h
}

func (fs *FS) handle(fh uint64) *handle {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.handles[fh]
}

// acquireFile returns n's shared open state with one more reference.
func (fs *FS) acquireFile(n *node) *openFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.acquireFileLocked(n)
}

func (fs *FS) acquireFileLocked(n *node) *openFile {
	if n.file == nil {
		n.file = &openFile{fs: fs, n: n}
	}
	n.file.refs++
	return n.file
}

// releaseFile drops a reference. The last one commits what is dirty; if
// that fails for a reason that may pass, a background retry keeps the data
// and tries again; otherwise the spill file is kept in lost+found.
func (fs *FS) releaseFile(of *openFile) {
	if fs.opts.WriteBack {
		of.mu.Lock()
		dirty, queued := of.dirty(), of.writeBackQueued
		of.mu.Unlock()
		if dirty && !queued && fs.ctx.Err() != nil {
			// Closed without a Sync before this file's upload started
			// (its RELEASE came after Close): left to the successor
			// like the uploads under way (abandonWriteBack), not
			// committed under a cancelled context into lost+found.
			fs.abandonWriteBack(of)
			return
		}
		fs.mu.Lock()
		last := of.refs == 1
		fs.mu.Unlock()
		if last && dirty && !queued {
			// The last reference goes to the background upload, never
			// dropped in between (writeback.go).
			fs.writeBackLater(of, true)
			return
		}
	}
	fs.mu.Lock()
	of.refs--
	last := of.refs == 0
	fs.mu.Unlock()
	if !last {
		return
	}
	if err := of.commit(fs.ctx); err != nil {
		if blobstore.Retryable(err) && fs.ctx.Err() == nil {
			fs.log.Warn("upload failed; retrying in the background", "err", err)
			fs.retryCommit(of)
			return
		}
		fs.keepFailed(of, err)
	}
	fs.mu.Lock()
	drop := of.refs == 0
	if drop && of.n.file == of {
		of.n.file = nil
	}
	fs.mu.Unlock()
	if drop {
		// The spill file's removal is journaled before the node's drop,
		// whose record would otherwise take the spill file's record
		// with it: a process killed in between would leave the spill
		// file behind, unknown to its successor.
		of.close()
		var listed string
		fs.mu.Lock()
		if of.n.file == nil {
			if of.keptFailed.Load() {
				listed = fs.showStoredLocked(of.n)
			}
			fs.nodes.maybeDrop(of.n)
		}
		fs.mu.Unlock()
		if listed != "" {
			dir, _ := meta.SplitPath(listed)
			fs.lists.Invalidate(dir)
		}
	}
}

// showStoredLocked makes n show what the store holds once its file's
// changes went to lost+found and its last reference is gone: a file that
// never reached the store loses its name (it was listed at size 0 until
// the kernel forgot it), one that did shows the stored version at its next
// stat. It returns n's path, whose directory listing the caller drops:
// it lists the name as this mount last wrote it.
func (fs *FS) showStoredLocked(n *node) string {
	path, named := fs.nodes.path(n)
	if !named {
		return ""
	}
	n.attrExpiry = time.Time{}
	if !n.inStore {
		fs.nodes.detach(n)
	}
	return path
}

// retryCommit keeps retrying an upload that failed at release, holding a
// reference so the data stays readable through the mount meanwhile.
func (fs *FS) retryCommit(of *openFile) { fs.retryCommitAfter(of, time.Second) }

func (fs *FS) retryCommitAfter(of *openFile, first time.Duration) {
	fs.mu.Lock()
	of.refs++
	fs.mu.Unlock()
	fs.bg.Add(1)
	go func() {
		defer fs.bg.Done()
		delay := first
		for {
			select {
			case <-time.After(delay):
			case <-fs.ctx.Done():
			}
			ctx, cf := context.WithTimeout(context.Background(), 5*time.Minute)
			err := of.commit(ctx)
			cf()
			if err == nil || fs.ctx.Err() != nil || !blobstore.Retryable(err) {
				if err != nil {
					fs.keepFailed(of, err)
				}
				fs.releaseFile(of)
				return
			}
			delay = min(max(delay*2, time.Second), time.Minute)
		}
	}()
}

// keepFailed moves the spill file of a commit that failed for good to
// lost+found, and says where.
func (fs *FS) keepFailed(of *openFile, err error) {
	path, _ := fs.pathOf(of.n)
	kept := of.keepSpill(path)
	of.keptFailed.Store(true)
	fs.keptFiles.Add(1)
	if isConflict(err) {
		// Not a failure of blobfs: the user's own data met another
		// writer's change, and must hear of both. The commit's
		// condition does not tell a replaced blob from a deleted one;
		// the store does.
		switch gone, known := fs.blobGone(path); {
		case !known:
			fs.log.Warn("file changed or deleted in the store since it was opened here; its data is kept in lost+found",
				"path", path, "kept", kept, "err", err)
		case gone:
			fs.log.Warn("the blob was deleted since this file was opened; its data is kept in lost+found",
				"path", path, "kept", kept, "err", err)
		default:
			fs.log.Warn("file changed in the store since it was opened here (another writer); the store keeps the other writer's version, this one is kept on local disk",
				"path", path, "kept", kept, "err", err)
		}
		return
	}
	fs.log.Error("upload failed; data kept on local disk", "path", path, "kept", kept, "err", err)
}

// blobGone asks the store whether the blob name is gone; known is false
// when the store could not say.
func (fs *FS) blobGone(name string) (gone, known bool) {
	ctx, cf := context.WithTimeout(context.Background(), 30*time.Second)
	defer cf()
	_, err := fs.store.Stat(ctx, name)
	if errors.Is(err, blobstore.ErrNotFound) {
		return true, true
	}
	return false, err == nil
}

// isConflict tells whether a commit failed its condition: another writer
// changed the blob since this file's writers saw it.
func isConflict(err error) bool {
	return errors.Is(err, blobstore.ErrPreconditionFailed) || errors.Is(err, blobstore.ErrAlreadyExists)
}

// committed records a successful upload of n.
func (fs *FS) committed(n *node, path string, a blobstore.Attrs, size int64) {
	e := meta.EntryOf(a)
	e.Size = size
	fs.mu.Lock()
	n.inStore = true
	n.etag, n.size, n.mtime, n.sum = a.ETag, size, e.Mtime, e.Sum
	n.attrExpiry = time.Now().Add(fs.opts.AttrTimeout)
	fs.mu.Unlock()
	dir, name := meta.SplitPath(path)
	fs.lists.Set(dir, name, e)
}

func isWrite(flags uint32) bool { return flags&syscall.O_ACCMODE != syscall.O_RDONLY }

func (fs *FS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n, path, st := fs.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	switch n.kind {
	case meta.KindDir:
		return fuse.Status(syscall.EISDIR)
	case meta.KindSymlink:
		return fuse.Status(syscall.ELOOP)
	case meta.KindSpecial:
		// The kernel serves FIFOs and sockets itself, and does not
		// open device nodes on a nodev mount: nothing to open here.
		return fuse.Status(syscall.ENXIO)
	}
	write := isWrite(in.Flags)
	if write && fs.opts.ReadOnly {
		return fuse.EROFS
	}
	fs.mu.Lock()
	resent := fs.resentOpenLocked(in, out)
	fs.mu.Unlock()
	if resent {
		return fuse.OK
	}
	ctx, cf := fs.reqContext()
	defer cf()

	// Revalidate so that reads see the blob as it is now.
	fs.mu.Lock()
	fresh := fs.attrFresh(n)
	fs.mu.Unlock()
	if !fresh {
		a, err := fs.store.Stat(ctx, path)
		if err != nil {
			return toStatus(err)
		}
		fs.mu.Lock()
		fs.applyEntryLocked(n, meta.EntryOf(a))
		superseded := n.superseded
		fs.mu.Unlock()
		if superseded {
			// Replaced while its passthrough handles read the old
			// version: the kernel looks the name up again.
			return fuse.Status(syscall.ESTALE)
		}
	}

	of := fs.acquireFile(n)
	if write {
		of.streamName.Store(&path)
		_, etag, size, inStore, _ := fs.fileState(n)
		of.openedForWrite(etag, inStore, fs.storedSum(n, etag), size)
	}
	if write && in.Flags&syscall.O_TRUNC != 0 {
		if err := of.truncate(ctx, 0); err != nil {
			fs.releaseFile(of)
			return toStatus(err)
		}
	}
	if !write {
		fs.prefetchAfterOpen(path)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	// The kernel may keep cached pages when the blob is the one it cached.
	if !of.hasSpill.Load() && n.etag != "" && n.etag == n.lastOpenETag {
		out.OpenFlags |= fuse.FOPEN_KEEP_CACHE
	}
	n.lastOpenETag = n.etag
	if !write {
		relatimeLocked(n, time.Now())
	}
	if !write && fs.directRead(n.size) {
		out.OpenFlags |= fuse.FOPEN_DIRECT_IO
	}
	out.OpenFlags |= writeOnlyFlags(in.Flags)
	io := fs.chooseIOLocked(n, path, write, out)
	h := fs.newHandleLocked(n, of, write, io, journal.OpenReply{Unique: in.Unique &^ resendBit, Flags: out.OpenFlags})
	out.Fh = h.id
	fs.crashPoint("open", "reply", n.name)
	return fuse.OK
}

// resentOpenLocked answers an OPEN that the kernel sent again after a
// restart (FUSE_NOTIFY_RESEND) whose handle a dead process had already
// made and journaled: with that very handle, as its lost reply would have.
// A new handle instead would leave the journaled one open for good, no
// RELEASE ever coming for it; for a passthrough handle, every later open
// of the file would then join its backing file, whatever the blob became.
func (fs *FS) resentOpenLocked(in *fuse.OpenIn, out *fuse.OpenOut) bool {
	if in.Unique&resendBit == 0 {
		return false
	}
	unique := in.Unique &^ resendBit
	for _, h := range fs.handles {
		if h.opened.Unique != unique || h.n.id != in.NodeId {
			continue
		}
		out.Fh, out.OpenFlags = h.id, h.opened.Flags
		if h.io == journal.IOPassthrough {
			out.BackingID = h.n.io.backingID
		}
		return true
	}
	return false
}

// writeOnlyFlags opens a write-only handle with FOPEN_DIRECT_IO: its data
// then goes from the writer's pages to the spill file with no copy into
// the kernel's page cache of the file, which nothing could read through
// this handle and which only duplicated the spill file's own pages. A
// direct write invalidates the cached pages it overlaps, so other handles
// on the file still read what was written. Writing 256 MiB through a
// fresh mount over the fake store went from 0.87-0.92 of the direct
// upload to 1.01-1.12 (blobfs-bench -figures faulty-write), fresh memory
// being slow to fault in on these machines.
func writeOnlyFlags(openFlags uint32) uint32 {
	if openFlags&syscall.O_ACCMODE == syscall.O_WRONLY {
		return fuse.FOPEN_DIRECT_IO
	}
	return 0
}

// directRead tells whether a read-only handle on a file of this size
// bypasses the kernel's page cache (FOPEN_DIRECT_IO): see
// Options.DirectReadMinBytes. Only where the kernel agreed to
// FUSE_DIRECT_IO_ALLOW_MMAP, so that such files can still be mapped
// shared; mmap then goes through the page cache as usual.
func (fs *FS) directRead(size int64) bool {
	return fs.directIOMmap.Load() && fs.opts.DirectReadMinBytes > 0 && size >= fs.opts.DirectReadMinBytes && !fs.passthroughPossible()
}

// AllowDirectIOMmap is called by the Session serving fs once it knows whether
// the kernel agreed to FUSE_DIRECT_IO_ALLOW_MMAP.
func (fs *FS) AllowDirectIOMmap(ok bool) { fs.directIOMmap.Store(ok) }

func (fs *FS) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	dir, dirPath, st := fs.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if fs.opts.ReadOnly {
		return fuse.EROFS
	}
	if st := fs.checkNew(dir, dirPath, name); !st.Ok() {
		return st
	}
	if in.Mode&syscall.S_IFMT != 0 && in.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fuse.EPERM
	}
	ctx, cf := fs.reqContext()
	defer cf()
	fs.crashPoint("create", "begin", name)
	if resent, ok := fs.resentIntent(&in.InHeader, dir.id, 0, name, ""); ok && resent.Done {
		// The first run completed: answer with the node and handle its
		// reply carried, both journaled (and counted) already.
		fs.mu.Lock()
		h, n := fs.handles[resent.FH], fs.nodes.child(dir.id, name)
		if h != nil && n != nil && h.n == n && n.id == resent.Node {
			fs.fillEntry(n, &out.EntryOut)
			out.Fh = h.id
			fs.mu.Unlock()
			return fuse.OK
		}
		fs.mu.Unlock()
	}
	// Creating a file touches no store; the intent tells a successor
	// that this node's spill file was never handed out (restore) and,
	// once complete, which node and handle the reply carries.
	intent := fs.beginIntent(&in.InHeader, dir.id, 0, name, "")

	fs.mu.Lock()
	now := time.Now()
	if old := fs.nodes.child(dir.id, name); old != nil && old.file != nil && !old.file.hasSpill.Load() {
		// The kernel creates a name this mount still binds to a file
		// open here with nothing of its own: the lookup before this
		// CREATE found no blob, so another writer deleted it. As after
		// an unlink, the open handles keep the old node without a name
		// (a writer among them conflicts at its commit: its blob is
		// gone), and the new file is a new node whose commit requires
		// that no blob exist, not the deleted one's ETag.
		fs.nodes.detach(old)
	}
	n := fs.nodes.bind(dir.id, name, meta.KindFile)
	if n.file == nil {
		n.inStore = false
		n.attrs, n.attrsKnown = fs.newAttrsLocked(dir, in.Caller.Uid, in.Caller.Gid, in.Mode, meta.KindFile, now), true
	}
	touchDirLocked(dir, now)
	n.size, n.mtime = 0, now
	etag, inStore := n.etag, n.inStore && in.Flags&syscall.O_EXCL == 0
	of := fs.acquireFileLocked(n)
	fs.mu.Unlock()
	path := meta.JoinPath(dirPath, name)
	of.streamName.Store(&path)

	// What the writer saw, before the spill file exists, so that its
	// journal record says so: a successor's commit must be conditional
	// too. No blob, unless this mount has the file open already.
	of.openedForWrite(etag, inStore, contentsum.Sum{}, 0)
	if err := of.truncate(ctx, 0); err != nil {
		fs.releaseFile(of)
		fs.dropIntent(intent)
		return toStatus(err)
	}
	fs.crashPoint("create", "store", name) // the spill file exists, the handle not yet
	fs.mu.Lock()
	e := meta.Entry{Kind: meta.KindFile, Mtime: now, Pending: true, Attrs: n.attrs}
	fs.mu.Unlock()
	fs.lists.Set(dirPath, name, e)

	fs.mu.Lock()
	fs.batchLocked(func() {
		fs.nodes.ref(n)
		fs.fillEntry(n, &out.EntryOut)
		out.OpenFlags |= writeOnlyFlags(in.Flags)
		h := fs.newHandleLocked(n, of, true, fs.chooseIOLocked(n, path, true, &out.OpenOut), journal.OpenReply{})
		out.Fh = h.id
		fs.completeIntentLocked(intent, n.id, h.id)
	})
	fs.mu.Unlock()
	fs.crashPoint("create", "reply", name)
	return fuse.OK
}

// checkNew validates a name about to be created in dir.
func (fs *FS) checkNew(dir *node, dirPath, name string) fuse.Status {
	if dir.kind != meta.KindDir {
		return fuse.ENOTDIR
	}
	if st := meta.CheckName(name); !st.Ok() {
		return st
	}
	return meta.CheckPath(meta.JoinPath(dirPath, name))
}

func (fs *FS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	h := fs.handle(in.Fh)
	if h == nil || h.of == nil {
		return nil, fuse.EBADF
	}
	buf = buf[:min(len(buf), int(in.Size))]
	off := int64(in.Offset)
	if n, ok, err := h.of.readLocal(buf, off); ok {
		if err != nil {
			return nil, toStatus(err)
		}
		return fuse.ReadResultData(buf[:n]), fuse.OK
	}
	path, etag, size, inStore, ok := fs.fileState(h.n)
	if !ok {
		return nil, fuse.Status(syscall.ESTALE)
	}
	ctx, cf := fs.readContext(in.Unique, in.Pid)
	defer cf()
	if inStore && etag == "" {
		// Attributes not known yet: a node restored from the state
		// region of a previous process.
		a, err := fs.store.Stat(ctx, path)
		if err != nil {
			return nil, toStatus(err)
		}
		fs.mu.Lock()
		fs.applyEntryLocked(h.n, meta.EntryOf(a))
		fs.mu.Unlock()
		etag, size = a.ETag, a.Size
	}
	if !inStore || off >= size {
		return fuse.ReadResultData(nil), fuse.OK
	}
	start := off == 0 && !fs.blocks.Has(cache.BlockKey{Name: path, ETag: etag, Idx: 0})
	if err := fs.sums.Expect(path, etag, size, fs.storedSum(h.n, etag), start); err != nil {
		return nil, toStatus(err)
	}
	random := fs.readAhead(h, path, etag, size, off, len(buf))
	res, err := fs.readStored(ctx, random, path, etag, size, buf, off)
	if errors.Is(err, blobstore.ErrPreconditionFailed) {
		// The blob was replaced (by a rename's copy, or another
		// writer): read what is there now.
		var a blobstore.Attrs
		if a, err = fs.store.Stat(ctx, path); err == nil {
			fs.mu.Lock()
			fs.applyEntryLocked(h.n, meta.EntryOf(a))
			fs.mu.Unlock()
			etag = a.ETag // what the check below is about now
			if err = fs.sums.Expect(path, a.ETag, a.Size, contentsum.Of(a.ContentMD5), off == 0); err == nil {
				res, err = fs.readStored(ctx, random, path, a.ETag, a.Size, buf, off)
			}
		}
	}
	if err == nil && fs.sums.IsCorrupt(path, etag) {
		// Another fetch of these bytes got the verdict.
		res.Done()
		err = contentsum.ErrMismatch
	}
	if err != nil {
		if !callerGone(ctx) {
			fs.log.Warn("read failed", "path", path, "off", off, "err", err)
		}
		return nil, toStatus(err)
	}
	fs.readBytes.Add(int64(res.Size()))
	return res, fuse.OK
}

// readStored answers a READ of a blob's bytes: for a random reader from
// the chunk cache, unless its block is in the block cache already (whole,
// or being fetched); otherwise from the block cache.
func (fs *FS) readStored(ctx context.Context, random bool, path, etag string, size int64, buf []byte, off int64) (fuse.ReadResult, error) {
	if random && !fs.blocks.Has(cache.BlockKey{Name: path, ETag: etag, Idx: off / fs.opts.ReadBlockSize}) {
		n, err := fs.chunks.Read(ctx, path, etag, size, buf, off)
		return fuse.ReadResultData(buf[:n]), err
	}
	return fs.readCached(ctx, path, etag, size, buf, off)
}

// readCached answers a READ from the block cache. Within one block, the
// answer is the block itself, pinned until the reply is written
// (kernel.ZeroCopyRead): no copy into buf. Across two, the bytes are copied.
func (fs *FS) readCached(ctx context.Context, path, etag string, size int64, buf []byte, off int64) (fuse.ReadResult, error) {
	r, ok, err := fs.blocks.Pin(ctx, path, etag, size, off, len(buf))
	if err != nil {
		return nil, err
	}
	if ok {
		return kernel.ZeroCopyRead(r), nil
	}
	n, err := fs.blocks.Read(ctx, path, etag, size, buf, off)
	return fuse.ReadResultData(buf[:n]), err
}

// readAhead detects sequential reads on a handle and keeps a window of
// blocks beyond the read being fetched in the background (or queued for a
// fetch slot), at most readAheadWindow.
//
// The window doubles with every sequential read, and is at least
// readAheadRatio times the bytes read sequentially so far: a stream read in
// 1 MiB requests (the kernel's read-ahead, or an application's large reads
// under direct I/O) gets the whole window on its first READ, because a
// store with high latency and limited bandwidth per stream needs every
// fetch in flight from the start; 4 KiB reads ramp up over a few requests.
// A seek resets the window and makes the handle's unread read-ahead blocks
// evictable.
func (fs *FS) readAhead(h *handle, path, etag string, size, off int64, n int) (random bool) {
	// The kernel's own read-ahead sends several READs at once, answered
	// by several readers: they arrive slightly out of order. A read near
	// where the stream is (within one block either way) counts as
	// sequential; only a real seek resets the window.
	bs := fs.opts.ReadBlockSize
	h.raMu.Lock()
	seek := false
	sequential := off >= h.raNext-bs && off <= h.raNext+bs
	if h.raRandom {
		// A random reader's next read lands within a block of the
		// last one now and then: only two in a row, each close to
		// the one before, make it a stream again.
		if sequential = off >= h.raNext-randomGap && off <= h.raNext+randomGap; sequential {
			h.raClose++
			sequential = h.raClose >= 2
		} else {
			h.raClose = 0
		}
	}
	if sequential {
		h.raSeq += int64(n)
		byBytes := (h.raSeq*readAheadRatio + bs - 1) / bs
		h.raWindow = int(min(max(int64(h.raWindow)*2, byBytes, 1), int64(fs.readAheadWindow())))
		h.raSeeks, h.raRandom, h.raClose = 0, false, 0
	} else {
		seek = h.raWindow > 0
		h.raWindow, h.raSeq = 0, 0
		h.raSeeks++
		if !h.raReads {
			// The first read, not at the start: taken for random
			// at once (if the next ones continue it, it is a stream
			// again, for the price of a chunk or two).
			h.raSeeks = 2
		}
		h.raRandom = h.raRandom || h.raSeeks >= 2
	}
	h.raReads = true
	random = h.raRandom
	fill := random && !h.raFilled
	h.raFilled = h.raFilled || random
	h.raNext = max(h.raNext, off+int64(n))
	if h.raWindow == 0 {
		h.raNext = off + int64(n)
	}
	window := h.raWindow
	last := (min(off+int64(n), size) - 1) / bs
	// A stream through a blob larger than the cache passes the blocks
	// two behind the one it reads (the kernel's READs come slightly out
	// of order, within a block): each once, from where it started.
	passFrom, passTo := int64(0), int64(-1)
	if window > 0 && h.raSeq == int64(n) { // the stream's first READ
		h.raPassed = last - 2
	}
	if window > 0 && size > fs.blocks.Capacity() {
		passFrom, passTo = max(h.raPassed+1, 0), last-2
		h.raPassed = max(h.raPassed, passTo)
	}
	h.raMu.Unlock()
	if fill {
		fs.src.FillDisk(fs.ctx, &fs.bg, path, etag, size, fs.storedSum(h.n, etag))
	}
	if seek {
		fs.blocks.Demote(h.id)
	}
	if window == 0 {
		return random
	}
	for i := passFrom; i <= passTo; i++ {
		fs.blocks.Pass(cache.BlockKey{Name: path, ETag: etag, Idx: i}, h.id)
	}
	for i := int64(1); i <= int64(window); i++ {
		fs.blocks.Prefetch(cache.BlockKey{Name: path, ETag: etag, Idx: last + i}, size, h.id)
	}
	return random
}

// randomGap is how close to the last read a random reader's read must be
// to count towards its being a stream again.
const randomGap = 1 << 20

// readAheadRatio is how many bytes readAhead fetches ahead of a stream for
// every byte it has read sequentially, until the window is full: 1 MiB
// read opens a window of 256 MiB, the whole default window (24 blocks of
// 8 MiB). With 128, the first READ queued only 16 blocks, as many as the
// fetch slots: the next fetches were asked for only once the first block
// had arrived and been read, a whole fetch time after slots came free.
const readAheadRatio = 256

// readAheadWindow is the largest read-ahead window in blocks: twice the
// fetches in flight (Options.MaxReadAheadBlocks), so that the next fetches
// are queued when the first ones complete, but at most three quarters of
// the cache, so that the blocks being read stay cached too.
func (fs *FS) readAheadWindow() int {
	cacheBlocks := int(fs.opts.BlockCacheBytes / fs.opts.ReadBlockSize)
	return max(min(2*fs.opts.MaxReadAheadBlocks, cacheBlocks*3/4), 1)
}

func (fs *FS) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	h := fs.handle(in.Fh)
	if h == nil || h.of == nil || !h.write {
		return 0, fuse.EBADF
	}
	ctx, cf := fs.reqContext()
	defer cf()
	if err := h.of.write(ctx, data, int64(in.Offset)); err != nil {
		if errors.Is(err, syscall.EFBIG) {
			// Beyond the largest file the spill directory holds: the
			// caller's mistake, answered, not blobfs failing.
			fs.log.Debug("write beyond the largest file", "node", h.n.id, "offset", in.Offset, "err", err)
		} else {
			fs.log.Warn("write failed", "node", h.n.id, "err", err)
		}
		return 0, toStatus(err)
	}
	fs.mu.Lock()
	h.n.mtime = time.Now()
	killed := in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 && killPrivLocked(h.n)
	fs.mu.Unlock()
	if killed {
		// The spill file's record carries the mode to a successor.
		h.of.mu.Lock()
		h.of.recordLocked(true)
		h.of.mu.Unlock()
	}
	return uint32(len(data)), fuse.OK
}

// Flush runs at every close(2): this is where upload errors reach the
// application.
func (fs *FS) Flush(_ <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil || h.of == nil {
		return fuse.EBADF
	}
	if !fs.flushNow(h) {
		return fuse.OK // uploaded after the release (writeback.go)
	}
	return fs.commit(h)
}

func (fs *FS) Fsync(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil || h.of == nil {
		return fuse.EBADF
	}
	return fs.commit(h)
}

// commit uploads at close and fsync, to its end whatever signal the
// caller gets (see reqContext): answering EINTR would tell the application
// its close failed while the data lands anyway.
func (fs *FS) commit(h *handle) fuse.Status {
	if err := h.of.commit(fs.ctx); err != nil {
		fs.log.Warn("commit failed", "err", err)
		if isConflict(err) {
			// ESTALE for a failed If-None-Match too: the file this
			// writer opened is not the one in the store, which EEXIST
			// at close would not say.
			return fuse.Status(syscall.ESTALE)
		}
		return fuse.EIO
	}
	return fuse.OK
}

func (fs *FS) Release(_ <-chan struct{}, in *fuse.ReleaseIn) {
	fs.mu.Lock()
	h := fs.dropHandleLocked(in.Fh)
	lastWriter := false
	if h != nil && h.of != nil && h.write {
		h.of.writers--
		lastWriter = h.of.writers == 0
	}
	if h != nil && h.of != nil {
		fs.releaseIOLocked(h)
	}
	fs.mu.Unlock()
	if lastWriter {
		h.of.writerReleased()
		if fs.opts.WriteBack && fs.ctx.Err() == nil {
			// Not when the last reference goes: a reader may hold the
			// file open for days.
			fs.writeBackLater(h.of, false)
		}
	}
	if h != nil && h.of != nil {
		fs.blocks.Demote(h.id)
		fs.releaseFile(h.of)
	}
}

// openFiles returns the files open now, or whose upload runs after their
// release.
func (fs *FS) openFiles() []*openFile {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var files []*openFile
	for _, n := range fs.nodes.byID {
		if n.file != nil {
			files = append(files, n.file)
		}
	}
	return files
}

// Sync uploads every dirty file, those open and those whose upload runs
// in the background (write-back, retries); used before unmounting.
func (fs *FS) Sync(ctx context.Context) error {
	files := fs.openFiles()
	var errs []error
	for _, of := range files {
		if err := of.commit(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Unmounted lets go of the spill files of files still open once the mount
// is gone for good (no request can come any more) and Sync has run: the
// RELEASE the kernel queues for a file closed just before the unmount may
// never reach this process, and its spill file would stay in the cache
// directory (a foreground mount stopped right after a write left it
// there). A file with changes the store lacks keeps its spill file, and
// the data stays in the cache directory.
func (fs *FS) Unmounted() {
	files := fs.openFiles()
	for _, of := range files {
		of.closeIfClean()
	}
}
