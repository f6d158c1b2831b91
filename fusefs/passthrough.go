package fusefs

import (
	"errors"
	"sync/atomic"
	"unsafe"

	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE passthrough (Linux 6.9): on a read-only mount, a file the disk cache
// holds whole is opened with FOPEN_PASSTHROUGH and the cache file as its
// backing file, so the kernel serves its reads (and mmap) from the cache
// file itself, at local disk speed, without a round trip to blobfs; they
// even go on while the blobfs process restarts.
//
// The kernel's rules (fs/fuse/iomode.c): while an inode has a backing
// file, every open of it must be FOPEN_PASSTHROUGH on that same file (any
// other open fails with EIO in the application), and an inode open in
// cached io mode (an open without FOPEN_DIRECT_IO, or an mmap of one with
// it) cannot get a backing file. Hence:
//   - read-only mounts only: a writer could open any file at any time,
//     and its open would have to be passthrough too, its writes never
//     reaching blobfs. On a read-write mount the disk cache serves reads
//     through blobfs instead;
//   - each node counts its handles by io mode (node.io): a file held
//     whole becomes passthrough only when no cached-mode handle is open;
//   - while a node has passthrough handles, every open of that node joins
//     their backing file. When the blob changes in the store meanwhile,
//     the node keeps the version its handles read (its size and times
//     too, so that fstat and read agree) and gives its name up: the next
//     lookup binds the name to a new node, a new inode in the kernel,
//     whose opens read the new version. An open or stat that still meets
//     the old node through the kernel's cached name gets ESTALE, on which
//     the kernel looks the name up again and retries: new opens see a
//     change as soon as they would without passthrough (AttrTimeout);
//   - read-only opens never get FOPEN_DIRECT_IO while passthrough is
//     possible (Options.DirectReadMinBytes is then unused): an mmap of
//     such a handle would put the inode in cached mode unseen.
//
// Backing ids belong to the connection, so they outlive a blobfs process
// that the keeper replaces: each passthrough handle's record in the state
// region carries its id, and the adopter closes the id when the last of
// them is released.

// ioOpens is a node's handles by io mode, and its backing file while it
// has passthrough handles. Guarded by FS.mu.
type ioOpens struct {
	cached, passthrough int
	backingID           int32
	// backingETag is the version the backing file holds; "" when not
	// known (restored from a previous process).
	backingETag string
	// backing is the pinned cache file (nil when restored).
	backing *cache.DiskEntry
}

// pinnedToOtherVersion tells whether the node's passthrough handles read
// a version of the blob other than e's. A node restored from a previous
// process does not know its backing file's version: it is not split.
func (io *ioOpens) pinnedToOtherVersion(e meta.Entry) bool {
	return io.passthrough > 0 && io.backingETag != "" && e.Kind == meta.KindFile &&
		!e.Pending && e.ETag != "" && e.ETag != io.backingETag
}

// supersedeLocked detaches n, whose passthrough handles read a version of
// its blob that the store no longer has, from its name: it keeps its
// attributes (those of the version its handles read) until the kernel
// forgets it, and its name goes to a new node at the next lookup.
func (fs *FS) supersedeLocked(n *node) {
	if n.parent == 0 {
		return
	}
	path, _ := fs.nodes.path(n)
	fs.log.Debug("blob replaced while open with passthrough: the open handles keep their version, new opens get a new node", "path", path, "node", n.id)
	n.superseded = true
	fs.nodes.detach(n)
}

// passthrough is a mount's use of FUSE passthrough.
type passthrough struct {
	// devFD is the mount's /dev/fuse descriptor, -1 before a Session
	// serves it (New sets -1); on: the kernel granted FUSE_PASSTHROUGH
	// and this mount is read-only with a disk cache.
	devFD atomic.Int64
	on    atomic.Bool
	// opens counts passthrough opens (Stats).
	opens atomic.Int64
}

// AllowPassthrough is called by the Session serving fs once it knows
// whether the kernel granted FUSE_PASSTHROUGH on the connection devFD.
func (fs *FS) AllowPassthrough(devFD int, ok bool) {
	fs.passthrough.devFD.Store(int64(devFD))
	fs.passthrough.on.Store(ok && fs.disk != nil && fs.opts.ReadOnly)
}

// passthroughPossible tells whether opens of this mount may be passthrough.
func (fs *FS) passthroughPossible() bool { return fs.passthrough.on.Load() }

// backingMap is struct fuse_backing_map.
type backingMap struct {
	fd      int32
	flags   uint32
	padding uint64
}

// FUSE_DEV_IOC_BACKING_OPEN and _CLOSE: _IOW(229, 1, struct
// fuse_backing_map) and _IOW(229, 2, uint32_t).
const (
	iocBackingOpen  = 0x4010e501
	iocBackingClose = 0x4004e502
)

func openBacking(devFD, fd int) (int32, error) {
	m := backingMap{fd: int32(fd)}
	id, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(devFD), iocBackingOpen, uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return 0, errno
	}
	return int32(id), nil
}

func closeBacking(devFD int, id int32) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(devFD), iocBackingClose, uintptr(unsafe.Pointer(&id)))
	if errno != 0 {
		return errno
	}
	return nil
}

// chooseIOLocked sets the io mode of an open of n (path at version n.etag)
// in out, and counts it on n. out.OpenFlags already holds what the open
// asks for otherwise (FOPEN_DIRECT_IO, FOPEN_KEEP_CACHE).
func (fs *FS) chooseIOLocked(n *node, path string, write bool, out *fuse.OpenOut) journal.IOMode {
	io := &n.io
	switch {
	case io.passthrough > 0:
		// Whatever the version: any other open would fail (EIO).
		return fs.passthroughLocked(n, out)
	case !write && io.cached == 0 && fs.passthroughPossible() && n.etag != "" && n.inStore && fs.sums.Trusted(path, n.etag, n.sum):
		if e := fs.disk.Complete(path, n.etag, n.size); e != nil {
			id, err := openBacking(int(fs.passthrough.devFD.Load()), int(e.File().Fd()))
			if err == nil {
				io.backingID, io.backingETag, io.backing = id, n.etag, e
				return fs.passthroughLocked(n, out)
			}
			fs.disk.Unpin(e)
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
				// Not root, or a kernel without it: for good.
				fs.passthrough.on.Store(false)
				fs.log.Info("FUSE passthrough unavailable: files held whole in the disk cache are read through blobfs", "err", err)
			} else {
				fs.log.Debug("FUSE passthrough refused", "path", path, "err", err)
			}
		}
	}
	if out.OpenFlags&fuse.FOPEN_DIRECT_IO != 0 {
		return journal.IODirect
	}
	io.cached++
	return journal.IOCached
}

func (fs *FS) passthroughLocked(n *node, out *fuse.OpenOut) journal.IOMode {
	n.io.passthrough++
	fs.passthrough.opens.Add(1)
	out.BackingID = n.io.backingID
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_DIRECT_IO
	return journal.IOPassthrough
}

// releaseIOLocked uncounts a released handle; the last passthrough handle
// of a node closes its backing id and unpins its cache file.
func (fs *FS) releaseIOLocked(h *handle) {
	io := &h.n.io
	switch h.io {
	case journal.IOCached:
		io.cached--
	case journal.IOPassthrough:
		io.passthrough--
		if io.passthrough > 0 {
			return
		}
		if dev := fs.passthrough.devFD.Load(); dev >= 0 && io.backingID != 0 {
			if err := closeBacking(int(dev), io.backingID); err != nil {
				fs.log.Debug("FUSE passthrough: closing a backing id", "id", io.backingID, "err", err)
			}
		}
		if io.backing != nil {
			fs.disk.Unpin(io.backing)
		}
		*io = ioOpens{cached: io.cached}
	}
}
