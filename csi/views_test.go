package csi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
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
	mount := func() (*kernel.Session, *fusefs.FS) {
		fsys, err := fusefs.New(store, fusefs.Options{CacheDir: t.TempDir(), AttrTimeout: time.Minute, EntryTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{})
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
		// Stopped, not only waited for: a thread of this process left
		// in the helper's namespace would keep it alive, and the test
		// would hang instead of failing (the thread is
		// TestVisitMountNamespaceReturnsHome's to find).
		helper.Process.Kill()
		helper.Wait()
		unix.Unmount(mnt, unix.MNT_DETACH)
		second.Stop()
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
	// That no thread of this process stays in the helper's namespace is
	// TestVisitMountNamespaceReturnsHome's: looked for here, after the
	// fact, such a thread is seen or not as the runtime happens to end it.
}

// startContainer starts a process in a mount namespace of its own (as a
// container is) that runs the shell script and then sleeps, and waits
// until ready says the namespace is set up. It returns the process's pid.
func startContainer(t *testing.T, script string, ready func(pid int) bool) int {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare(1)")
	}
	helper := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script+" && exec sleep 300")
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	exited := make(chan struct{})
	go func() {
		// The script failed, or the test is over.
		helper.Process.Wait()
		close(exited)
	}()
	pid := helper.Process.Pid
	waitFor(t, "the container's mounts", func() bool {
		select {
		case <-exited:
			t.Fatal("the container's script failed")
		default:
		}
		return ready(pid)
	})
	return pid
}

// TestVisitMountNamespaceReturnsHome: the thread that entered another
// mount namespace is back in this process's when visitMountNamespace
// returns. Checked on that thread, at once: the thread is discarded after
// (inMountNamespace), so a look at the process's threads afterwards finds
// a thread that stayed behind only if it has not ended yet, or never when
// it ran on the main thread, which the runtime wedges instead (then the
// namespace outlives its container, and so does a volume's connection).
func TestVisitMountNamespaceReturnsHome(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setns needs root")
	}
	pid := startContainer(t, "true", func(int) bool { return true })
	home, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	homeName, _ := os.Readlink("/proc/self/ns/mnt")
	nsName, _ := os.Readlink(ns.Name())
	type result struct {
		inside, after string
		err           error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		var r result
		r.err = visitMountNamespace(ns, home, func() error {
			r.inside, _ = os.Readlink("/proc/thread-self/ns/mnt")
			return nil
		})
		r.after, _ = os.Readlink("/proc/thread-self/ns/mnt")
		if r.after != homeName {
			// Not left there, whatever happens to the thread.
			unix.Setns(int(home.Fd()), unix.CLONE_NEWNS)
		}
		done <- r
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.inside != nsName {
		t.Errorf("fn ran in mount namespace %s; want the container's %s", r.inside, nsName)
	}
	if r.after != homeName {
		t.Errorf("after visitMountNamespace the thread is in mount namespace %s; want this process's %s", r.after, homeName)
	}
}

// TestReplaceDeadViewsKeepsNestedMounts: a container has mounts inside
// its view of a blobfs volume, as kubelet makes them for a configMap or a
// second volume below the volume's mount point: one whose filesystem is
// mounted in the driver's namespace too (a tmpfs here, bound read-only
// into the container, as a configMap is), one only the container has, and
// one whose directory is removed from the volume while it is down. The
// volume's server dies and the view is replaced: the nested mounts are
// still there, at the same paths, with the same content and still
// read-only, and the volume's own files read. The one only the container
// has comes back while the kernel still trusts the dead connection's
// names; once it does not (entry timeout past), no path reaches it and
// it is reported lost, as is the one whose directory is gone.
func TestReplaceDeadViewsKeepsNestedMounts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		entryTimeout time.Duration
		kept         []string // nested mount points, relative to the view
		lost         []string
	}{
		{name: "names cached", entryTimeout: time.Hour, kept: []string{"cfg", "private"}, lost: []string{"gone"}},
		{name: "names expired", entryTimeout: -1, kept: []string{"cfg"}, lost: []string{"private", "gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needFUSE(t)
			store := blobstore.NewMemory()
			root := t.TempDir()
			mnt, cm, gone := filepath.Join(root, "mnt"), filepath.Join(root, "configmap"), filepath.Join(root, "other")
			for _, d := range []string{mnt, cm, gone} {
				if err := os.Mkdir(d, 0o750); err != nil {
					t.Fatal(err)
				}
			}
			// The configMap and another volume, mounted in this
			// namespace as kubelet mounts them on the node.
			for _, d := range []string{cm, gone} {
				if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
			}
			if err := os.WriteFile(filepath.Join(cm, "key"), []byte("value\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			mount := func() (*kernel.Session, *fusefs.FS) {
				fsys, err := fusefs.New(store, fusefs.Options{CacheDir: t.TempDir(), AttrTimeout: tc.entryTimeout, EntryTimeout: tc.entryTimeout})
				if err != nil {
					t.Fatal(err)
				}
				sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return sess, fsys
			}
			first, firstFS := mount()
			for _, d := range []string{"cfg", "private", "gone"} {
				if err := os.Mkdir(filepath.Join(mnt, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(mnt, "top.txt"), []byte("top\n"), 0o644); err != nil {
				t.Fatal(err)
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
			script := fmt.Sprintf("mount --bind %[2]s %[1]s/cfg && mount -o remount,bind,ro %[1]s/cfg && "+
				"mount -t tmpfs -o size=1m private %[1]s/private && echo mine > %[1]s/private/file && "+
				"mount --bind %[3]s %[1]s/gone", mnt, cm, gone)
			pid := startContainer(t, script, func(pid int) bool {
				views, _ := viewsOf(fmt.Sprintf("/proc/%d/mountinfo", pid), pid, dev, "blobfs")
				return len(views) == 1 && len(views[0].nested) == 3
			})
			inHelper := func(p string) string { return filepath.Join("/proc", fmt.Sprint(pid), "root", mnt, p) }

			first.Stop()
			if err := first.Wait(); err != nil {
				t.Fatal(err)
			}
			firstFS.Close()
			// Only the view's root is asked: a lookup below it would
			// fail, and is what the repair must do without.
			var st unix.Statfs_t
			if err := unix.Statfs(inHelper("."), &st); !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
				t.Fatalf("statfs of the container's view after its server died: %v; want ENOTCONN", err)
			}
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			second, secondFS := mount()
			t.Cleanup(func() {
				unix.Unmount(mnt, unix.MNT_DETACH)
				second.Stop()
				second.Wait()
				secondFS.Close()
			})
			if err := os.Remove(filepath.Join(mnt, "gone")); err != nil {
				t.Fatal(err)
			}
			mp2, err := openMountPoint(root, "mnt", mnt, false)
			if err != nil {
				t.Fatal(err)
			}
			defer mp2.Close()

			r := replaceDeadViews("/proc", dev, "blobfs", mp2)
			if r.Err != nil || r.Replaced != 1 {
				t.Fatalf("ReplaceDeadViews: %+v; want the view replaced", r)
			}
			if b, err := os.ReadFile(inHelper("top.txt")); err != nil || string(b) != "top\n" {
				t.Errorf("the volume's file in the container after the repair: %q, %v", b, err)
			}
			if b, err := os.ReadFile(inHelper("cfg/key")); err != nil || string(b) != "value\n" {
				t.Errorf("the configMap inside the volume after the repair: %q, %v; want %q", b, err, "value\n")
			}
			if err := os.WriteFile(inHelper("cfg/new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
				t.Errorf("writing to the read-only configMap after the repair: %v; want EROFS", err)
			}
			if slices.Contains(tc.kept, "private") {
				if b, err := os.ReadFile(inHelper("private/file")); err != nil || string(b) != "mine\n" {
					t.Errorf("the container's own mount inside the volume after the repair: %q, %v", b, err)
				}
			}
			if r.Nested != len(tc.kept) || r.NestedLost != len(tc.lost) {
				t.Errorf("nested mounts kept %d, lost %d (%v); want %d kept (%v), %d lost (%v)", r.Nested, r.NestedLost, r.NestedErr, len(tc.kept), tc.kept, len(tc.lost), tc.lost)
			}
			for _, l := range tc.lost {
				if !strings.Contains(fmt.Sprint(r.NestedErr), filepath.Join(mnt, l)+" ") {
					t.Errorf("the report does not name %s: %v", l, r.NestedErr)
				}
			}
			if !strings.Contains(fmt.Sprint(r.NestedErr), "gone from the volume") {
				t.Errorf("the report does not say the mount point is gone from the volume: %v", r.NestedErr)
			}
		})
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
