package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Path safety. kubelet names the staging and target paths, but anyone who
// can write below the kubelet directory (a pod with a hostPath volume, a
// compromised container runtime) can swap a directory on such a path for
// a symlink. The driver runs as root in the host's mount namespace: had it
// followed the symlink, it would mount, unmount or remove wherever the
// symlink points. So no symlink below the kubelet directory is ever
// followed: a path is opened one component at a time from the kubelet
// directory with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and what
// the driver does afterwards (look, mkdir, mount, unmount, remove) it does
// through the directory it opened, not through the path again, so that a
// swap after the check cannot redirect it either.
//
// The kubelet directory itself is trusted as configured (it is the
// operator's, and /var/lib/kubelet is a symlink on some distributions).

// checkPath validates a staging or target path from a request: present,
// absolute, and inside the kubelet directory. It returns the cleaned path.
// A path outside the kubelet directory is refused so that a request cannot
// make the driver (root, in the host's mount namespace) mount over or
// remove arbitrary host directories. It is only the lexical half:
// openMountPoint refuses symlinks.
func (d *Driver) checkPath(field, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s is missing", field)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%s contains a NUL byte", field)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s %q is not an absolute path", field, clip(p, 200))
	}
	clean := filepath.Clean(p)
	rel, err := filepath.Rel(d.kubeletDir, clean)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s %q is not inside the kubelet directory %s", field, clip(p, 200), d.kubeletDir)
	}
	return clean, nil
}

// errPathMissing is openMountPoint's answer when a parent directory does
// not exist (and it was not asked to create it).
var errPathMissing = errors.New("no such directory")

// symlinkError is a path that is, or passes through, a symlink below the
// kubelet directory. It names the request's field and the symlink.
type symlinkError struct {
	field, path, link string
}

func (e *symlinkError) Error() string {
	if e.link == e.path {
		return fmt.Sprintf("%s %q is a symlink; symlinks below the kubelet directory are not followed", e.field, clip(e.path, 200))
	}
	return fmt.Sprintf("%s %q passes through a symlink at %s; symlinks below the kubelet directory are not followed", e.field, clip(e.path, 200), clip(e.link, 200))
}

// notDirError is a path that is, or passes through, something other than
// a directory (a regular file, a device) below the kubelet directory: the
// request named a path the driver cannot mount on. It names the request's
// field and what is not a directory.
type notDirError struct {
	field, path, at string
}

func (e *notDirError) Error() string {
	if e.at == e.path {
		return fmt.Sprintf("%s %q is not a directory", e.field, clip(e.path, 200))
	}
	return fmt.Sprintf("%s %q passes through %s, which is not a directory", e.field, clip(e.path, 200), clip(e.at, 200))
}

// MountPoint is a staging or target directory as the node acts on it: its
// parent directory is held open (O_PATH), reached from the kubelet
// directory without following any symlink, and every operation goes
// through that parent and the last path component, never through the
// path. Close releases it.
type MountPoint struct {
	// Path is the cleaned path as kubelet named it: the key of the node
	// state and the mounter's tables, and what logs show.
	Path   string
	field  string
	parent *os.File // O_PATH directory
	name   string   // Path's last component, not "." or ".."
}

// openMountPoint opens the parent of path (a cleaned path below root) one
// component at a time, refusing symlinks and creating missing directories
// (mode 0750) when create is set. A symlink gives a *symlinkError, a
// parent that is not a directory a *notDirError, a missing parent (create
// unset) errPathMissing. The last component is not
// looked at here: see MountPoint.kind and dir.
func openMountPoint(root, field, path string, create bool) (*MountPoint, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s %q is not inside %s", field, clip(path, 200), root)
	}
	comps := strings.Split(rel, "/")
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the kubelet directory %s: %w", root, err)
	}
	for i, c := range comps[:len(comps)-1] {
		next, err := openBeneath(fd, c)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, c, 0o750); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openBeneath(fd, c)
			}
		}
		unix.Close(fd)
		at := filepath.Join(root, filepath.Join(comps[:i+1]...))
		switch {
		case errors.Is(err, unix.ELOOP):
			return nil, &symlinkError{field: field, path: path, link: at}
		case errors.Is(err, unix.ENOENT):
			return nil, fmt.Errorf("%s: %s: %w", field, at, errPathMissing)
		case errors.Is(err, unix.ENOTDIR):
			return nil, &notDirError{field: field, path: path, at: at}
		case err != nil:
			return nil, fmt.Errorf("%s: open %s: %w", field, at, err)
		}
		fd = next
	}
	return &MountPoint{Path: path, field: field, parent: os.NewFile(uintptr(fd), filepath.Dir(path)), name: comps[len(comps)-1]}, nil
}

// openBeneath opens name, one component, in the directory dirfd (O_PATH),
// following no symlink (ELOOP if name is one) and going into whatever is
// mounted on it. An O_PATH open asks no filesystem anything, so neither a
// dead nor a hung FUSE mount on name can make it fail or hang.
func openBeneath(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // EAGAIN: a rename raced the lookup; safe to retry
		}
		return fd, err
	}
}

// Close releases the parent directory.
func (m *MountPoint) Close() error {
	if m == nil || m.parent == nil {
		return nil
	}
	return m.parent.Close()
}

// pathKind is what the last component of a MountPoint is.
type pathKind int

const (
	kindMissing pathKind = iota
	kindDir
	kindSymlink
	kindOther
)

// kind says what the last component is and whether something is mounted
// on it (it is the root of a mount). It asks no filesystem anything
// (AT_STATX_DONT_SYNC: a FUSE mount answers from the attributes the kernel
// holds), so it neither hangs on a hung mount nor fails on a dead one.
func (m *MountPoint) kind() (pathKind, bool, error) {
	var st unix.Statx_t
	err := unix.Statx(int(m.parent.Fd()), m.name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC|unix.AT_NO_AUTOMOUNT, unix.STATX_TYPE, &st)
	if errors.Is(err, unix.ENOENT) {
		return kindMissing, false, nil
	}
	if err != nil {
		return kindOther, false, err
	}
	mounted := st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return kindDir, mounted, nil
	case unix.S_IFLNK:
		return kindSymlink, false, nil
	}
	return kindOther, mounted, nil
}

// checkDir refuses a last component that exists and is not a directory:
// a symlink is a *symlinkError, anything else (a regular file) a
// *notDirError. Missing is fine. It asks no filesystem anything (kind).
func (m *MountPoint) checkDir() error {
	k, _, err := m.kind()
	switch {
	case err != nil:
		return nil // a dead mount: the caller's Status says so
	case k == kindSymlink:
		return &symlinkError{field: m.field, path: m.Path, link: m.Path}
	case k == kindOther:
		return &notDirError{field: m.field, path: m.Path, at: m.Path}
	}
	return nil
}

// dir opens the directory itself (O_PATH): the root of what is mounted on
// it, if anything is. A symlink is a *symlinkError, anything else that is
// not a directory a *notDirError.
func (m *MountPoint) dir() (*os.File, error) {
	fd, err := openBeneath(int(m.parent.Fd()), m.name)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, &symlinkError{field: m.field, path: m.Path, link: m.Path}
	case errors.Is(err, unix.ENOTDIR):
		return nil, &notDirError{field: m.field, path: m.Path, at: m.Path}
	case errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("%s %s: %w", m.field, m.Path, errPathMissing)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", m.Path, err)
	}
	return os.NewFile(uintptr(fd), m.Path), nil
}

// mkdir creates the directory (0750) unless it exists; a symlink there is
// a *symlinkError.
func (m *MountPoint) mkdir() error {
	if err := unix.Mkdirat(int(m.parent.Fd()), m.name, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create %s: %w", m.Path, err)
	}
	f, err := m.dir()
	if err != nil {
		return err
	}
	return f.Close()
}

// remove removes the directory (not a symlink: that is left alone, as
// rmdir(2) does not follow it). Missing is success.
func (m *MountPoint) remove() error {
	err := unix.Unlinkat(int(m.parent.Fd()), m.name, unix.AT_REMOVEDIR)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("remove %s: %w", m.Path, err)
}

// unmount is umount2(2) of the mount on the directory, resolved from the
// open parent: no symlink in the path can redirect it. umount2 takes only
// a path, so the call runs on a thread of its own whose working directory
// is the parent (unshare(CLONE_FS) gives the thread its own), with the last
// component as the path and UMOUNT_NOFOLLOW. The thread is not handed back
// to the Go scheduler (no UnlockOSThread): it ends with the goroutine.
func (m *MountPoint) unmount(flags int) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare CLONE_FS: %w", err)
			return
		}
		if err := unix.Fchdir(int(m.parent.Fd())); err != nil {
			errc <- fmt.Errorf("chdir to %s: %w", m.parent.Name(), err)
			return
		}
		errc <- unix.Unmount(m.name, flags|unix.UMOUNT_NOFOLLOW)
	}()
	return <-errc
}
