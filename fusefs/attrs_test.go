package fusefs

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// attrCase is one POSIX attribute behaviour. do acts on a mount (mnt) and
// checks what it shows; then see runs on a second, fresh mount of the same
// store: what was set must have persisted.
type attrCase struct {
	name string
	root bool // needs root (chown to others, device nodes)
	do   func(t *testing.T, mnt string, s blobstore.Store)
	see  func(t *testing.T, mnt string)
}

func lstat(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return &st
}

func wantMode(t *testing.T, path string, want uint32) {
	t.Helper()
	if got := lstat(t, path).Mode; got != want {
		t.Errorf("%s: mode %#o, want %#o", path, got, want)
	}
}

func wantOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	if st := lstat(t, path); st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: owner %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}

func tsTime(ts syscall.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }

func wantTimes(t *testing.T, path string, atime, mtime time.Time) {
	t.Helper()
	st := lstat(t, path)
	if a := tsTime(st.Atim); !atime.IsZero() && !a.Equal(atime) {
		t.Errorf("%s: atime %v, want %v", path, a, atime)
	}
	if m := tsTime(st.Mtim); !mtime.IsZero() && !m.Equal(mtime) {
		t.Errorf("%s: mtime %v, want %v", path, m, mtime)
	}
}

var (
	t1 = time.Date(2001, 2, 3, 4, 5, 6, 7000, time.UTC)
	t2 = time.Date(2011, 12, 13, 14, 15, 16, 17000, time.UTC)
)

var attrCases = []attrCase{
	{name: "CreateModeAndOwner", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		f, err := os.OpenFile(join(mnt, "f"), os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Mkdir(join(mnt, "d"), 0o750); err != nil {
			t.Fatal(err)
		}
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|0o640)
		wantMode(t, join(mnt, "d"), syscall.S_IFDIR|0o750)
		wantOwner(t, join(mnt, "f"), uint32(os.Getuid()), uint32(os.Getgid()))
	}, see: func(t *testing.T, mnt string) {
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|0o640)
		wantMode(t, join(mnt, "d"), syscall.S_IFDIR|0o750)
		wantOwner(t, join(mnt, "d"), uint32(os.Getuid()), uint32(os.Getgid()))
	}},
	{name: "Chmod", do: func(t *testing.T, mnt string, s blobstore.Store) {
		mustWrite(t, join(mnt, "f"), []byte("x"))
		os.Mkdir(join(mnt, "sticky"), 0o755)
		os.Mkdir(join(mnt, "sgid"), 0o755)
		for path, mode := range map[string]os.FileMode{
			"f": 0o755 | os.ModeSetuid, "sticky": 0o777 | os.ModeSticky, "sgid": 0o775 | os.ModeSetgid,
		} {
			if err := os.Chmod(join(mnt, path), mode); err != nil {
				t.Fatalf("chmod %s: %v", path, err)
			}
		}
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|syscall.S_ISUID|0o755)
		a, err := s.Stat(context.Background(), "f")
		if v, _ := meta.Value(a.Metadata, blobstore.MetaMode); err != nil || v != "104755" {
			t.Errorf("blob f: %s=%q, %v; want 104755", blobstore.MetaMode, v, err)
		}
	}, see: func(t *testing.T, mnt string) {
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|syscall.S_ISUID|0o755)
		wantMode(t, join(mnt, "sticky"), syscall.S_IFDIR|syscall.S_ISVTX|0o777)
		wantMode(t, join(mnt, "sgid"), syscall.S_IFDIR|syscall.S_ISGID|0o775)
		if got := string(mustRead(t, join(mnt, "f"))); got != "x" {
			t.Errorf("content after chmod: %q", got)
		}
	}},
	{name: "ChmodWhileWriting", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		f, err := os.Create(join(mnt, "f"))
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("before")
		if err := f.Chmod(0o700); err != nil {
			t.Fatal(err)
		}
		f.WriteString(" after")
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|0o700)
	}, see: func(t *testing.T, mnt string) {
		wantMode(t, join(mnt, "f"), syscall.S_IFREG|0o700)
		if got := string(mustRead(t, join(mnt, "f"))); got != "before after" {
			t.Errorf("content: %q", got)
		}
	}},
	{name: "ScriptRuns", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		if err := os.WriteFile(join(mnt, "run.sh"), []byte("#!/bin/sh\necho ran \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}, see: func(t *testing.T, mnt string) {
		// Through a shell: the test process serves the mount, and a
		// program it starts runs vfork-style, its thread held until the
		// exec is done; an exec that reads from this process's own
		// mount would wait for itself. The shell's exec of the script is
		// what a user's is.
		out, err := exec.Command("/bin/sh", "-c", `"$0" ok`, join(mnt, "run.sh")).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ran ok" {
			t.Errorf("running a script from the volume: %v, %q", err, out)
		}
	}},
	{name: "Chown", root: true, do: func(t *testing.T, mnt string, _ blobstore.Store) {
		mustWrite(t, join(mnt, "f"), []byte("x"))
		os.Mkdir(join(mnt, "d"), 0o755)
		if err := os.Symlink("f", join(mnt, "l")); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"f", "d"} {
			if err := os.Chown(join(mnt, p), 1234, 5678); err != nil {
				t.Fatalf("chown %s: %v", p, err)
			}
		}
		wantOwner(t, join(mnt, "f"), 1234, 5678)
		if err := os.Lchown(join(mnt, "l"), 4321, 8765); err != nil {
			t.Fatalf("lchown of a symlink: %v", err)
		}
		wantOwner(t, join(mnt, "l"), 4321, 8765)
		wantOwner(t, join(mnt, "f"), 1234, 5678) // not followed
		// A chown by root of a set-user-ID file keeps it (Linux clears it
		// for non-root callers only when they are not the owner).
		if err := os.Chown(join(mnt, "f"), 1234, 42); err != nil {
			t.Fatal(err)
		}
	}, see: func(t *testing.T, mnt string) {
		wantOwner(t, join(mnt, "f"), 1234, 42)
		wantOwner(t, join(mnt, "d"), 1234, 5678)
		wantOwner(t, join(mnt, "l"), 4321, 8765)
	}},
	{name: "RenamedDirKeepsAttrs", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		if err := os.Mkdir(join(mnt, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, join(mnt, "d", "f"), []byte("x"))
		if err := os.Chmod(join(mnt, "d", "f"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(join(mnt, "d"), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(join(mnt, "d"), join(mnt, "e")); err != nil {
			t.Fatal(err)
		}
		wantMode(t, join(mnt, "e"), syscall.S_IFDIR|0o711)
		wantMode(t, join(mnt, "e", "f"), syscall.S_IFREG|0o600)
	}, see: func(t *testing.T, mnt string) {
		wantMode(t, join(mnt, "e"), syscall.S_IFDIR|0o711)
		wantMode(t, join(mnt, "e", "f"), syscall.S_IFREG|0o600)
	}},
	{name: "UtimensAtimeMtime", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		mustWrite(t, join(mnt, "f"), []byte("x"))
		os.Mkdir(join(mnt, "d"), 0o755)
		for _, p := range []string{"f", "d"} {
			if err := os.Chtimes(join(mnt, p), t1, t2); err != nil {
				t.Fatal(err)
			}
			wantTimes(t, join(mnt, p), t1, t2)
			if c := tsTime(lstat(t, join(mnt, p)).Ctim); c.Before(time.Now().Add(-time.Minute)) {
				t.Errorf("%s: ctime %v after utimensat; want now (utimensat changes the status)", p, c)
			}
		}
		// UTIME_OMIT keeps atime; UTIME_NOW sets mtime to now.
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_NOW}}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, join(mnt, "d"), ts, 0); err != nil {
			t.Fatal(err)
		}
		st := lstat(t, join(mnt, "d"))
		if !tsTime(st.Atim).Equal(t1) || time.Since(tsTime(st.Mtim)) > time.Minute {
			t.Errorf("d after OMIT/NOW: atime %v mtime %v", tsTime(st.Atim), tsTime(st.Mtim))
		}
		if err := os.Chtimes(join(mnt, "d"), t1, t2); err != nil {
			t.Fatal(err)
		}
	}, see: func(t *testing.T, mnt string) {
		wantTimes(t, join(mnt, "f"), t1, t2)
		wantTimes(t, join(mnt, "d"), t1, t2)
	}},
	{name: "DirTimesFollowEntries", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		os.Mkdir(join(mnt, "d"), 0o755)
		if err := os.Chtimes(join(mnt, "d"), t1, t1); err != nil {
			t.Fatal(err)
		}
		for _, step := range []func() error{
			func() error { return os.WriteFile(join(mnt, "d", "f"), []byte("x"), 0o644) },
			func() error { return os.Rename(join(mnt, "d", "f"), join(mnt, "d", "g")) },
			func() error { return os.Remove(join(mnt, "d", "g")) },
			func() error { return os.Mkdir(join(mnt, "d", "sub"), 0o755) },
		} {
			if err := os.Chtimes(join(mnt, "d"), t1, t1); err != nil {
				t.Fatal(err)
			}
			if err := step(); err != nil {
				t.Fatal(err)
			}
			st := lstat(t, join(mnt, "d"))
			if time.Since(tsTime(st.Mtim)) > time.Minute || time.Since(tsTime(st.Ctim)) > time.Minute {
				t.Errorf("directory times did not follow a change of its entries: mtime %v ctime %v", tsTime(st.Mtim), tsTime(st.Ctim))
			}
		}
	}},
	{name: "SpecialFiles", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		if err := syscall.Mkfifo(join(mnt, "fifo"), 0o640); err != nil {
			t.Fatal(err)
		}
		wantMode(t, join(mnt, "fifo"), syscall.S_IFIFO|0o640)
		l, err := net.Listen("unix", join(mnt, "sock"))
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false) // the socket file stays, as a C server's does
		l.Close()
		if st := lstat(t, join(mnt, "sock")); st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
			t.Errorf("sock: mode %#o, want a socket", st.Mode)
		}
		// A FIFO works as one: the kernel serves it.
		done := make(chan string, 1)
		go func() {
			b, _ := os.ReadFile(join(mnt, "fifo"))
			done <- string(b)
		}()
		w, err := os.OpenFile(join(mnt, "fifo"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteString("through the pipe")
		w.Close()
		select {
		case got := <-done:
			if got != "through the pipe" {
				t.Errorf("fifo read %q", got)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("fifo read hangs")
		}
	}, see: func(t *testing.T, mnt string) {
		wantMode(t, join(mnt, "fifo"), syscall.S_IFIFO|0o640)
		if st := lstat(t, join(mnt, "sock")); st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
			t.Errorf("sock: mode %#o after remount, want a socket", st.Mode)
		}
		if err := os.Remove(join(mnt, "fifo")); err != nil {
			t.Errorf("remove fifo: %v", err)
		}
	}},
	{name: "DeviceNodes", root: true, do: func(t *testing.T, mnt string, _ blobstore.Store) {
		if err := syscall.Mknod(join(mnt, "null"), syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(join(mnt, "blk"), syscall.S_IFBLK|0o600, int(unix.Mkdev(7, 1))); err != nil {
			t.Fatal(err)
		}
	}, see: func(t *testing.T, mnt string) {
		st := lstat(t, join(mnt, "null"))
		if st.Mode != syscall.S_IFCHR|0o600 || st.Rdev != unix.Mkdev(1, 3) {
			t.Errorf("null: mode %#o rdev %#x", st.Mode, st.Rdev)
		}
		if st := lstat(t, join(mnt, "blk")); st.Mode != syscall.S_IFBLK|0o600 || st.Rdev != unix.Mkdev(7, 1) {
			t.Errorf("blk: mode %#o rdev %#x", st.Mode, st.Rdev)
		}
		// The mount is nodev: a device node is not a way into a device.
		if f, err := os.Open(join(mnt, "null")); err == nil {
			f.Close()
			t.Error("a device node on the mount opened")
		}
	}},
	{name: "Nlink", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		os.MkdirAll(join(mnt, "d", "a"), 0o755)
		os.MkdirAll(join(mnt, "d", "b"), 0o755)
		mustWrite(t, join(mnt, "d", "f"), []byte("x"))
		if _, err := os.ReadDir(join(mnt, "d")); err != nil {
			t.Fatal(err)
		}
		if n := lstat(t, join(mnt, "d")).Nlink; n != 4 {
			t.Errorf("directory with 2 subdirectories: nlink %d, want 4", n)
		}
		f, err := os.Open(join(mnt, "d", "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := os.Remove(join(mnt, "d", "f")); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Nlink != 0 {
			t.Errorf("open file after unlink: nlink %d (%v), want 0", st.Nlink, err)
		}
	}},
	{name: "Unsupported", do: func(t *testing.T, mnt string, _ blobstore.Store) {
		mustWrite(t, join(mnt, "f"), []byte("x"))
		wantErrno(t, os.Link(join(mnt, "f"), join(mnt, "g")), syscall.EPERM)
		wantErrno(t, os.WriteFile(join(mnt, strings.Repeat("n", 256)), nil, 0o644), syscall.ENAMETOOLONG)
	}},
}

// TestPOSIXAttributes: modes, owners, times and special files, set through
// one mount, seen there, and seen again through a fresh mount of the same
// store (the attributes persisted in blob metadata), on every backend.
func TestPOSIXAttributes(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		for _, c := range attrCases {
			t.Run(c.name, func(t *testing.T) {
				if c.root && os.Geteuid() != 0 {
					t.Skip("needs root")
				}
				mnt, _ := mountStore(t, s, Options{})
				c.do(t, mnt, s)
				if c.see != nil {
					again, _ := mountStore(t, s, Options{})
					c.see(t, again)
				}
			})
			clearStore(t, s)
		}
	})
}

// TestAttributesFromOtherTools: a blob written by rclone shows rclone's
// modification time; one without any attribute shows the mount's defaults,
// and a mount that forces them shows them whatever is stored.
func TestAttributesFromOtherTools(t *testing.T) {
	s := storetest.Memory(t)
	putBlob(t, s, "rclone.txt", []byte("x"), map[string]string{blobstore.MetaRcloneMtime: "2011-12-13T14:15:16.000017Z"})
	putBlob(t, s, "plain.txt", []byte("x"), nil)
	putBlob(t, s, "owned.txt", []byte("x"), map[string]string{blobstore.MetaMode: "100700", blobstore.MetaUID: "1234", blobstore.MetaGID: "5678"})
	mnt, _ := mountStore(t, s, Options{UID: 11, GID: 22, Umask: 0o027})
	wantTimes(t, join(mnt, "rclone.txt"), time.Time{}, t2)
	wantMode(t, join(mnt, "plain.txt"), syscall.S_IFREG|0o640)
	wantOwner(t, join(mnt, "plain.txt"), 11, 22)
	wantMode(t, join(mnt, "owned.txt"), syscall.S_IFREG|0o700)
	wantOwner(t, join(mnt, "owned.txt"), 1234, 5678)

	forced, _ := mountStore(t, s, Options{UID: 11, GID: 22, Umask: 0o022, ForceOwner: true, ForcePerm: true})
	wantMode(t, join(forced, "owned.txt"), syscall.S_IFREG|0o644)
	wantOwner(t, join(forced, "owned.txt"), 11, 22)
	wantErrno(t, os.Chmod(join(forced, "owned.txt"), 0o600), syscall.EPERM)
	wantErrno(t, os.Chown(join(forced, "owned.txt"), 1, 1), syscall.EPERM)

	off, _ := mountStore(t, s, Options{NoAttrWrites: true})
	wantErrno(t, os.Chmod(join(off, "plain.txt"), 0o600), syscall.EPERM)
	wantErrno(t, syscall.Mkfifo(join(off, "fifo"), 0o644), syscall.EPERM)
	mustWrite(t, join(off, "new.txt"), []byte("x"))
	a, err := s.Stat(context.Background(), "new.txt")
	if _, has := meta.Value(a.Metadata, blobstore.MetaMode); err != nil || has {
		t.Errorf("a mount that never writes attributes wrote %v (%v)", a.Metadata, err)
	}
}

// TestAttributesSurviveServerKill: a file created with a mode and still
// being written when its server is killed keeps that mode: the attributes
// of a file not yet committed live in its spill file's record, which the
// next server reads when it adopts the mount.
func TestAttributesSurviveServerKill(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	f, err := os.OpenFile(join(h.mnt, "private"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("before"); err != nil {
		t.Fatal(err)
	}
	h.kill()
	h.start()
	if _, err := f.WriteString(" after"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("close after the restart: %v", err)
	}
	wantMode(t, join(h.mnt, "private"), syscall.S_IFREG|0o600)
	a, err := h.localStore().Stat(context.Background(), "private")
	if v, _ := meta.Value(a.Metadata, blobstore.MetaMode); err != nil || v != "100600" {
		t.Fatalf("blob private: %s=%q (%v), want 100600", blobstore.MetaMode, v, err)
	}

	// A node the new process knows only by name (the kernel holds it;
	// no lookup comes) changes from its stored attributes, not from the
	// mount's defaults: a chmod keeps the owner and group. (A chown would
	// not show it: the kernel asks for the attributes before a chown of a
	// file, to clear the set-user-ID bit.)
	if err := os.WriteFile(join(h.mnt, "owned"), []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(join(h.mnt, "owned"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(join(h.mnt, "owned"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	h.kill()
	h.start()
	if err := g.Chmod(0o604); err != nil {
		t.Fatalf("fchmod after the restart: %v", err)
	}
	a, err = h.localStore().Stat(context.Background(), "owned")
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{blobstore.MetaMode: "100604", blobstore.MetaUID: "1234", blobstore.MetaGID: "5678"} {
		if v, _ := meta.Value(a.Metadata, key); v != want {
			t.Errorf("blob owned after fchmod: %s=%q, want %q", key, v, want)
		}
	}
}

// TestFailedSetattrChangesNothing: a chmod the store refuses is EIO and
// leaves the attributes as they were: the next change that succeeds does
// not store the refused mode with it.
func TestFailedSetattrChangesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (utimes of another's file)")
	}
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	putBlob(t, faulty, "f", []byte("x"), map[string]string{blobstore.MetaMode: "100640"})
	mnt, _ := mountStore(t, faulty, Options{})
	wantMode(t, join(mnt, "f"), syscall.S_IFREG|0o640)
	faulty.FailNext(blobstore.OpSetMetadata, 1_000_000, fmt.Errorf("injected: %w", blobstore.ErrTransient))
	wantErrno(t, os.Chmod(join(mnt, "f"), 0o755), syscall.EIO)
	faulty.ClearFaults()
	if err := os.Chtimes(join(mnt, "f"), t1, t2); err != nil {
		t.Fatal(err)
	}
	a, err := faulty.Stat(context.Background(), "f")
	if v, _ := meta.Value(a.Metadata, blobstore.MetaMode); err != nil || v != "100640" {
		t.Errorf("blob f after a refused chmod and a utimes: %s=%q (%v), want 100640", blobstore.MetaMode, v, err)
	}
}

// BenchmarkEntryFromAttrs: what reading POSIX attributes adds to each entry
// of a listing (a container written by blobfs carries four keys per blob;
// other tools' blobs none).
func BenchmarkEntryFromAttrs(b *testing.B) {
	now := time.Now()
	for _, bc := range []struct {
		name string
		md   map[string]string
	}{
		{"without attributes", nil},
		{"with attributes", map[string]string{blobstore.MetaMode: "100644", blobstore.MetaUID: "1000", blobstore.MetaGID: "1000", blobstore.MetaAtime: fmt.Sprint(now.UnixNano())}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a := blobstore.Attrs{Name: "dir/file", Size: 4096, ModTime: now, ETag: `"0x1"`, Metadata: bc.md}
			for b.Loop() {
				_ = meta.EntryOf(a)
			}
		})
	}
}

// TestRootMode: the root directory (the container, which has no blob) shows
// Options.RootMode; with the set-group-ID bit there, entries made in it
// take the mount's group whoever makes them, and directories pass the bit
// on: what the CSI driver relies on for a pod's fsGroup.
func TestRootMode(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	s := storetest.Memory(t)
	putBlob(t, s, "plain.txt", []byte("x"), nil)
	mnt, _ := mountStore(t, s, Options{GID: 2000, RootMode: 0o2777})
	wantMode(t, mnt, syscall.S_IFDIR|syscall.S_ISGID|0o777)
	wantOwner(t, mnt, 0, 2000)
	wantOwner(t, join(mnt, "plain.txt"), 0, 2000)
	mustWrite(t, join(mnt, "new.txt"), []byte("x"))
	wantOwner(t, join(mnt, "new.txt"), uint32(os.Geteuid()), 2000)
	if err := os.Mkdir(join(mnt, "d"), 0o750); err != nil {
		t.Fatal(err)
	}
	wantMode(t, join(mnt, "d"), syscall.S_IFDIR|syscall.S_ISGID|0o750)
	wantOwner(t, join(mnt, "d"), uint32(os.Geteuid()), 2000)

	// Without it, the root is a directory like any other.
	plain, _ := mountStore(t, s, Options{GID: 22, Umask: 0o022})
	wantMode(t, plain, syscall.S_IFDIR|0o755)
	if _, err := New(s, Options{RootMode: 0o10000}); err == nil {
		t.Error("New accepted a root mode beyond 07777")
	}
}
