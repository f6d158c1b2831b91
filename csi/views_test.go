package csi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// TestReplaceDeadViews: a process in a mount namespace of its own (as a
// container is) has three views of a blobfs mount: the mount itself, a
// read-only bind of it and a bind of one of its directories (a subPath).
// The mount's server dies; the volume is mounted again in the test's
// namespace; ReplaceDeadViews gives the other namespace working views in
// place: same paths, same directory, still read-only where it was, and
// nothing of the dead connection left there.
func TestReplaceDeadViews(t *testing.T) {
	needFUSE(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	store := blobstore.NewMemory()
	root := t.TempDir()
	mnt, ro, sub := filepath.Join(root, "mnt"), filepath.Join(root, "ro"), filepath.Join(root, "sub")
	for _, d := range []string{mnt, ro, sub} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	mount := func() (*fusefs.Session, *fusefs.FS) {
		fsys, err := fusefs.New(store, fusefs.Options{CacheDir: t.TempDir(), AttrTimeout: time.Minute, EntryTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		sess, err := fusefs.Mount(mnt, fsys, fusefs.MountOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sess, fsys
	}
	first, firstFS := mount()
	if err := os.MkdirAll(filepath.Join(mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"top.txt": "top\n", "dir/inner.txt": "inner\n"} {
		if err := os.WriteFile(filepath.Join(mnt, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mp, err := openMountPoint(root, "mnt", mnt, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	dev, err := mountDevice(mp)
	if err != nil {
		t.Fatal(err)
	}

	// The "container": its own mount namespace, with the views made in it.
	script := fmt.Sprintf("mount --bind %[1]s %[2]s && mount -o remount,bind,ro %[2]s && mount --bind %[1]s/dir %[3]s && exec sleep 300", mnt, ro, sub)
	helper := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	pid := helper.Process.Pid
	inHelper := func(p string) string { return filepath.Join("/proc", fmt.Sprint(pid), "root", p) }
	waitFor(t, "the helper's views", func() bool {
		views, _ := viewsOf(fmt.Sprintf("/proc/%d/mountinfo", pid), pid, dev, "blobfs")
		return len(views) == 3
	})

	// The server dies without unmounting (a killed driver and keeper).
	first.Stop()
	if err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	firstFS.Close()
	if _, err := os.ReadFile(inHelper(filepath.Join(sub, "inner.txt"))); err == nil {
		t.Fatal("the helper's view still works after its server died: the test would prove nothing")
	}
	// The repair in this namespace: the dead mount out, a new one in.
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	second, secondFS := mount()
	t.Cleanup(func() {
		// The helper's views hold the connection too: it goes first.
		helper.Process.Kill()
		helper.Wait()
		unix.Unmount(mnt, unix.MNT_DETACH)
		second.Wait()
		secondFS.Close()
	})
	mp2, err := openMountPoint(root, "mnt", mnt, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mp2.Close()

	if r := replaceDeadViews("/proc", dev, "blobfs:another", mp2); r.Namespaces != 0 {
		t.Fatalf("views of another container's mounts were taken for this one's: %+v", r)
	}
	r := replaceDeadViews("/proc", dev, "blobfs", mp2)
	if r.Err != nil || r.Namespaces != 1 || r.Replaced != 3 || r.Failed != 0 {
		t.Fatalf("ReplaceDeadViews: %+v; want 3 views of 1 namespace replaced", r)
	}
	for path, want := range map[string]string{
		filepath.Join(mnt, "top.txt"): "top\n", filepath.Join(ro, "top.txt"): "top\n", filepath.Join(sub, "inner.txt"): "inner\n",
	} {
		if b, err := os.ReadFile(inHelper(path)); err != nil || string(b) != want {
			t.Errorf("%s in the helper's namespace: %q, %v; want %q", path, b, err, want)
		}
	}
	if err := os.WriteFile(inHelper(filepath.Join(mnt, "new.txt")), []byte("new\n"), 0o644); err != nil {
		t.Errorf("writing through the helper's repaired view: %v", err)
	}
	if err := os.WriteFile(inHelper(filepath.Join(ro, "nope.txt")), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing through the helper's read-only view after the repair: %v; want EROFS", err)
	}
	if views, _ := viewsOf(fmt.Sprintf("/proc/%d/mountinfo", pid), pid, dev, "blobfs"); len(views) != 0 {
		t.Errorf("the helper's namespace still holds mounts of the dead connection: %+v", views)
	}
	// A second pass finds nothing to do.
	if r := replaceDeadViews("/proc", dev, "blobfs", mp2); r.Namespaces != 0 || r.Replaced != 0 || r.Err != nil {
		t.Errorf("second pass: %+v; want nothing done", r)
	}
	// Live mounts are never replaced, even when found by their device
	// (a dead connection's number given to a new mount): the helper's
	// views are of the working connection now.
	dev2, err := mountDevice(mp2)
	if err != nil {
		t.Fatal(err)
	}
	if r := replaceDeadViews("/proc", dev2, "blobfs", mp2); r.Live != 3 || r.Replaced != 0 || r.Failed != 0 {
		t.Errorf("live views found by their device: %+v; want 3 left alone", r)
	}
	// No thread of this process stays in the helper's namespace (it would
	// keep the namespace and the connection alive after the container).
	home, _ := os.Readlink("/proc/self/ns/mnt")
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/mnt")
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != home {
			t.Errorf("%s is in mount namespace %s, not this process's %s", task, ns, home)
		}
	}
}

// TestViewsOfParsesMountinfo: escapes, read-only flags and the root of a
// bind mount are read as the kernel writes them.
func TestViewsOfParsesMountinfo(t *testing.T) {
	f := filepath.Join(t.TempDir(), "mountinfo")
	lines := []string{
		`36 35 0:52 / /data rw,nosuid,nodev,relatime shared:1 - fuse.blobfs blobfs:c rw,user_id=0`,
		`37 35 0:52 /sub\040dir /with\040space ro,relatime - fuse.blobfs blobfs:c rw`,
		`38 35 0:53 / /other rw - fuse.blobfs blobfs:d rw`,
		`39 35 0:52 / /another-container rw - fuse.blobfs blobfs:e rw`,
		`40 35 0:52 / /not-blobfs rw - fuse.sshfs blobfs:c rw`,
	}
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	views, err := viewsOf(f, 7, "0:52", "blobfs:c")
	if err != nil {
		t.Fatal(err)
	}
	want := []deadView{
		{pid: 7, mountPoint: "/with space", root: "/sub dir", readOnly: true},
		{pid: 7, mountPoint: "/data", root: "/"},
	}
	if fmt.Sprint(views) != fmt.Sprint(want) {
		t.Errorf("views: %+v\nwant %+v", views, want)
	}
}
