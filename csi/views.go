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
	var errs []error
	for _, views := range byNS {
		r.Namespaces++
		for _, v := range views {
			err := replaceView(proc, src, v)
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
// source is fsName.
func viewsOf(mountinfo string, pid int, dev, fsName string) ([]deadView, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var views []deadView
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		if len(fields) < 6 || fields[2] != dev {
			continue
		}
		sep := slices.Index(fields[6:], "-") + 6
		if sep < 6 || sep+2 >= len(fields) || fields[sep+1] != "fuse.blobfs" || unescapeOctal(fields[sep+2]) != fsName {
			continue
		}
		views = append(views, deadView{
			pid: pid, root: unescapeOctal(fields[3]), mountPoint: unescapeOctal(fields[4]),
			readOnly: hasOption(fields[5], "ro"),
		})
	}
	// Children before parents: a mount inside another of the same
	// connection (rare) is replaced first.
	for i, j := 0, len(views)-1; i < j; i, j = i+1, j-1 {
		views[i], views[j] = views[j], views[i]
	}
	return views, s.Err()
}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}

// unescapeOctal undoes mountinfo's \NNN escapes (space, tab, newline, \).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// replaceView clones the working mount (the directory of it the dead
// view showed) and puts the clone where the dead view is, in the dead
// view's namespace.
func replaceView(proc string, src *os.File, v deadView) error {
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
			return fmt.Errorf("open %s in the working mount: %w", rel, err)
		}
		defer unix.Close(fd)
		dirfd = fd
	}
	tree, err := cloneMount(dirfd, v.readOnly)
	if err != nil {
		return fmt.Errorf("the working mount: %w", err)
	}
	defer unix.Close(tree)
	ns, err := os.Open(filepath.Join(proc, strconv.Itoa(v.pid), "ns", "mnt"))
	if err != nil {
		return err
	}
	defer ns.Close()
	return inMountNamespace(ns, func() error {
		var st unix.Statfs_t
		switch err := unix.Statfs(v.mountPoint, &st); {
		case err == nil:
			return errViewLive
		case !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED):
			return fmt.Errorf("statfs: %w (not a dead connection's answer: left alone)", err)
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
		return nil
	})
}

// inMountNamespace runs fn on a thread of its own that has entered the
// mount namespace ns, and brings the thread back to this process's
// namespace before it ends. The goroutine exits locked to its thread, so
// the runtime ends the thread with it and no other goroutine ever runs
// there; but a goroutine that happens to run on the process's main thread
// wedges that thread instead of ending it, and a thread left in the
// container's namespace would keep the namespace, and the volume's
// connection with it, alive after the container is gone. Hence the way
// back.
func inMountNamespace(ns *os.File, fn func() error) error {
	home, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	defer home.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// setns(CLONE_NEWNS) refuses a thread that shares its file
		// system information (root, cwd) with others, as Go's threads do.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare(CLONE_FS): %w", err)
			return
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("enter the mount namespace: %w", err)
			return
		}
		err := fn()
		if back := unix.Setns(int(home.Fd()), unix.CLONE_NEWNS); back != nil {
			err = errors.Join(err, fmt.Errorf("return to this process's mount namespace: %w", back))
		}
		done <- err
	}()
	return <-done
}
