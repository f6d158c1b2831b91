package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/fsmetrics"
	"github.com/blobfs/blobfs/fusefs/handoff"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// Mounter is what the node service needs to put volumes in place. The
// real one (BlobfsMounter) serves blobfs in this process; tests use a fake.
// A later keeper process that holds /dev/fuse across restarts plugs in
// here too.
//
// Every path is a *MountPoint, opened below the kubelet directory without
// following symlinks (paths.go): a mounter acts through it, never through
// the path, and keys its tables by MountPoint.Path. No method mounts on
// top of an existing mount.
type Mounter interface {
	// MountVolume mounts the container of spec at target (an existing
	// directory with nothing mounted on it) and serves it. It checks the
	// container and the credentials first: its errors wrap blobstore's
	// sentinels (ErrNotFound, ErrUnauthorized, ...).
	MountVolume(ctx context.Context, target *MountPoint, spec MountSpec) error
	// UnmountVolume uploads the dirty data of the blobfs mount at target,
	// then unmounts it (detaching it lazily if it is busy). A dead mount
	// or one this process does not serve is detached. Not mounted is
	// success.
	UnmountVolume(ctx context.Context, target *MountPoint) error
	// BindMount bind-mounts the mount at source at target (an existing
	// directory with nothing mounted on it), read-only if asked.
	BindMount(source, target *MountPoint, readOnly bool) error
	// Unmount removes a bind mount (or a dead mount) at target, lazily if
	// it is busy. Not mounted is success.
	Unmount(target *MountPoint) error
	// Status says what is at target.
	Status(ctx context.Context, target *MountPoint) PathStatus
}

// MountSpec is one blobfs mount. It holds credentials: never log or
// persist it.
type MountSpec struct {
	VolumeID string
	Azure    blobstore.AzureConfig
	FS       fusefs.Options
	Mount    kernel.MountOptions
	Retry    blobstore.RetryPolicy
}

// PathState is what a path holds.
type PathState int

const (
	PathMissing    PathState = iota // nothing there
	PathNotMounted                  // a directory or file, no mount
	PathMounted                     // a mount that answers
	PathCorrupted                   // a mount whose server is gone or hangs
	PathSymlink                     // a symlink: never followed, never mounted on
)

func (s PathState) String() string {
	return [...]string{"missing", "not mounted", "mounted", "corrupted", "symlink"}[s]
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
	keeper *handoff.Client
	// diskCache, if set, is shared by every volume (Config.DiskCache).
	diskCache *cache.DiskCache

	mu     sync.Mutex
	mounts map[string]*liveMount
}

var _ Mounter = (*BlobfsMounter)(nil)

// liveMount is one mount served here. done is closed once the session has
// ended and the filesystem has uploaded what it could and closed.
type liveMount struct {
	fs   *fusefs.FS
	sess *kernel.Session
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

func (m *BlobfsMounter) MountVolume(ctx context.Context, mp *MountPoint, spec MountSpec) error {
	target := mp.Path
	m.mu.Lock()
	_, busy := m.mounts[target]
	m.mu.Unlock()
	if busy {
		return fmt.Errorf("%s is already served by this driver", target)
	}
	store, vol, err := m.openStore(spec)
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
	lm, err := m.serveAt(mp, state, store, vol, spec)
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

// openStore opens the volume's store, and starts its metrics (nil without
// metrics): its requests are counted from the first.
func (m *BlobfsMounter) openStore(spec MountSpec) (blobstore.Store, *fsmetrics.Volume, error) {
	az, err := blobstore.NewAzure(spec.Azure)
	if err != nil {
		return nil, nil, err
	}
	log := m.log.With("volume", spec.VolumeID)
	blobstore.WarnSASExpiry(log, spec.Azure, time.Now())
	blobstore.NoteAuthMode(log, spec.Azure)
	store := blobstore.NewLogged(az, log)
	var vol *fsmetrics.Volume
	if m.metrics != nil {
		vol = m.metrics.NewVolume(spec.VolumeID)
		store = vol.InstrumentStore(store)
	}
	watched := blobstore.NewWatched(store, blobstore.WatchOptions{Log: log})
	if vol != nil {
		vol.WatchStore(watched)
	}
	return blobstore.NewRetrying(watched, spec.Retry), vol, nil
}

// serveAt mounts spec on the directory mp and serves it. The directory is
// opened (without following a symlink) and checked to have nothing mounted
// on it just before the mount, which is made on the open directory: it
// cannot land anywhere else, and never on top of another mount.
func (m *BlobfsMounter) serveAt(mp *MountPoint, state *os.File, store blobstore.Store, vol *fsmetrics.Volume, spec MountSpec) (*liveMount, error) {
	dir, err := openUnmounted(mp)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return m.serve(mp.Path, dir, -1, state, store, vol, spec)
}

// openUnmounted opens the directory mp for a mount on it: a symlink, or a
// directory something is mounted on already, is an error. Only this
// driver mounts below the kubelet directory, under the volume's lock, so
// nothing mounts there between this check and the mount.
func openUnmounted(mp *MountPoint) (*os.File, error) {
	dir, err := mp.dir()
	if err != nil {
		return nil, err
	}
	if root, err := isMountRoot(dir); err != nil || root {
		dir.Close()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s is mounted already: not mounting on top of it", mp.Path)
	}
	return dir, nil
}

// isMountRoot tells whether the open directory f is the root of a mount,
// without asking its filesystem (AT_STATX_DONT_SYNC).
func isMountRoot(f *os.File) (bool, error) {
	var st unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_TYPE, &st); err != nil {
		return false, fmt.Errorf("statx %s: %w", f.Name(), err)
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// serve mounts spec on dir (fuseFD < 0), or serves the live mount on
// fuseFD whose state region is state (adoption), at target. vol (nil
// without metrics) reports the mount's gauges while it lives.
func (m *BlobfsMounter) serve(target string, dir *os.File, fuseFD int, state *os.File, store blobstore.Store, vol *fsmetrics.Volume, spec MountSpec) (*liveMount, error) {
	opts := spec.FS
	if opts.Logger == nil {
		opts.Logger = m.log.With("volume", spec.VolumeID)
	}
	opts.State = state
	opts.DiskCache = m.diskCache
	fsys, err := fusefs.New(store, opts)
	if err != nil {
		return nil, err
	}
	mo := spec.Mount
	mo.ReadOnly = mo.ReadOnly || opts.ReadOnly
	if mo.FsName == "" {
		mo.FsName = fsNameOf(spec.Azure.Container)
	}
	if mo.Logger == nil {
		mo.Logger = opts.Logger
	}
	var served fuse.RawFileSystem = fsys
	if m.metrics != nil {
		served = m.metrics.InstrumentFS(fsys)
		vol.Track(fsys)
	}
	var sess *kernel.Session
	if fuseFD < 0 {
		sess, err = kernel.MountAt(dir, served, mo)
	} else {
		sess, err = kernel.Serve(target, fuseFD, served, mo)
	}
	if err != nil {
		if m.metrics != nil {
			m.metrics.Untrack(fsys)
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
		m.mu.Lock()
		// A mount that outlived its UnmountVolume (still mounted
		// elsewhere) may have been followed by a new one at target:
		// the keeper's record is then the new one's.
		replaced := m.mounts[target] != nil && m.mounts[target] != lm
		m.mu.Unlock()
		if m.keeper != nil && !replaced {
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
		m.metrics.Untrack(lm.fs)
	}
	m.mu.Lock()
	if m.mounts[target] == lm {
		delete(m.mounts, target)
	}
	m.mu.Unlock()
	close(lm.done)
}

func (m *BlobfsMounter) UnmountVolume(ctx context.Context, mp *MountPoint) error {
	target := mp.Path
	m.mu.Lock()
	lm := m.mounts[target]
	m.mu.Unlock()
	if lm == nil {
		// Not ours (a dead mount left by an earlier process) or nothing.
		m.abortDead(mp)
		return m.Unmount(mp)
	}
	if err := lm.fs.Sync(ctx); err != nil {
		return fmt.Errorf("upload dirty data before unmount: %w", err)
	}
	dev, devErr := mountDevice(mp)
	err := mp.unmount(0)
	// A file closed just before is still open for the kernel until
	// blobfs has answered its RELEASE, which the kernel sends after close
	// returns: a short wait tells that apart from a process holding a
	// file, which a lazy unmount would leave this path served (and a
	// mount again for another group refused) until it lets go.
	for deadline := time.Now().Add(unmountBusyWait); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		err = mp.unmount(0)
	}
	switch {
	case errors.Is(err, unix.EBUSY):
		// A process still has a file open: detach now, serve it until it
		// lets go (watch uploads what it writes meanwhile).
		m.log.Warn("mount busy; detaching lazily", "mountpoint", target)
		if err := mp.unmount(unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
		return nil
	case errors.Is(err, unix.EINVAL):
		// Already unmounted from outside; watch is finishing.
	case err != nil:
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	t := time.NewTimer(unmountWait)
	defer t.Stop()
	select {
	case <-lm.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("unmount %s: waiting for the filesystem to finish: %w", target, ctx.Err())
	case <-t.C:
	}
	// The session ends only when the filesystem's last mount goes. If it
	// is still mounted somewhere else (a bind mount this driver did not
	// make, or one an older version made through a symlink, outside the
	// kubelet directory), waiting would last until the caller's deadline:
	// say where, leave those mounts alone (they are not this driver's to
	// remove), and serve them until they go.
	if devErr == nil {
		if others := mountsOfDevice(dev); len(others) > 0 {
			m.log.Warn("unmounted, but the filesystem is still mounted elsewhere; serving it until those mounts go",
				"mountpoint", target, "elsewhere", others)
			m.mu.Lock()
			if m.mounts[target] == lm {
				delete(m.mounts, target) // the path may be mounted again
			}
			m.mu.Unlock()
			return nil
		}
	}
	select {
	case <-lm.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("unmount %s: waiting for the filesystem to finish: %w", target, ctx.Err())
	}
}

// unmountBusyWait is how long UnmountVolume tries again a mount that is
// busy before it detaches it.
const unmountBusyWait = time.Second

// unmountWait is how long UnmountVolume waits for a session to end before
// it looks for other mounts of the filesystem that keep it alive.
const unmountWait = 5 * time.Second

// fsNameOf is the source the mounts of a container show in the mount
// table (mountinfo), by which views.go knows them.
func fsNameOf(container string) string { return "blobfs:" + container }

// mountDevice is the device number (major:minor, as in mountinfo) of the
// mount on mp, without asking its filesystem.
func mountDevice(mp *MountPoint) (string, error) {
	dir, err := mp.dir()
	if err != nil {
		return "", err
	}
	defer dir.Close()
	var st unix.Statx_t
	if err := unix.Statx(int(dir.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, 0, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", st.Dev_major, st.Dev_minor), nil
}

// abortDead aborts the FUSE connection of a blobfs mount at mp that this
// process does not serve, before it is unmounted. Its server is gone; if
// that server died while a thread of its own waited on the mount (the
// health check's statfs), the connection is still open and hangs every
// request, the dead process never finishes exiting, and a lazy unmount
// alone would leave both behind (kernel.AbortConnection). Aborting a
// connection that is aborted already changes nothing.
func (m *BlobfsMounter) abortDead(mp *MountPoint) {
	if _, mounted, err := mp.kind(); err != nil || !mounted {
		return
	}
	dir, err := mp.dir()
	if err != nil {
		return
	}
	var st unix.Statx_t
	err = unix.Statx(int(dir.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, 0, &st)
	dir.Close()
	if err != nil || st.Dev_major != 0 {
		return // not a FUSE connection
	}
	dev := fmt.Sprintf("%d:%d", st.Dev_major, st.Dev_minor)
	for _, p := range mountsOfDevice(dev) {
		m.mu.Lock()
		_, ours := m.mounts[p]
		m.mu.Unlock()
		if ours {
			return // the same connection serves a mount of ours
		}
	}
	if err := kernel.AbortConnection(st.Dev_major, st.Dev_minor); err != nil {
		m.log.Debug("could not abort the dead mount's FUSE connection", "mountpoint", mp.Path, "err", err)
		return
	}
	m.log.Info("aborted the FUSE connection of a dead mount", "mountpoint", mp.Path, "device", dev)
}

// mountsOfDevice lists the mount points of the filesystem dev in this
// mount namespace.
func mountsOfDevice(dev string) []string {
	infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, mi := range infos {
		if fmt.Sprintf("%d:%d", mi.Major, mi.Minor) == dev {
			out = append(out, mi.MountPoint)
		}
	}
	return out
}

// BindMount clones the mount at source (open_tree) and attaches the clone
// to the target directory (move_mount), both through directories opened
// without following symlinks: the bind mount cannot land outside the
// kubelet directory, and it is read-only (mount_setattr) before it is
// ever visible. Linux 5.12 or later.
func (m *BlobfsMounter) BindMount(source, target *MountPoint, readOnly bool) error {
	src, err := source.dir()
	if err != nil {
		return err
	}
	defer src.Close()
	if root, err := isMountRoot(src); err != nil || !root {
		if err == nil {
			err = errors.New("nothing is mounted there")
		}
		return fmt.Errorf("bind mount from %s: %w", source.Path, err)
	}
	dst, err := openUnmounted(target)
	if err != nil {
		return err
	}
	defer dst.Close()
	tree, err := cloneMount(int(src.Fd()), readOnly)
	if err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", source.Path, target.Path, err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", int(dst.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind mount %s at %s: %w", source.Path, target.Path, err)
	}
	return nil
}

// cloneMount clones the mount at the directory dirfd (open_tree), detached
// and read-only if asked (mount_setattr) before it is ever visible. Until
// it is attached (move_mount), the clone is dropped when its fd is closed.
func cloneMount(dirfd int, readOnly bool) (int, error) {
	tree, err := unix.OpenTree(dirfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("clone the mount: %w", err)
	}
	if readOnly {
		// nosuid and nodev come with the clone (blobfs mounts have
		// them); setting them again is harmless.
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
			unix.Close(tree)
			return -1, fmt.Errorf("make the clone read-only: %w", err)
		}
	}
	return tree, nil
}

func (m *BlobfsMounter) Unmount(mp *MountPoint) error {
	err := mp.unmount(0)
	switch {
	case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		// EINVAL: not a mount point (a symlink is not one either:
		// UMOUNT_NOFOLLOW).
		return nil
	case errors.Is(err, unix.EBUSY):
		if err := mp.unmount(unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", mp.Path, err)
		}
		return nil
	}
	return fmt.Errorf("unmount %s: %w", mp.Path, err)
}

// statTimeout bounds the stat that tells a live mount from a hung one.
const statTimeout = 5 * time.Second

func (m *BlobfsMounter) Status(ctx context.Context, mp *MountPoint) PathStatus {
	return pathStatus(ctx, mp)
}

// pathStatus asks whether something is mounted on mp without touching the
// mount (statx that asks no filesystem), and only then asks the mount, with
// a timeout, so that a hung mount cannot hang the caller. It works on the
// directory, not on the path: a symlink is reported as one, never
// followed, and a mount is found whatever the mount table calls its path.
func pathStatus(ctx context.Context, mp *MountPoint) PathStatus {
	kind, mounted, err := mp.kind()
	switch {
	case err != nil:
		return PathStatus{State: PathCorrupted, Err: err}
	case kind == kindMissing:
		return PathStatus{State: PathMissing}
	case kind == kindSymlink:
		return PathStatus{State: PathSymlink}
	case !mounted:
		return PathStatus{State: PathNotMounted}
	}
	dir, err := mp.dir()
	if err != nil {
		return PathStatus{State: PathCorrupted, Err: err}
	}
	errc := make(chan error, 1)
	go func() {
		defer dir.Close()
		// statfs, not stat: a FUSE filesystem's statfs always asks
		// its server, so a dead one answers ENOTCONN, while stat of a
		// dead mount's root succeeds from attributes the kernel still
		// holds (until the attribute timeout): a driver restarted
		// within that second saw the dead staging mount as mounted
		// and bind-mounted it for a new pod (TestKeeperAndDriverKilled
		// failed so under load).
		var st unix.Statfs_t
		errc <- unix.Fstatfs(int(dir.Fd()), &st)
	}()
	t := time.NewTimer(statTimeout)
	defer t.Stop()
	select {
	case err := <-errc:
		if err == nil {
			return PathStatus{State: PathMounted}
		}
		return PathStatus{State: PathCorrupted, Err: err}
	case <-t.C:
		return PathStatus{State: PathCorrupted, Err: fmt.Errorf("mount at %s does not answer within %v", mp.Path, statTimeout)}
	case <-ctx.Done():
		return PathStatus{State: PathCorrupted, Err: ctx.Err()}
	}
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
