package fusefs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// The user the unprivileged checks run as, and its groups: its own and one
// more (supplementary).
const (
	unprivUID   = 1000
	unprivGID   = 1000
	unprivGroup = 2000 // a supplementary group of unprivUID
	otherUID    = 1001
)

// unprivEnv makes the test binary run unprivCases against the mount it
// names, as whatever user started it, and print each case's errno.
const unprivEnv = "BLOBFS_TEST_UNPRIV_MOUNT"

// unprivCases run as unprivUID through a mount with allow_other, after
// setupUnpriv made the files as root. want is the errno (0: success); the
// kernel checks permissions against what blobfs shows, so these pass only
// if the attributes it stored and shows are right.
var unprivCases = []struct {
	name string
	want syscall.Errno
	op   func(mnt string) error
}{
	{"write a root file 0644", syscall.EACCES, func(m string) error { return os.WriteFile(join(m, "rootfile"), []byte("x"), 0) }},
	{"read another user's 0600 file", syscall.EACCES, func(m string) error { _, err := os.ReadFile(join(m, "private")); return err }},
	{"read a root file 0644", 0, func(m string) error { _, err := os.ReadFile(join(m, "rootfile")); return err }},
	{"chmod own file", 0, func(m string) error { return os.Chmod(join(m, "userfile"), 0o600) }},
	{"chmod a root file", syscall.EPERM, func(m string) error { return os.Chmod(join(m, "rootfile"), 0o666) }},
	{"chown own file to another user", syscall.EPERM, func(m string) error { return os.Chown(join(m, "userfile"), otherUID, -1) }},
	{"chgrp own file to a group of its own", 0, func(m string) error { return os.Chown(join(m, "userfile"), -1, unprivGroup) }},
	{"chgrp own file to a foreign group", syscall.EPERM, func(m string) error { return os.Chown(join(m, "userfile"), -1, 3000) }},
	{"create in own directory", 0, func(m string) error { return os.WriteFile(join(m, "userdir", "new"), []byte("x"), 0o640) }},
	{"create in a root directory 0755", syscall.EACCES, func(m string) error { return os.WriteFile(join(m, "rootdir", "new"), []byte("x"), 0o644) }},
	{"mkdir in a root directory 0755", syscall.EACCES, func(m string) error { return os.Mkdir(join(m, "rootdir", "d"), 0o755) }},
	{"set times of own file", 0, func(m string) error { return os.Chtimes(join(m, "userfile"), t1, t2) }},
	{"set times of a root file", syscall.EPERM, func(m string) error { return os.Chtimes(join(m, "rootfile"), t1, t2) }},
	{"touch a root file without write access", syscall.EACCES, func(m string) error {
		return unix.UtimesNanoAt(unix.AT_FDCWD, join(m, "rootfile"), nil, 0) // utimensat(NULL): "now", needs write access
	}},
	{"remove another user's file from a sticky directory", syscall.EPERM, func(m string) error { return os.Remove(join(m, "sticky", "others")) }},
	{"remove own file from a sticky directory", 0, func(m string) error { return os.Remove(join(m, "sticky", "mine")) }},
	{"write to own set-user-ID file", 0, func(m string) error {
		f, err := os.OpenFile(join(m, "suid"), os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write([]byte("changed"))
		return err
	}},
	{"mkfifo in own directory", 0, func(m string) error { return syscall.Mkfifo(join(m, "userdir", "fifo"), 0o600) }},
}

// runUnprivCases is the child's side: each case's errno, one per line.
func runUnprivCases(mnt string) {
	for _, c := range unprivCases {
		var errno syscall.Errno
		if err := c.op(mnt); err != nil && !errors.As(err, &errno) {
			errno = syscall.EIO
		}
		fmt.Printf("%s\t%d\n", c.name, int(errno))
	}
}

// TestPOSIXUnprivileged: the permission rules of POSIX, for a user who is
// not root, through a mount with allow_other: the kernel's checks
// (default_permissions) against the owners and modes blobfs stores and
// shows. Then, on a fresh mount, what the user changed is there.
func TestPOSIXUnprivileged(t *testing.T) {
	// Directories every user can reach: the mountpoint's parents and a
	// copy of this test binary.
	dir, bin := storetest.BinaryForOtherUsers(t, "blobfs-unpriv-")

	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		checkUnprivileged(t, s, bin, dir)
		clearStore(t, s)
	})
}

func checkUnprivileged(t *testing.T, s blobstore.Store, bin, dir string) {
	fsys, err := New(s, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mnt, err := os.MkdirTemp(dir, "mnt-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(mnt, 0o755)
	sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{AllowOther: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Unmount(true); fsys.Close() })

	// As root: the files the cases act on.
	mustWrite(t, join(mnt, "rootfile"), []byte("root's"))
	mustWrite(t, join(mnt, "private"), []byte("secret"))
	os.Chown(join(mnt, "private"), otherUID, otherUID)
	os.Chmod(join(mnt, "private"), 0o600)
	mustWrite(t, join(mnt, "userfile"), []byte("user's"))
	os.Chown(join(mnt, "userfile"), unprivUID, unprivGID)
	os.Mkdir(join(mnt, "userdir"), 0o755)
	os.Chown(join(mnt, "userdir"), unprivUID, unprivGID)
	os.Mkdir(join(mnt, "rootdir"), 0o755)
	os.Mkdir(join(mnt, "sticky"), 0o777)
	os.Chmod(join(mnt, "sticky"), 0o777|os.ModeSticky)
	for name, uid := range map[string]int{"others": otherUID, "mine": unprivUID} {
		mustWrite(t, join(mnt, "sticky", name), []byte("x"))
		os.Chown(join(mnt, "sticky", name), uid, uid)
	}
	mustWrite(t, join(mnt, "suid"), []byte("program"))
	os.Chown(join(mnt, "suid"), unprivUID, unprivGID)
	os.Chmod(join(mnt, "suid"), 0o755|os.ModeSetuid)

	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), unprivEnv+"="+mnt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: unprivUID, Gid: unprivGID, Groups: []uint32{unprivGID, unprivGroup}}}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the unprivileged process: %v\n%s", err, out)
	}
	got := map[string]syscall.Errno{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		name, code, ok := strings.Cut(sc.Text(), "\t")
		var n int
		if _, err := fmt.Sscan(code, &n); ok && err == nil {
			got[name] = syscall.Errno(n)
		}
	}
	for _, c := range unprivCases {
		if e, ok := got[c.name]; !ok {
			t.Errorf("%s: not run", c.name)
		} else if e != c.want {
			t.Errorf("%s: errno %d (%v), want %d (%v)", c.name, int(e), e, int(c.want), c.want)
		}
	}

	// What the user did is stored: seen again through a fresh mount.
	again, _ := mountStore(t, s, Options{})
	wantMode(t, join(again, "userfile"), syscall.S_IFREG|0o600)
	wantOwner(t, join(again, "userfile"), unprivUID, unprivGroup)
	wantTimes(t, join(again, "userfile"), t1, t2)
	wantOwner(t, join(again, "userdir", "new"), unprivUID, unprivGID)
	wantMode(t, join(again, "userdir", "new"), syscall.S_IFREG|0o640)
	wantMode(t, join(again, "userdir", "fifo"), syscall.S_IFIFO|0o600)
	// A write by a non-root user clears the set-user-ID bit (the kernel
	// asks, blobfs stores it).
	wantMode(t, join(again, "suid"), syscall.S_IFREG|0o755)
	if _, err := os.Stat(join(again, "sticky", "mine")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("own file in the sticky directory: %v, want it removed", err)
	}
}
