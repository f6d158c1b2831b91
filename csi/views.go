package csi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/fusefs"
)

// Repairing the views running containers have of a volume.
//
// A container's view of a volume is a mount in its own mount namespace,
// made by the container runtime from the pod's target when the container
// started (a bind mount of the same filesystem). When the driver and the
// keeper both die, that view dies with the FUSE connection, and mounting
// the volume again on the node (staging path, targets) does not reach it:
// mount propagation into a container only happens when the pod asked for
// HostToContainer. So after a repair the driver finds, in every other
// mount namespace of the node, the mounts of the dead connection (by its
// device number, which every bind mount of one FUSE connection shares) and
// replaces each in place with a clone of the working mount: open_tree
// (OPEN_TREE_CLONE) of the repaired mount in its own namespace, then, on a
// thread that has entered the container's namespace (setns), the dead
// mount detached and the clone moved onto its mount point (move_mount),
// read-only where the dead one was. Linux 5.12 or later (mount_setattr).
//
// Mounts inside a dead view (a configMap, a secret, a projected volume, a
// subPath or another volume mounted below the volume's mount point) go
// with it when it is detached, and a clone of the working mount has none
// of them: each is cloned before the detach and attached again, parents
// first, at the same path on the new view. Its clone comes from the
// container's namespace when the path to it still resolves there, which
// it does only while the kernel trusts its cached name (the volume's
// entry timeout, 1 s by default): past that, every lookup through the dead
// connection fails (ENOTCONN, measured on Linux 6.18). Otherwise it comes
// from a mount of the same filesystem and directory in the driver's own
// namespace: what kubelet mounts for a pod (its volumes, subPaths) is
// there, below the kubelet directory the driver shares. A nested mount
// with neither, or whose mount point is gone from the volume, is not put
// back, and that is reported; nothing is created for it.
//
// What comes back: every new open, stat and listing on the container's
// path. What cannot: files, directories and working directories that
// were open on the dead connection keep failing (ENOTCONN): they belong to
// a connection that is gone. The node plugin sees other containers'
// processes only with the host's PID namespace (hostPID in
// deploy/node.yaml).

// ViewRepair counts what ReplaceDeadViews did.
type ViewRepair struct {
	Namespaces int // mount namespaces that held a mount of the dead connection
	Replaced   int // mounts replaced by a working clone
	Live       int // mounts of the device that answer: not the dead connection's, left alone
	Failed     int // mounts that could not be replaced (see Err)
	Err        error

	Nested     int   // mounts inside replaced views attached again on the clones
	NestedLost int   // mounts inside replaced views that could not be (see NestedErr)
	NestedErr  error // why, one error per mount
}

// errViewLive says that a mount found by its device number answers: the
// dead connection's superblock was freed and its number given to another
// mount, which is left alone.
var errViewLive = errors.New("the mount answers: not a dead connection")

// deadView is a mount of a dead connection in another mount namespace.
type deadView struct {
	pid        int    // a process in the namespace
	mountPoint string // as that process sees it
	root       string // the directory of the filesystem the mount shows
	readOnly   bool
	nested     []mountEntry // the mounts below it, parents first
}

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	id, parent int
	dev        string // major:minor
	root       string // the directory of the filesystem the mount shows
	mountPoint string
	opts       string // per-mount options: ro, nosuid, nodev, noexec, atime
	fsType     string
	source     string
}

// ReplaceDeadViews replaces every dead mount of the filesystem dev
// (major:minor), a blobfs mount whose source is fsName, in mount
// namespaces other than this process's with a clone of the mount at
// source, which shows the same volume.
//
// A device number names one filesystem at a time: while any view of the
// dead connection remains, its number cannot be given to another mount,
// but once none does, it can (even to a mount of another volume). So a
// mount is replaced only when it is the same volume's (fsName) and it is
// dead: a statfs of it in its namespace fails with ENOTCONN or
// ECONNABORTED, which a live mount never answers.
func (m *BlobfsMounter) ReplaceDeadViews(dev, fsName string, source *MountPoint) ViewRepair {
	return replaceDeadViews("/proc", dev, fsName, source)
}

func replaceDeadViews(proc, dev, fsName string, source *MountPoint) ViewRepair {
	var r ViewRepair
	byNS, err := deadViews(proc, dev, fsName)
	if err != nil {
		r.Err = err
		return r
	}
	if len(byNS) == 0 {
		return r
	}
	src, err := source.dir()
	if err != nil {
		r.Err = err
		r.Failed = countViews(byNS)
		return r
	}
	defer src.Close()
	var errs, nestedErrs []error
	for _, views := range byNS {
		r.Namespaces++
		for _, v := range views {
			kept, lost, err := replaceView(proc, src, v)
			r.Nested += kept
			r.NestedLost += len(lost)
			for _, l := range lost {
				nestedErrs = append(nestedErrs, fmt.Errorf("in the mount namespace of pid %d: %w", v.pid, l))
			}
			if errors.Is(err, errViewLive) {
				r.Live++
				continue
			}
			if err != nil {
				r.Failed++
				errs = append(errs, fmt.Errorf("%s in the mount namespace of pid %d: %w", v.mountPoint, v.pid, err))
				continue
			}
			r.Replaced++
		}
	}
	r.Err = errors.Join(errs...)
	r.NestedErr = errors.Join(nestedErrs...)
	return r
}

func countViews(byNS map[string][]deadView) int {
	n := 0
	for _, v := range byNS {
		n += len(v)
	}
	return n
}

// deadViews finds the blobfs mounts of dev with source fsName in every
// mount namespace but this process's, one process per namespace, deepest
// mount points first.
func deadViews(proc, dev, fsName string) (map[string][]deadView, error) {
	self, err := os.Readlink(filepath.Join(proc, "self", "ns", "mnt"))
	if err != nil {
		return nil, fmt.Errorf("this process's mount namespace: %w", err)
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{self: true}
	out := map[string][]deadView{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join(proc, e.Name(), "ns", "mnt"))
		if err != nil || seen[ns] {
			continue // gone, a kernel thread, or a namespace already read
		}
		seen[ns] = true
		views, err := viewsOf(filepath.Join(proc, e.Name(), "mountinfo"), pid, dev, fsName)
		if err != nil || len(views) == 0 {
			continue
		}
		out[ns] = views
	}
	return out, nil
}

// viewsOf reads a process's mountinfo for the blobfs mounts of dev whose
// source is fsName, each with the mounts below it.
func viewsOf(mountinfo string, pid int, dev, fsName string) ([]deadView, error) {
	mounts, err := readMountinfo(mountinfo)
	if err != nil {
		return nil, err
	}
	var views []deadView
	for _, m := range mounts {
		if m.dev != dev || m.fsType != "fuse.blobfs" || m.source != fsName {
			continue
		}
		views = append(views, deadView{
			pid: pid, root: m.root, mountPoint: m.mountPoint,
			readOnly: hasOption(m.opts, "ro"), nested: mountsBelow(mounts, m.id),
		})
	}
	// Children before parents: a mount inside another of the same
	// connection (rare) is replaced first.
	slices.Reverse(views)
	return views, nil
}

// readMountinfo parses a mountinfo file.
func readMountinfo(mountinfo string) ([]mountEntry, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		if len(fields) < 6 {
			continue
		}
		sep := slices.Index(fields[6:], "-") + 6
		if sep < 6 || sep+2 >= len(fields) {
			continue
		}
		id, err1 := strconv.Atoi(fields[0])
		parent, err2 := strconv.Atoi(fields[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, mountEntry{
			id: id, parent: parent, dev: fields[2],
			root: fusefs.UnescapeMountInfo(fields[3]), mountPoint: fusefs.UnescapeMountInfo(fields[4]), opts: fields[5],
			fsType: fields[sep+1], source: fusefs.UnescapeMountInfo(fields[sep+2]),
		})
	}
	return out, s.Err()
}

// mountsBelow returns the mounts whose parent, or a parent's parent, is
// the mount id, parents before their children (the order in which they
// can be attached again).
func mountsBelow(mounts []mountEntry, id int) []mountEntry {
	parent := make(map[int]int, len(mounts))
	for _, m := range mounts {
		parent[m.id] = m.parent
	}
	// depth is the number of mounts between a mount and id, or -1 when
	// id is not above it.
	depth := func(m int) int {
		for d := 0; d <= len(mounts); d++ {
			p, ok := parent[m]
			if !ok || p == m {
				return -1
			}
			if p == id {
				return d
			}
			m = p
		}
		return -1 // a cycle: not a tree the kernel wrote
	}
	var below []mountEntry
	depths := map[int]int{}
	for _, m := range mounts {
		if d := depth(m.id); d >= 0 {
			below = append(below, m)
			depths[m.id] = d
		}
	}
	// Stable: mounts stacked on one path keep the kernel's order,
	// bottom first.
	slices.SortStableFunc(below, func(a, b mountEntry) int { return depths[a.id] - depths[b.id] })
	return below
}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// replaceView clones the working mount (the directory of it the dead
// view showed) and puts the clone where the dead view is, in the dead
// view's namespace, with the mounts that were below the dead view
// attached again on it. It returns how many of those it put back and why
// each other one was not.
func replaceView(proc string, src *os.File, v deadView) (kept int, lost []error, err error) {
	rel := strings.TrimPrefix(filepath.Clean("/"+v.root), "/")
	dirfd := int(src.Fd())
	if rel != "" {
		// The view showed a directory of the volume (a subPath): clone
		// the same directory, never through a symlink or out of the
		// volume.
		fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			return 0, nil, fmt.Errorf("open %s in the working mount: %w", rel, err)
		}
		defer unix.Close(fd)
		dirfd = fd
	}
	tree, err := cloneMount(dirfd, v.readOnly)
	if err != nil {
		return 0, nil, fmt.Errorf("the working mount: %w", err)
	}
	defer unix.Close(tree)
	// The mounts below the view, cloned here from this namespace's mounts
	// of the same filesystems (a mount can be cloned only in its own
	// namespace), for those the container's namespace cannot give.
	here := make([]int, len(v.nested))
	whyNot := make([]error, len(v.nested))
	own, err := readMountinfo(filepath.Join(proc, "self", "mountinfo"))
	for i, n := range v.nested {
		here[i], whyNot[i] = -1, err
		if err == nil {
			here[i], whyNot[i] = cloneSameDirectory(own, n)
		}
	}
	defer closeAll(here)
	ns, err := os.Open(filepath.Join(proc, strconv.Itoa(v.pid), "ns", "mnt"))
	if err != nil {
		return 0, nil, err
	}
	defer ns.Close()
	err = inMountNamespace(ns, func() error {
		var st unix.Statfs_t
		switch err := unix.Statfs(v.mountPoint, &st); {
		case err == nil:
			return errViewLive
		case !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED):
			return fmt.Errorf("statfs: %w (not a dead connection's answer: left alone)", err)
		}
		// Before the detach takes them along: the mounts below the view.
		nested := make([]int, len(v.nested))
		defer closeAll(nested)
		for i, n := range v.nested {
			fd, err := cloneInPlace(n)
			switch {
			case err == nil:
				nested[i] = fd
			case here[i] >= 0:
				nested[i], here[i] = here[i], -1
			default:
				nested[i] = -1
				lost = append(lost, fmt.Errorf("%s (%s) inside %s: not put back: in its namespace: %v; here: %v", n.mountPoint, n.fsType, v.mountPoint, err, whyNot[i]))
			}
		}
		// Detach the dead mount first, so that the path shows the clone
		// and nothing is stacked; where that is refused (a mount the
		// namespace's owner locked), the clone goes on top of it.
		detachErr := unix.Unmount(v.mountPoint, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err := unix.MoveMount(tree, "", unix.AT_FDCWD, v.mountPoint, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			if detachErr != nil {
				return fmt.Errorf("detach the dead mount: %v; attach the clone: %w", detachErr, err)
			}
			return fmt.Errorf("attach the clone: %w", err)
		}
		for i, n := range v.nested {
			if nested[i] < 0 {
				continue
			}
			if err := attachBelow(tree, v.mountPoint, n, nested[i]); err != nil {
				lost = append(lost, err)
				continue
			}
			kept++
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return kept, lost, nil
}

// cloneInPlace clones the mount n in the mount namespace of the calling
// thread, from its mount point. The path resolves only while the kernel
// trusts the names the dead connection gave (its entry timeout): past
// that, a lookup through it fails.
func cloneInPlace(n mountEntry) (int, error) {
	fd, err := openMountTop(n)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("clone: %w", err)
	}
	return tree, nil
}

// openMountTop opens m's mount point (O_PATH, no symlink followed) and
// checks that the mount on top of it is m, not one stacked on it since.
func openMountTop(m mountEntry) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, m.mountPoint, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS,
	})
	if err != nil {
		return -1, err
	}
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mask&unix.STATX_MNT_ID == 0 || st.Mnt_id != uint64(m.id) {
		unix.Close(fd)
		return -1, fmt.Errorf("another mount than %d is on top of the path", m.id)
	}
	return fd, nil
}

// cloneSameDirectory clones, from the mounts of this process's namespace
// (own), one that shows n's filesystem at n's directory or above it,
// reduced to n's directory and as restricted as n (read-only, nosuid,
// nodev, noexec where n is).
func cloneSameDirectory(own []mountEntry, n mountEntry) (int, error) {
	var errs []error
	for _, m := range own {
		if m.dev != n.dev || !(m.root == "/" || m.root == n.root || strings.HasPrefix(n.root, m.root+"/")) {
			continue
		}
		tree, err := cloneBelow(m, strings.TrimPrefix(strings.TrimPrefix(n.root, m.root), "/"), n.opts)
		if err == nil {
			return tree, nil
		}
		errs = append(errs, fmt.Errorf("from %s: %w", m.mountPoint, err))
	}
	if len(errs) == 0 {
		return -1, fmt.Errorf("no mount of device %s shows %s", n.dev, n.root)
	}
	return -1, errors.Join(errs...)
}

// cloneBelow clones the mount m, reduced to its directory rel, with the
// restrictions in opts.
func cloneBelow(m mountEntry, rel, opts string) (int, error) {
	fd, err := openMountTop(m)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fd)
	dir := fd
	if rel != "" {
		// Never through a symlink, out of the filesystem or into
		// another mount.
		sub, err := unix.Openat2(fd, rel, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			return -1, err
		}
		defer unix.Close(sub)
		dir = sub
	}
	tree, err := unix.OpenTree(dir, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("clone: %w", err)
	}
	var set uint64
	for o, attr := range map[string]uint64{
		"ro": unix.MOUNT_ATTR_RDONLY, "nosuid": unix.MOUNT_ATTR_NOSUID, "nodev": unix.MOUNT_ATTR_NODEV, "noexec": unix.MOUNT_ATTR_NOEXEC,
	} {
		if hasOption(opts, o) {
			set |= attr
		}
	}
	if set != 0 {
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: set}); err != nil {
			unix.Close(tree)
			return -1, fmt.Errorf("restrict the clone: %w", err)
		}
	}
	return tree, nil
}

// attachBelow attaches the clone of the nested mount n at its mount point,
// which is below viewMountPoint, on the new view tree; nothing is created
// for it.
func attachBelow(tree int, viewMountPoint string, n mountEntry, clone int) error {
	rel, err := filepath.Rel(viewMountPoint, n.mountPoint)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("%s: not below %s", n.mountPoint, viewMountPoint)
	}
	fd, err := unix.Openat2(tree, rel, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%s (%s): not put back: its mount point is gone from the volume", n.mountPoint, n.fsType)
	}
	if err != nil {
		return fmt.Errorf("%s (%s): not put back: %w", n.mountPoint, n.fsType, err)
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(clone, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s (%s): not put back: %w", n.mountPoint, n.fsType, err)
	}
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// inMountNamespace runs fn on a thread of its own that has entered the
// mount namespace ns, and brings the thread back to this process's
// namespace before it ends (visitMountNamespace). The goroutine exits
// locked to its thread, so the runtime ends the thread with it and no
// other goroutine ever runs there (it no longer shares its root and
// working directory with the others); but a goroutine that happens to run
// on the process's main thread wedges that thread instead of ending it,
// and a thread left in the container's namespace would keep the
// namespace, and the volume's connection with it, alive after the
// container is gone. Hence the way back.
func inMountNamespace(ns *os.File, fn func() error) error {
	home, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	defer home.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		done <- visitMountNamespace(ns, home, fn)
	}()
	return <-done
}

// visitMountNamespace runs fn with the calling thread in the mount
// namespace ns, then puts the thread in the namespace home. The caller
// has locked its goroutine to the thread, and discards the thread after.
func visitMountNamespace(ns, home *os.File, fn func() error) error {
	// setns(CLONE_NEWNS) refuses a thread that shares its file system
	// information (root, cwd) with others, as Go's threads do.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_FS): %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the mount namespace: %w", err)
	}
	err := fn()
	if back := unix.Setns(int(home.Fd()), unix.CLONE_NEWNS); back != nil {
		err = errors.Join(err, fmt.Errorf("return to this process's mount namespace: %w", back))
	}
	return err
}
