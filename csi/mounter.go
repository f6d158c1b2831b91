package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// Mounter is what the node service needs to put volumes in place. The
// real one (BlobfsMounter) serves blobfs in this process; tests use a fake.
// A later keeper process that holds /dev/fuse across restarts plugs in
// here too.
type Mounter interface {
	// MountVolume mounts the container of spec at target (an existing
	// directory) and serves it. It checks the container and the
	// credentials first: its errors wrap blobstore's sentinels
	// (ErrNotFound, ErrUnauthorized, ...).
	MountVolume(ctx context.Context, target string, spec MountSpec) error
	// UnmountVolume uploads the dirty data of the blobfs mount at target,
	// then unmounts it (detaching it lazily if it is busy). A dead mount
	// or one this process does not serve is detached. Not mounted is
	// success.
	UnmountVolume(ctx context.Context, target string) error
	// BindMount bind-mounts source at target (an existing directory),
	// read-only if asked.
	BindMount(source, target string, readOnly bool) error
	// Unmount removes a bind mount (or a dead mount) at target, lazily if
	// it is busy. Not mounted is success.
	Unmount(target string) error
	// Status says what is at path.
	Status(ctx context.Context, path string) PathStatus
}

// MountSpec is one blobfs mount. It holds credentials: never log or
// persist it.
type MountSpec struct {
	VolumeID string
	Azure    blobstore.AzureConfig
	FS       fusefs.Options
	Mount    fusefs.MountOptions
	Retry    blobstore.RetryPolicy
}

// PathState is what a path holds.
type PathState int

const (
	PathMissing    PathState = iota // nothing there
	PathNotMounted                  // a directory or file, no mount
	PathMounted                     // a mount that answers
	PathCorrupted                   // a mount whose server is gone or hangs
)

func (s PathState) String() string {
	return [...]string{"missing", "not mounted", "mounted", "corrupted"}[s]
}

// PathStatus is a path's state, with the error that made it corrupted.
type PathStatus struct {
	State PathState
	Err   error
}

// BlobfsMounter mounts blobfs in this process: one fusefs.FS and one
// session per mount. mu guards mounts.
//
// Hazard: this process serves the mounts it makes. Anything it does to
// them (stat in Status, the bind mounts, the unmounts) goes through the
// kernel to its own reader goroutines, which is fine from any other
// goroutine but would deadlock from a reader; fusefs also switches off
// kernel poll for the same reason.
type BlobfsMounter struct {
	log          *slog.Logger
	metrics      *Metrics
	checkTimeout time.Duration
	// keeper, if set (UseKeeper), holds every mount's fds so that the
	// mounts outlive this process; see keeper.go.
	keeper *fusefs.KeeperClient

	mu     sync.Mutex
	mounts map[string]*liveMount
}

var _ Mounter = (*BlobfsMounter)(nil)

// liveMount is one mount served here. done is closed once the session has
// ended and the filesystem has uploaded what it could and closed.
type liveMount struct {
	fs   *fusefs.FS
	sess *fusefs.Session
	// state is the mount's state region (nil without a keeper).
	state *os.File
	done  chan struct{}
}

// NewBlobfsMounter returns the in-process mounter. metrics may be nil.
func NewBlobfsMounter(log *slog.Logger, metrics *Metrics) *BlobfsMounter {
	if log == nil {
		log = slog.Default()
	}
	return &BlobfsMounter{log: log, metrics: metrics, checkTimeout: 30 * time.Second, mounts: map[string]*liveMount{}}
}

func (m *BlobfsMounter) MountVolume(ctx context.Context, target string, spec MountSpec) error {
	m.mu.Lock()
	_, busy := m.mounts[target]
	m.mu.Unlock()
	if busy {
		return fmt.Errorf("%s is already served by this driver", target)
	}
	store, err := m.openStore(spec)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, m.checkTimeout)
	err = store.Check(cctx)
	cancel()
	if err != nil {
		return err
	}
	var state *os.File
	if m.keeper != nil {
		if state, err = fusefs.NewState(); err != nil {
			return err
		}
	}
	lm, err := m.serve(target, -1, state, store, spec)
	if err != nil {
		if state != nil {
			state.Close()
		}
		return err
	}
	if m.keeper != nil {
		m.hold(target, lm, spec)
	}
	return nil
}

func (m *BlobfsMounter) openStore(spec MountSpec) (blobstore.Store, error) {
	az, err := blobstore.NewAzure(spec.Azure)
	if err != nil {
		return nil, err
	}
	store := blobstore.NewLogged(az, m.log.With("volume", spec.VolumeID))
	if m.metrics != nil {
		store = m.metrics.instrumentStore(store)
	}
	return blobstore.NewRetrying(store, spec.Retry), nil
}

// serve mounts spec at target and serves it (fuseFD < 0), or serves the
// live mount on fuseFD whose state region is state (adoption).
func (m *BlobfsMounter) serve(target string, fuseFD int, state *os.File, store blobstore.Store, spec MountSpec) (*liveMount, error) {
	opts := spec.FS
	if opts.Logger == nil {
		opts.Logger = m.log.With("volume", spec.VolumeID)
	}
	opts.State = state
	fsys, err := fusefs.New(store, opts)
	if err != nil {
		return nil, err
	}
	mo := spec.Mount
	mo.ReadOnly = mo.ReadOnly || opts.ReadOnly
	if mo.FsName == "" {
		mo.FsName = "blobfs:" + spec.Azure.Container
	}
	if mo.Logger == nil {
		mo.Logger = opts.Logger
	}
	var served fuse.RawFileSystem = fsys
	if m.metrics != nil {
		served = instrumentedFS{FS: fsys, m: m.metrics}
		m.metrics.trackFS(fsys)
	}
	var sess *fusefs.Session
	if fuseFD < 0 {
		sess, err = fusefs.Mount(target, served, mo)
	} else {
		sess, err = fusefs.Serve(target, fuseFD, served, mo)
	}
	if err != nil {
		if m.metrics != nil {
			m.metrics.untrackFS(fsys)
		}
		fsys.Close()
		return nil, err
	}
	lm := &liveMount{fs: fsys, sess: sess, state: state, done: make(chan struct{})}
	m.mu.Lock()
	m.mounts[target] = lm
	m.mu.Unlock()
	go m.watch(target, lm)
	return lm, nil
}

// watch waits for a mount to end, however it ends (UnmountVolume, an
// unmount from outside), then uploads what is left and closes the
// filesystem.
//
// A session stopped to hand the mount to another process (released) is not
// synced: its dirty files' spill data passes, through the state region, to
// the process that adopts it, and uploading here would race with it.
func (m *BlobfsMounter) watch(target string, lm *liveMount) {
	if err := lm.sess.Wait(); err != nil {
		m.log.Warn("blobfs session ended with an error", "mountpoint", target, "err", err)
	}
	if !lm.sess.Stopped() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if err := lm.fs.Sync(ctx); err != nil {
			m.log.Error("upload after unmount failed; data kept in the cache directory", "mountpoint", target, "err", err)
		}
		cancel()
		if m.keeper != nil {
			if err := m.keeper.Drop(target); err != nil {
				m.log.Warn("keeper: drop", "mountpoint", target, "err", err)
			}
		}
	}
	lm.fs.Close()
	if lm.state != nil {
		lm.state.Close()
	}
	if m.metrics != nil {
		m.metrics.untrackFS(lm.fs)
	}
	m.mu.Lock()
	if m.mounts[target] == lm {
		delete(m.mounts, target)
	}
	m.mu.Unlock()
	close(lm.done)
}

func (m *BlobfsMounter) UnmountVolume(ctx context.Context, target string) error {
	m.mu.Lock()
	lm := m.mounts[target]
	m.mu.Unlock()
	if lm == nil {
		// Not ours (a dead mount left by an earlier process) or nothing.
		return m.Unmount(target)
	}
	if err := lm.fs.Sync(ctx); err != nil {
		return fmt.Errorf("upload dirty data before unmount: %w", err)
	}
	err := fusefs.Unmount(target, false)
	switch {
	case errors.Is(err, unix.EBUSY):
		// A process still has a file open: detach now, serve it until it
		// lets go (watch uploads what it writes meanwhile).
		m.log.Warn("mount busy; detaching lazily", "mountpoint", target)
		if err := fusefs.Unmount(target, true); err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		return nil
	case errors.Is(err, unix.EINVAL):
		// Already unmounted from outside; watch is finishing.
	case err != nil:
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	select {
	case <-lm.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("unmount %s: waiting for the filesystem to finish: %w", target, ctx.Err())
	}
}

func (m *BlobfsMounter) BindMount(source, target string, readOnly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", source, target, err)
	}
	if readOnly {
		// A bind mount takes read-only only on a remount; keep nosuid and
		// nodev, which the blobfs mount has.
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			unix.Unmount(target, unix.MNT_DETACH)
			return fmt.Errorf("remount %s read-only: %w", target, err)
		}
	}
	return nil
}

func (m *BlobfsMounter) Unmount(target string) error {
	err := unix.Unmount(target, 0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// statTimeout bounds the stat that tells a live mount from a hung one.
const statTimeout = 5 * time.Second

func (m *BlobfsMounter) Status(ctx context.Context, path string) PathStatus {
	return pathStatus(ctx, path)
}

// pathStatus looks a path up in the mount table first (which never
// touches a mount) and only then stats it, with a timeout, so that a hung
// mount cannot hang the caller.
func pathStatus(ctx context.Context, path string) PathStatus {
	mounted, err := isMountPoint(path)
	if err != nil {
		return PathStatus{State: PathCorrupted, Err: err}
	}
	if !mounted {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return PathStatus{State: PathMissing}
		} else if err != nil && mountutils.IsCorruptedMnt(err) {
			return PathStatus{State: PathCorrupted, Err: err}
		}
		return PathStatus{State: PathNotMounted}
	}
	errc := make(chan error, 1)
	go func() {
		// statfs, not stat: a FUSE filesystem's statfs always asks
		// its server, so a dead one answers ENOTCONN, while stat of a
		// dead mount's root succeeds from attributes the kernel still
		// holds (until the attribute timeout): a driver restarted
		// within that second saw the dead staging mount as mounted
		// and bind-mounted it for a new pod (TestKeeperAndDriverKilled
		// failed so under load).
		var st unix.Statfs_t
		errc <- unix.Statfs(path, &st)
	}()
	t := time.NewTimer(statTimeout)
	defer t.Stop()
	select {
	case err := <-errc:
		if err == nil {
			return PathStatus{State: PathMounted}
		}
		if mountutils.IsCorruptedMnt(err) {
			return PathStatus{State: PathCorrupted, Err: err}
		}
		return PathStatus{State: PathCorrupted, Err: err}
	case <-t.C:
		return PathStatus{State: PathCorrupted, Err: fmt.Errorf("mount at %s does not answer within %v", path, statTimeout)}
	case <-ctx.Done():
		return PathStatus{State: PathCorrupted, Err: ctx.Err()}
	}
}

// isMountPoint tells whether path is a mount point, from
// /proc/self/mountinfo.
func isMountPoint(path string) (bool, error) {
	infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mount table: %w", err)
	}
	path = filepath.Clean(path)
	for _, mi := range infos {
		if mi.MountPoint == path {
			return true, nil
		}
	}
	return false, nil
}

// SyncAll uploads the dirty data of every mount served here: on shutdown,
// before the mounts lose their server.
func (m *BlobfsMounter) SyncAll(ctx context.Context) error {
	if m.keeper != nil && m.keeper.Released() {
		return nil // another process serves them now
	}
	m.mu.Lock()
	var live []*liveMount
	for _, lm := range m.mounts {
		live = append(live, lm)
	}
	m.mu.Unlock()
	var errs []error
	for _, lm := range live {
		if err := lm.fs.Sync(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
