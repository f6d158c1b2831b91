package kernel

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/blobfs/blobfs/fusefs/memory"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A Session serves one FUSE mount: it owns the /dev/fuse file descriptor and
// runs the read loop that feeds requests to the filesystem.
//
// blobfs serves /dev/fuse itself, through go-fuse's ProtocolServer, instead
// of go-fuse's fuse.Server: a restarted process must be able to adopt the fd
// of a live mount (kept by another process) and serve it, and fuse.Server
// can only serve mounts it made. ProtocolServer is marked EXPERIMENTAL in
// go-fuse, so go.mod pins go-fuse and this file is the only user of it.
//
// Speed: each reader goroutine reuses one request and one reply buffer and
// handles its request inline; several readers run at once so that a slow
// store request does not stall the mount. A fresh buffer or goroutine per
// request costs most of the throughput (measured: 0.6-0.9 GB/s against
// 2.4-2.6 GB/s with reused buffers).
//
// Hazard: the serving process must never touch its own mount from a reader
// goroutine (stat, open...): the request would wait for a reader that is
// busy waiting for it.
//
// Stopping: a mount handed to another process (a keeper's adopter) must
// stop being read here between two requests, never in the middle of one:
// a request read and not answered would wait for FUSE_NOTIFY_RESEND. So
// /dev/fuse is non-blocking, and an idle reader waits in poll(2) on it and
// on an eventfd that Stop signals; a busy reader finishes its request and
// then sees the stop.
type Session struct {
	mountpoint string
	fd         int
	fs         fuse.RawFileSystem
	server     *fuse.ProtocolServer
	opts       MountOptions
	// initRequest holds the raw bytes of the kernel's INIT request, which a
	// process adopting this mount replays into its own ProtocolServer.
	initRequest []byte

	// stopFD is an eventfd, readable once Stop was called.
	stopFD   int
	stopping atomic.Bool

	readers sync.WaitGroup
	mu      sync.Mutex
	err     error // first fatal read error; guarded by mu
	stopped bool  // the readers ended because of Stop; guarded by mu
}

// MountOptions configure the FUSE connection.
type MountOptions struct {
	// FsName is shown as the source in /proc/mounts, e.g. "blobfs:container".
	FsName string
	// AllowOther lets other users than the mounting one use the mount.
	AllowOther bool
	// ReadOnly mounts read-only in the kernel as well.
	ReadOnly bool
	// Readers is the number of goroutines reading /dev/fuse. Default 8.
	Readers int
	// MaxWrite is the largest READ or WRITE the kernel sends. Default 1 MiB.
	MaxWrite int
	// ReadAheadKB sets the kernel's read-ahead for the mount. The kernel's
	// own default (128 KiB) keeps one small READ in flight and caps a
	// sequential read far below what the store can give; a larger window
	// lets the kernel send 1 MiB READs several at a time. Default 4096;
	// negative leaves the kernel's default.
	ReadAheadKB int
	// Debug logs every request and reply through Logger.
	Debug  bool
	Logger *slog.Logger `json:"-"`
	// OnInit, if set, receives the kernel's INIT request before it is
	// answered (FS.SaveInit keeps it in the state region for adoption).
	OnInit func(init []byte) error `json:"-"`
}

const (
	defaultReaders  = 8
	defaultMaxWrite = 1 << 20
	// A request is a header plus at most MaxWrite bytes of payload; the
	// kernel wants room for at least one whole request.
	requestSlack = 4096
)

// Mount mounts fs at mountpoint and starts serving it. It returns once the
// kernel has completed the INIT handshake, so the mount is usable.
func (opts MountOptions) withDefaults() MountOptions {
	if opts.Readers <= 0 {
		opts.Readers = defaultReaders
	}
	if opts.MaxWrite <= 0 {
		opts.MaxWrite = defaultMaxWrite
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.FsName == "" {
		opts.FsName = "blobfs"
	}
	if opts.ReadAheadKB == 0 {
		opts.ReadAheadKB = 4096
	}
	return opts
}

func Mount(mountpoint string, fs fuse.RawFileSystem, opts MountOptions) (*Session, error) {
	opts = opts.withDefaults()
	mp, fd, err := MountFD(mountpoint, opts)
	if err != nil {
		return nil, err
	}
	s, err := Serve(mp, fd, fs, opts)
	if err != nil {
		unmount(mp, true)
		syscall.Close(fd)
		return nil, err
	}
	return s, nil
}

// MountFD mounts a FUSE filesystem at mountpoint and returns the absolute
// mountpoint and the /dev/fuse descriptor, without serving it: the kernel's
// INIT waits on the descriptor for whoever serves it (Serve). A supervisor
// mounts this way and hands the descriptor to a worker it can restart.
func MountFD(mountpoint string, opts MountOptions) (string, int, error) {
	opts = opts.withDefaults()
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", -1, err
	}
	st, err := os.Stat(mp)
	if err != nil {
		return "", -1, fmt.Errorf("mountpoint: %w", err)
	}
	if !st.IsDir() {
		return "", -1, fmt.Errorf("mountpoint %s is not a directory", mp)
	}
	fd, err := mountFUSE(mp, opts)
	if err != nil {
		return "", -1, fmt.Errorf("mount %s: %w", mp, err)
	}
	return mp, fd, nil
}

// MountAt is Mount onto dir, an open directory (O_PATH is enough),
// instead of onto a path: the kernel mounts on the very directory dir
// refers to (through /proc/self/fd), so a path component swapped for a
// symlink after dir was opened cannot redirect the mount elsewhere. The
// CSI node mounts so on the paths kubelet names. dir.Name() is taken as
// the mount point's path for what follows the mount (its unmount, the
// poll and read-ahead set-up). Root only: fusermount3 takes a path.
func MountAt(dir *os.File, fs fuse.RawFileSystem, opts MountOptions) (*Session, error) {
	opts = opts.withDefaults()
	if os.Geteuid() != 0 {
		return nil, errors.New("mounting onto an open directory needs root")
	}
	mp := dir.Name()
	fd, err := mountFUSE(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()), opts)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mp, err)
	}
	s, err := Serve(mp, fd, fs, opts)
	if err != nil {
		// By path: the mount is on dir, but umount2 takes a path (a
		// caller that must not follow one unmounts itself on error).
		unmount(mp, true)
		syscall.Close(fd)
		return nil, err
	}
	return s, nil
}

// Serve starts serving a mount made by MountFD: it answers INIT (the mount
// is usable when Serve returns) and starts the readers. If fs was restored
// from a state region (FS.AdoptInit), the mount is live already and Serve
// adopts it instead.
func Serve(mountpoint string, fd int, fs fuse.RawFileSystem, opts MountOptions) (*Session, error) {
	opts = opts.withDefaults()
	if a, ok := fs.(interface{ AdoptInit() []byte }); ok && a.AdoptInit() != nil {
		return Adopt(mountpoint, fd, a.AdoptInit(), fs, opts)
	}
	if saver, ok := fs.(interface{ SaveInit([]byte) error }); ok && opts.OnInit == nil {
		opts.OnInit = saver.SaveInit
	}
	s, err := newSession(mountpoint, fd, fs, opts)
	if err != nil {
		return nil, err
	}
	if err := s.handshake(); err != nil {
		s.closeStopFD()
		return nil, err
	}
	for range opts.Readers {
		s.readers.Add(1)
		go s.serve()
	}
	if err := disableKernelPoll(mountpoint); err != nil {
		opts.Logger.Warn("could not switch off FUSE poll", "err", err)
	}
	if opts.ReadAheadKB > 0 {
		if err := setReadAhead(mountpoint, opts.ReadAheadKB); err != nil {
			opts.Logger.Debug("could not set the kernel read-ahead", "err", err)
		}
	}
	return s, nil
}

// disableKernelPoll makes the kernel send one FUSE_POLL, which the
// ProtocolServer answers with ENOSYS, so that the kernel never polls this
// mount again. Without it, Go's runtime registering a file of this mount
// with its netpoller (epoll_ctl, done without releasing its P) sends a POLL
// that can only be answered by a goroutine of this same process, which may
// need that P: the process deadlocks. It matters whenever the serving
// process opens files on its own mount (tests, health checks). The setting
// belongs to the connection, so an adopted mount keeps it.
func disableKernelPoll(mountpoint string) error {
	// go-fuse answers every request for this reserved name itself.
	const pollHackName = ".go-fuse-epoll-hack"
	fd, err := unix.Open(filepath.Join(mountpoint, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}
	_, err = unix.Poll(pfd, 0)
	return err
}

// setReadAhead writes the mount's backing-device read-ahead in sysfs
// (root only; unprivileged mounts keep the kernel's default).
func setReadAhead(mountpoint string, kb int) error {
	var st unix.Stat_t
	if err := unix.Stat(mountpoint, &st); err != nil {
		return err
	}
	path := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(path, []byte(fmt.Sprint(kb)), 0)
}

func newSession(mp string, fd int, fs fuse.RawFileSystem, opts MountOptions) (*Session, error) {
	// O_NONBLOCK belongs to the open file, which every process holding a
	// dup of the fd shares: all blobfs servers read it this way.
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("/dev/fuse non-blocking: %w", err)
	}
	stopFD, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	s := &Session{mountpoint: mp, fd: fd, fs: fs, opts: opts, stopFD: stopFD}
	s.server = fuse.NewProtocolServer(fs, &fuse.MountOptions{
		MaxWrite:      opts.MaxWrite,
		MaxBackground: 64,
		// DIRECT_IO_ALLOW_MMAP lets a file opened with FOPEN_DIRECT_IO
		// be mapped shared (see Options.DirectReadMinBytes); granted
		// by Linux >= 6.6. READDIRPLUS_AUTO (libfuse's default) has the
		// kernel send READDIRPLUS for a directory's first getdents and
		// after lookups in it (ls -l), READDIR otherwise: each entry of
		// a READDIRPLUS is a node here and an inode in the kernel
		// (about 340 bytes here), which `ls -f` and find, that need
		// names only, should not cost for every name of a large tree.
		ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP | fuse.CAP_READDIRPLUS_AUTO,
		Debug:             opts.Debug,
		Logger:            log.New(logWriter{opts.Logger}, "", 0),
	})
	return s, nil
}

// Adopt serves a live mount whose previous server died or handed over: fd
// is the mount's /dev/fuse descriptor (kept by a keeper), init the INIT
// request saved when it was mounted, and fs a filesystem restored from the
// mount's state region.
//
// The saved INIT is replayed into the new ProtocolServer so that it
// negotiates what the kernel already agreed to (the reply is discarded: the
// kernel got one long ago). Then, if the kernel supports it, FUSE_NOTIFY_RESEND
// asks it to queue again every request the dead process had read and not
// answered; without it, such a request would wait forever.
func Adopt(mountpoint string, fd int, init []byte, fs fuse.RawFileSystem, opts MountOptions) (*Session, error) {
	opts = opts.withDefaults()
	if len(init) < 40+20 || leUint32(init[4:8]) != 26 {
		return nil, errors.New("adopt: the saved INIT request is not one")
	}
	s, err := newSession(mountpoint, fd, fs, opts)
	if err != nil {
		return nil, err
	}
	// Only a server that asked for FUSE_DIRECT_IO_ALLOW_MMAP marked the
	// INIT it saved; the kernel granted it if it offered it.
	marked := len(init) > len(allowMmapMark) && string(init[len(init)-len(allowMmapMark):]) == allowMmapMark
	if marked {
		init = init[:len(init)-len(allowMmapMark)]
	}
	s.allowDirectIO(marked && kernelOffers(init, fuse.CAP_DIRECT_IO_ALLOW_MMAP))
	s.allowPassthrough(kernelOffers(init, fuse.CAP_PASSTHROUGH))
	s.initRequest = append([]byte(nil), init...)
	scratch := make([]byte, 4096)
	if _, st := s.server.HandleRequest([][]byte{append([]byte(nil), init...)}, [][]byte{scratch}); !st.Ok() {
		s.closeStopFD()
		return nil, fmt.Errorf("adopt: replay INIT: %v", st)
	}
	if kernelHasResend(init) {
		if err := s.notifyResend(); err != nil {
			opts.Logger.Warn("FUSE_NOTIFY_RESEND failed; requests taken by the previous server may hang", "err", err)
		}
	} else {
		opts.Logger.Warn("kernel lacks FUSE_NOTIFY_RESEND (Linux < 6.9): a request the previous server had taken and not answered will not complete")
	}
	for range opts.Readers {
		s.readers.Add(1)
		go s.serve()
	}
	return s, nil
}

// allowMmapMark follows the INIT request that Serve hands to
// MountOptions.OnInit (the copy kept for adoption): it records that this
// server asked for FUSE_DIRECT_IO_ALLOW_MMAP. An adopter that finds no mark
// (the mount was answered by an older blobfs, whose kernel connection has
// no such grant) must not open files with FOPEN_DIRECT_IO: a shared mmap
// of them would fail with ENODEV.
const allowMmapMark = "\x00blobfs:direct-io-allow-mmap"

// allowDirectIO tells the filesystem, if it cares, whether the kernel
// connection lets FOPEN_DIRECT_IO files be mapped shared.
func (s *Session) allowDirectIO(ok bool) {
	if d, isFS := s.fs.(DirectIOAware); isFS {
		d.AllowDirectIOMmap(ok)
	}
}

// allowPassthrough tells the filesystem, if it cares, whether the kernel
// offered FUSE_PASSTHROUGH, which go-fuse's INIT reply always takes (with
// a stack depth of 1), and the connection's descriptor for its ioctls.
func (s *Session) allowPassthrough(ok bool) {
	if p, isFS := s.fs.(PassthroughAware); isFS {
		p.AllowPassthrough(s.fd, ok)
	}
}

// kernelOffers reads a capability bit from a raw INIT request: in_header
// (40 bytes), then major, minor, max_readahead, flags (bits 0-31), flags2
// (bits 32-63).
func kernelOffers(init []byte, flag uint64) bool {
	const flagsOff, flags2Off = 40 + 12, 40 + 16
	if len(init) < flags2Off+4 {
		return false
	}
	return (uint64(leUint32(init[flagsOff:]))|uint64(leUint32(init[flags2Off:]))<<32)&flag != 0
}

// kernelHasResend reads FUSE_HAS_RESEND (flags bit 39, i.e. bit 7 of
// flags2) from a raw INIT request: in_header (40 bytes), then major, minor,
// max_readahead, flags, flags2.
func kernelHasResend(init []byte) bool {
	const flags2Off = 40 + 16
	if len(init) < flags2Off+4 {
		return false
	}
	return leUint32(init[flags2Off:])&(1<<(39-32)) != 0
}

// notifyResend writes FUSE_NOTIFY_RESEND: an out header with unique 0 and
// the notify code (7) in the error field, and no body.
func (s *Session) notifyResend() error {
	const notifyResend = 7
	var msg [16]byte
	putLeUint32(msg[0:], 16)
	putLeUint32(msg[4:], notifyResend)
	_, err := syscall.Write(s.fd, msg[:])
	return err
}

func putLeUint32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// Fd returns the mount's /dev/fuse descriptor, to hand to a keeper.
func (s *Session) Fd() int { return s.fd }

// Mountpoint returns the absolute path served.
func (s *Session) Mountpoint() string { return s.mountpoint }

// InitRequest returns a copy of the kernel's INIT request.
func (s *Session) InitRequest() []byte { return append([]byte(nil), s.initRequest...) }

// handshake answers the kernel's first request, INIT.
func (s *Session) handshake() error {
	in := make([]byte, s.opts.MaxWrite+requestSlack)
	out := make([]byte, s.opts.MaxWrite+requestSlack)
	w, err := s.newWaiter()
	if err != nil {
		return err
	}
	defer w.close()
	for {
		n, err := s.readRequest(w, in)
		if err == syscall.EINTR || err == syscall.ENOENT {
			continue
		}
		if err != nil {
			return fmt.Errorf("read INIT: %w", err)
		}
		const opInit = 26
		if n < 40 || leUint32(in[4:8]) != opInit {
			return fmt.Errorf("first FUSE request is opcode %d, not INIT", leUint32(in[4:8]))
		}
		s.initRequest = append([]byte(nil), in[:n]...)
		if s.opts.OnInit != nil {
			saved := append(append([]byte(nil), s.initRequest...), allowMmapMark...)
			if err := s.opts.OnInit(saved); err != nil {
				return fmt.Errorf("save INIT: %w", err)
			}
		}
		s.allowDirectIO(kernelOffers(s.initRequest, fuse.CAP_DIRECT_IO_ALLOW_MMAP))
		s.allowPassthrough(kernelOffers(s.initRequest, fuse.CAP_PASSTHROUGH))
		return s.reply(in[:n], out, nil)
	}
}

// opInterrupt is FUSE_INTERRUPT's opcode.
const opInterrupt = 36

// refuseInterrupt answers a FUSE_INTERRUPT with ENOSYS, which makes the
// kernel send no more for this connection (fc->no_interrupt), also to a
// process that adopts it later: blobfs runs every request to its end (see
// FS.reqContext), so an interrupt would only cost a request.
func (s *Session) refuseInterrupt(req []byte) error {
	var msg [16]byte
	putLeUint32(msg[0:], 16)
	errno := -int32(syscall.ENOSYS)
	putLeUint32(msg[4:], uint32(errno))
	copy(msg[8:16], req[8:16]) // the interrupt's own unique
	// No error here ends the session: ENOENT means the interrupted
	// request was answered first, and the kernel will ask again with the
	// next interrupt; any other costs no more than that.
	if _, err := syscall.Write(s.fd, msg[:]); err != nil {
		s.opts.Logger.Debug("FUSE_INTERRUPT refusal not taken", "err", err)
	} else {
		s.opts.Logger.Debug("FUSE_INTERRUPT refused: the kernel sends no more")
	}
	return nil
}

func leUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// reply handles one request and writes the answer, if any. slot, when not
// nil, is out's reply slot: a READ answered from the block cache leaves its
// bytes there (pinnedRange.Readv), and they are written from the cache's
// blocks after the header in out.
func (s *Session) reply(req, out []byte, slot *replySlot) error {
	if len(req) >= 16 && leUint32(req[4:8]) == opInterrupt {
		if fs, ok := s.fs.(Interrupter); ok && len(req) >= 48 {
			// Watched, not answered (fusefs/callerdeath.go).
			fs.Interrupt(uint64(leUint32(req[40:44])) | uint64(leUint32(req[44:48]))<<32)
			return nil
		}
		return s.refuseInterrupt(req)
	}
	n, st := s.server.HandleRequest([][]byte{req}, [][]byte{out})
	var iov [][]byte
	if slot != nil && slot.pending != nil {
		r := slot.pending
		slot.pending = nil
		defer r.Release()
		if hdr := n - len(r.Data()); st.Ok() && hdr >= 0 {
			zeroCopyReplies.Add(1)
			slot.iov = [2][]byte{out[:hdr], r.Data()}
			iov = slot.iov[:]
			defer func() { slot.iov = [2][]byte{} }()
		} else {
			st = fuse.EIO
		}
	}
	if !st.Ok() {
		return fmt.Errorf("handle request: %v", st)
	}
	if n == 0 {
		return nil // FORGET and friends have no reply
	}
	for {
		var err error
		if iov != nil {
			// One write: /dev/fuse takes a reply whole or not at all.
			_, err = unix.Writev(s.fd, iov)
		} else {
			_, err = syscall.Write(s.fd, out[:n])
		}
		switch err {
		case nil, syscall.ENOENT:
			// ENOENT: the request was interrupted and is gone.
			return nil
		case syscall.EINTR:
			continue
		default:
			return fmt.Errorf("write reply: %w", err)
		}
	}
}

// serve is one reader: read a request, handle it, write the reply, with
// buffers reused for the reader's lifetime.
func (s *Session) serve() {
	defer s.readers.Done()
	in := make([]byte, s.opts.MaxWrite+requestSlack)
	out := make([]byte, s.opts.MaxWrite+requestSlack)
	// Make the request buffer resident now: the kernel copies a request
	// into it during read(2), and if a page must be faulted in while this
	// process is being killed, the copy fails and the kernel ends the
	// request with EIO instead of leaving it for the next server (seen
	// with SIGKILL under load; costs ~1 MiB per reader).
	for i := 0; i < len(in); i += 4096 {
		in[i] = 0xff
	}
	w, err := s.newWaiter()
	if err != nil {
		s.fail(err)
		return
	}
	defer w.close()
	slot := newReplySlot(out)
	defer slot.close()
	for {
		n, err := s.readRequest(w, in)
		switch err {
		case nil:
		case syscall.EINTR, syscall.ENOENT:
			// ENOENT: the request we were about to read was interrupted.
			continue
		case syscall.ENODEV, errStopped:
			return // unmounted, or handed to another process
		case syscall.ECONNABORTED:
			// The connection was aborted: through fusectl, or by the
			// kernel while an unmount tore it down (seen once on
			// 6.18 right after a lazy unmount, where ENODEV is the
			// rule). Either way the mount is over, as with ENODEV.
			s.opts.Logger.Info("FUSE connection aborted", "mountpoint", s.mountpoint)
			return
		default:
			s.fail(fmt.Errorf("read /dev/fuse: %w", err))
			return
		}
		if err := s.reply(in[:n], out, slot); err != nil {
			if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ECONNABORTED) {
				return
			}
			s.opts.Logger.Warn("fuse reply failed", "err", err)
		}
	}
}

// A replySlot lets a READ's answer skip the copy into a reader's reply
// buffer: cachedRead.Readv, given the buffer's payload area by go-fuse's
// ProtocolServer, finds the reader's slot by that address and leaves the
// pinned range there; the reader writes the reply with writev from the
// cache's blocks and releases them. Sequential reads through the block
// cache copied every byte once more than needed (3.8% of all CPU of a
// 1 GiB read from Azurite, perf).
type replySlot struct {
	key     uintptr
	pending Pinned    // set by Readv, taken by Session.reply
	iov     [2][]byte // the writev's header and data
}

// Pinned is bytes held for a READ's reply (a block of a cache, pinned)
// until Release.
type Pinned interface {
	Data() []byte
	Release()
}

// ZeroCopyRead answers a READ with p's bytes: written to the kernel
// straight from them when the session reading the request offers a reply
// slot (see Readv), else copied; p is released once the reply is written.
func ZeroCopyRead(p Pinned) fuse.ReadResult { return &cachedRead{r: p} }

// cachedRead is ZeroCopyRead's fuse.ReadResult.
type cachedRead struct {
	r Pinned
	// handedOff: Readv gave the range to a session's reply slot, which
	// releases it once written; Done must not.
	handedOff bool
}

func (c *cachedRead) Size() int { return len(c.r.Data()) }

func (c *cachedRead) Bytes(buf []byte) ([]byte, fuse.Status) {
	data := c.r.Data()
	if len(buf) < len(data) {
		buf = make([]byte, len(data))
	}
	return buf[:copy(buf, data)], fuse.OK
}

// Readv is how go-fuse's ProtocolServer asks for a READ's bytes: dst is
// the payload area of the reply buffer. When that buffer is a session
// reader's with a reply slot, the range is handed to the slot and nothing
// is copied: the reader writes the header and the data with one writev.
func (c *cachedRead) Readv(dst [][]byte) (int, fuse.Status) {
	data := c.r.Data()
	if len(dst) == 1 && len(dst[0]) >= len(data) && len(data) > 0 {
		if slot := replySlotAt(dst[0]); slot != nil && slot.pending == nil {
			slot.pending = c.r
			c.handedOff = true
			return len(data), fuse.OK
		}
	}
	done := 0
	for _, d := range dst {
		done += copy(d, data[done:])
	}
	return done, fuse.OK
}

func (c *cachedRead) Done() {
	if !c.handedOff {
		c.r.Release()
	}
}

// replySlots maps the payload address of each reader's reply buffer to its
// slot. A reader handles one request at a time, so a slot has at most one
// range pending, set and taken on the reader's goroutine.
var replySlots sync.Map // uintptr -> *replySlot

// zeroCopyReplies counts READ replies written from pinned bytes.
var zeroCopyReplies atomic.Uint64

// ZeroCopyReplies counts the READ replies the process wrote straight from
// pinned bytes, without a copy into a reply buffer.
func ZeroCopyReplies() uint64 { return zeroCopyReplies.Load() }

// replyPayloadOffset is where a READ reply's data starts in the reply
// buffer: after the fuse_out_header, READ having no other out struct.
const replyPayloadOffset = 16

func newReplySlot(out []byte) *replySlot {
	slot := &replySlot{key: memory.Base(out[replyPayloadOffset:])}
	replySlots.Store(slot.key, slot)
	return slot
}

func (slot *replySlot) close() {
	replySlots.Delete(slot.key)
	if slot.pending != nil {
		slot.pending.Release()
		slot.pending = nil
	}
}

// replySlotAt returns the reply slot whose payload area starts at p, if
// any.
func replySlotAt(p []byte) *replySlot {
	if len(p) == 0 {
		return nil
	}
	v, ok := replySlots.Load(memory.Base(p))
	if !ok {
		return nil
	}
	return v.(*replySlot)
}

// errStopped tells a reader that Stop was called.
var errStopped = errors.New("session stopped")

// A waiter is one reader's epoll instance. The /dev/fuse fd is registered
// with EPOLLEXCLUSIVE, so that a request wakes one idle reader, not all of
// them (with poll(2), every request woke every idle reader, and all but one
// went back to sleep).
// The stop eventfd is registered without it: Stop wakes every reader.
type waiter struct {
	epfd   int
	events [2]unix.EpollEvent
}

func (s *Session) newWaiter() (*waiter, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	dev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(s.fd)}
	stop := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(s.stopFD)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, s.fd, &dev); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll /dev/fuse: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, s.stopFD, &stop); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("epoll stop eventfd: %w", err)
	}
	return &waiter{epfd: epfd}, nil
}

func (w *waiter) close() { unix.Close(w.epfd) }

// readRequest reads one request, waiting in epoll_wait(2) while there is
// none. It returns errStopped, without reading, once Stop was called.
func (s *Session) readRequest(w *waiter, buf []byte) (int, error) {
	for {
		if s.stopping.Load() {
			return 0, errStopped
		}
		n, err := syscall.Read(s.fd, buf)
		if err != syscall.EAGAIN {
			return n, err
		}
		k, err := unix.EpollWait(w.epfd, w.events[:], -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("epoll_wait /dev/fuse: %w", err)
		}
		for _, ev := range w.events[:k] {
			if ev.Fd == int32(s.fd) && ev.Events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 && ev.Events&unix.EPOLLIN == 0 {
				// The connection is gone (unmounted and aborted);
				// the read says how.
				if n, err := syscall.Read(s.fd, buf); err != syscall.EAGAIN {
					return n, err
				}
				return 0, syscall.ENODEV
			}
		}
	}
}

// Stop makes the readers stop between requests: every request already read
// is answered, no other is read. It returns once they have stopped; the
// mount stays alive for whoever else holds its fd (a keeper, an adopter),
// and Wait returns nil. Used to hand a live mount to another process.
func (s *Session) Stop() {
	if s.stopping.CompareAndSwap(false, true) {
		// Under mu: Wait closes stopFD once the readers are gone, which
		// they may be already (they also check stopping).
		s.mu.Lock()
		s.stopped = true
		if s.stopFD >= 0 {
			var one [8]byte
			one[0] = 1
			unix.Write(s.stopFD, one[:])
		}
		s.mu.Unlock()
	}
	s.readers.Wait()
}

// Stopped tells whether the session ended through Stop rather than an
// unmount.
func (s *Session) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

func (s *Session) closeStopFD() {
	if s.stopFD >= 0 {
		unix.Close(s.stopFD)
		s.stopFD = -1
	}
}

func (s *Session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// Wait blocks until the mount is gone (unmounted by anyone) and every
// reader has stopped. It returns the first fatal serving error.
func (s *Session) Wait() error {
	s.readers.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd >= 0 {
		syscall.Close(s.fd)
		s.fd = -1
		s.closeStopFD()
	}
	return s.err
}

// Unmount detaches the mount and waits for the readers. With lazy, a busy
// mount is detached from the namespace at once (MNT_DETACH) and goes away
// when its last user does; without, a busy mount fails with EBUSY.
func (s *Session) Unmount(lazy bool) error {
	if err := unmount(s.mountpoint, lazy); err != nil {
		return err
	}
	return s.Wait()
}

// mountFUSE opens /dev/fuse and mounts it: with mount(2) as root, through
// the setuid fusermount3 helper otherwise.
func mountFUSE(mountpoint string, opts MountOptions) (int, error) {
	if os.Geteuid() != 0 {
		return fusermountMount(mountpoint, opts)
	}
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/fuse: %w", err)
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		"rootmode=40000",
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", opts.MaxWrite),
		// The kernel checks permissions against the mode bits blobfs
		// reports; blobfs does not check them again.
		"default_permissions",
	}
	if opts.AllowOther {
		data = append(data, "allow_other")
	}
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV)
	if opts.ReadOnly {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount(opts.FsName, mountpoint, "fuse.blobfs", flags, strings.Join(data, ",")); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// fusermountMount asks fusermount3 to mount and receives the /dev/fuse fd
// over a socket (the _FUSE_COMMFD protocol).
func fusermountMount(mountpoint string, opts MountOptions) (int, error) {
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		return -1, errors.New("not root and fusermount3 not found (install fuse3)")
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return -1, err
	}
	local := os.NewFile(uintptr(pair[0]), "fusermount-local")
	remote := os.NewFile(uintptr(pair[1]), "fusermount-remote")
	defer local.Close()
	defer remote.Close()
	o := []string{"fsname=" + opts.FsName, "subtype=blobfs", "default_permissions", fmt.Sprintf("max_read=%d", opts.MaxWrite), "nosuid", "nodev"}
	if opts.AllowOther {
		o = append(o, "allow_other")
	}
	if opts.ReadOnly {
		o = append(o, "ro")
	}
	cmd := exec.Command(bin, "-o", strings.Join(o, ","), "--", mountpoint)
	cmd.Env = []string{"_FUSE_COMMFD=3"}
	cmd.ExtraFiles = []*os.File{remote}
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return -1, fmt.Errorf("fusermount3: %w", err)
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(local.Fd()), buf, oob, 0)
	if err != nil {
		return -1, fmt.Errorf("receive fd from fusermount3: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) == 0 {
		return -1, errors.New("fusermount3 sent no fd")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) == 0 {
		return -1, errors.New("fusermount3 sent no fd")
	}
	unix.CloseOnExec(fds[0])
	return fds[0], nil
}

// unmount detaches a FUSE mount (ours or a dead one).
func unmount(mountpoint string, lazy bool) error {
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = unix.MNT_DETACH
		}
		return unix.Unmount(mountpoint, flags)
	}
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	out, err := exec.Command("fusermount3", append(args, "--", mountpoint)...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, syscall.EBUSY.Error()) {
			// As umount(2) would say it, so that callers can tell.
			return fmt.Errorf("fusermount3 -u: %s: %w", msg, syscall.EBUSY)
		}
		return fmt.Errorf("fusermount3 -u: %v: %s", err, msg)
	}
	return nil
}

// Unmount detaches the FUSE mount at mountpoint, served by this process or
// not; used by `blobfs unmount`.
func Unmount(mountpoint string, lazy bool) error { return unmount(mountpoint, lazy) }

// logWriter takes go-fuse's log lines: every request and reply when
// MountOptions.Debug asked for them, and its rare complaints otherwise.
// Both are logged at info level: --debug-fuse alone must show the
// requests, and the complaints must not hide below the default level.
type logWriter struct{ l *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.l.Info(strings.TrimRight(string(p), "\n"), "component", "go-fuse")
	return len(p), nil
}

// fuseConnections is where the kernel's fusectl file system lists FUSE
// connections, one directory per connection named by its device number.
const fuseConnections = "/sys/fs/fuse/connections"

// AbortConnection aborts the FUSE connection of the file system whose
// device is dev (from stat of its root, e.g. with AT_STATX_DONT_SYNC):
// every request waiting on it fails at once with ECONNABORTED, and new
// ones fail with ENOTCONN, as if its last server had gone.
//
// It is for a mount whose server is gone but whose connection is not: a
// server killed while one of its own threads waited on a request of its
// own file system (a statfs of its mount) cannot finish dying, because
// that thread waits for an answer only it could give and holds the
// descriptor that keeps the connection open. Nothing but an abort frees
// it. Where fusectl is not mounted (a container's /sys), it is mounted
// first.
func AbortConnection(devMajor, devMinor uint32) error {
	if devMajor != 0 {
		return fmt.Errorf("device %d:%d is not a FUSE connection (FUSE devices are anonymous, major 0)", devMajor, devMinor)
	}
	abort := filepath.Join(fuseConnections, strconv.FormatUint(uint64(devMinor), 10), "abort")
	if _, err := os.Stat(fuseConnections + "/."); err == nil {
		if entries, _ := os.ReadDir(fuseConnections); len(entries) == 0 {
			// Empty: fusectl is not mounted here (or no connection
			// exists, and then mounting it changes nothing).
			unix.Mount("fusectl", fuseConnections, "fusectl", 0, "")
		}
	}
	f, err := os.OpenFile(abort, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("abort FUSE connection %d: %w", devMinor, err)
	}
	defer f.Close()
	if _, err := f.WriteString("1"); err != nil {
		return fmt.Errorf("abort FUSE connection %d: %w", devMinor, err)
	}
	return nil
}

// Optional interfaces of a file system a Session serves.
type (
	// DirectIOAware learns whether the kernel connection lets
	// FOPEN_DIRECT_IO files be mapped shared.
	DirectIOAware interface{ AllowDirectIOMmap(ok bool) }
	// PassthroughAware learns whether the kernel offered FUSE_PASSTHROUGH,
	// and the connection's descriptor for its ioctls.
	PassthroughAware interface {
		AllowPassthrough(devFD int, ok bool)
	}
	// Interrupter is handed each FUSE_INTERRUPT (the request's unique)
	// instead of the session refusing it.
	Interrupter interface{ Interrupt(unique uint64) }
)
