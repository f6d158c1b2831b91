package fusefs

import (
	"context"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// resentCase is one namespace change whose serving process dies during it.
type resentCase struct {
	op string // as crashPoint names it
	// name returns the name the crash point matches (the request's name,
	// or the old name of a rename) for a variant of the case.
	name func(variant string) string
	// setup prepares the namespace through the mount; nil if nothing.
	setup func(t *testing.T, mnt, variant string)
	// do is the application's call, run while the server dies.
	do func(mnt, variant string) error
	// check verifies the namespace afterwards, through the mount and in
	// the store.
	check func(t *testing.T, mnt string, s blobstore.Store, variant string)
}

var resentCases = []resentCase{
	{
		op:   "mkdir",
		name: func(v string) string { return "dir-" + v },
		do:   func(mnt, v string) error { return os.Mkdir(join(mnt, "dir-"+v), 0o755) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if st, err := os.Stat(join(mnt, "dir-"+v)); err != nil || !st.IsDir() {
				t.Fatalf("dir-%s: %v %v, want a directory", v, st, err)
			}
			if a, err := s.Stat(context.Background(), "dir-"+v); err != nil || !meta.True(a.Metadata, blobstore.MetaIsFolder) {
				t.Fatalf("marker of dir-%s: %+v %v", v, a, err)
			}
		},
	},
	{
		op:   "mknod",
		name: func(v string) string { return "node-" + v },
		do: func(mnt, v string) error {
			return syscall.Mknod(join(mnt, "node-"+v), syscall.S_IFREG|0o644, 0)
		},
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if st, err := os.Stat(join(mnt, "node-"+v)); err != nil || !st.Mode().IsRegular() || st.Size() != 0 {
				t.Fatalf("node-%s: %v %v, want an empty file", v, st, err)
			}
			wantBlob(t, s, "node-"+v, nil)
		},
	},
	{
		op:   "symlink",
		name: func(v string) string { return "link-" + v },
		do:   func(mnt, v string) error { return os.Symlink("target-"+v, join(mnt, "link-"+v)) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if got, err := os.Readlink(join(mnt, "link-"+v)); err != nil || got != "target-"+v {
				t.Fatalf("readlink link-%s: %q %v", v, got, err)
			}
			wantBlob(t, s, "link-"+v, []byte("target-"+v))
		},
	},
	{
		op:   "create",
		name: func(v string) string { return "new-" + v },
		do: func(mnt, v string) error {
			return writeAndClose(join(mnt, "new-"+v), os.O_CREATE|os.O_EXCL|os.O_WRONLY, []byte("created "+v))
		},
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if got, err := os.ReadFile(join(mnt, "new-"+v)); err != nil || string(got) != "created "+v {
				t.Fatalf("new-%s: %q %v", v, got, err)
			}
			wantBlob(t, s, "new-"+v, []byte("created "+v))
		},
	},
	{
		op:    "unlink",
		name:  func(v string) string { return "gone-" + v },
		setup: func(t *testing.T, mnt, v string) { mustWrite(t, join(mnt, "gone-"+v), []byte(v)) },
		do:    func(mnt, v string) error { return os.Remove(join(mnt, "gone-"+v)) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if _, err := os.Lstat(join(mnt, "gone-"+v)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("gone-%s after unlink: %v, want ENOENT", v, err)
			}
			wantNoBlob(t, s, "gone-"+v)
		},
	},
	{
		op:   "rmdir",
		name: func(v string) string { return "empty-" + v },
		setup: func(t *testing.T, mnt, v string) {
			if err := os.Mkdir(join(mnt, "empty-"+v), 0o755); err != nil {
				t.Fatal(err)
			}
		},
		do: func(mnt, v string) error { return os.Remove(join(mnt, "empty-"+v)) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if _, err := os.Lstat(join(mnt, "empty-"+v)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("empty-%s after rmdir: %v, want ENOENT", v, err)
			}
			wantNoBlob(t, s, "empty-"+v)
		},
	},
	{
		op:    "rename",
		name:  func(v string) string { return "from-" + v },
		setup: func(t *testing.T, mnt, v string) { mustWrite(t, join(mnt, "from-"+v), []byte("moved "+v)) },
		do:    func(mnt, v string) error { return os.Rename(join(mnt, "from-"+v), join(mnt, "to-"+v)) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if _, err := os.Lstat(join(mnt, "from-"+v)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("from-%s after rename: %v, want ENOENT", v, err)
			}
			if got, err := os.ReadFile(join(mnt, "to-"+v)); err != nil || string(got) != "moved "+v {
				t.Fatalf("to-%s: %q %v", v, got, err)
			}
			wantNoBlob(t, s, "from-"+v)
			wantBlob(t, s, "to-"+v, []byte("moved "+v))
		},
	},
	{
		op:   "rename",
		name: func(v string) string { return "fromdir-" + v },
		setup: func(t *testing.T, mnt, v string) {
			if err := os.Mkdir(join(mnt, "fromdir-"+v), 0o755); err != nil {
				t.Fatal(err)
			}
			mustWrite(t, join(mnt, "fromdir-"+v, "inside"), []byte("inside "+v))
		},
		do: func(mnt, v string) error { return os.Rename(join(mnt, "fromdir-"+v), join(mnt, "todir-"+v)) },
		check: func(t *testing.T, mnt string, s blobstore.Store, v string) {
			if _, err := os.Lstat(join(mnt, "fromdir-"+v)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("fromdir-%s after rename: %v, want ENOENT", v, err)
			}
			if got, err := os.ReadFile(join(mnt, "todir-"+v, "inside")); err != nil || string(got) != "inside "+v {
				t.Fatalf("todir-%s/inside: %q %v", v, got, err)
			}
			wantNoBlob(t, s, "fromdir-"+v+"/inside")
			wantBlob(t, s, "todir-"+v+"/inside", []byte("inside "+v))
		},
	},
}

// crashAndRestart runs do while the serving process kills itself at the
// crash point where, restarts a server (which adopts the mount and has the
// kernel resend what the dead one had taken) and returns do's result.
func crashAndRestart(t *testing.T, h *restartHarness, where string, do func() error) error {
	t.Helper()
	defer func(parent *testing.T) { h.t = parent }(h.t)
	h.t = t // failures belong to the subtest
	h.kill()
	h.start("BLOBFS_TEST_CRASH=" + where)
	result := make(chan error, 1)
	go func() { result <- do() }()
	h.waitExit()
	h.start()
	select {
	case err := <-result:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s: the application's call did not return within a minute of the restart", where)
		return nil
	}
}

// waitNoSpillFiles waits until every spill file is gone: the handles are
// released and none was left behind by a request answered twice. Emptied
// files kept for reuse (spillpool.go) may stay; they must be empty.
func waitNoSpillFiles(t *testing.T, cacheDir string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(cacheDir, "spill", spillPrefix+"*"))
		pooled, _ := filepath.Glob(filepath.Join(cacheDir, "spill", pooledPrefix+"*"))
		for _, p := range pooled {
			if st, err := os.Stat(p); err == nil && st.Size() != 0 {
				t.Fatalf("pooled spill file %s holds %d bytes, want none", p, st.Size())
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spill files left behind: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResentNamespaceChangesAnswerOnce: for each namespace change, the
// serving process dies after the store changed but before the reply
// ("store": before the tables changed too; "reply": after). A create
// changes no store: its "store" is after its spill file was made. The kernel
// resends the request to the next server, which must answer what the first
// would have: the application's call succeeds (not EEXIST or ENOENT) and
// the namespace shows the change once. "begin" (the server dies before
// anything happened, so the resent request is unknown to the state region)
// must simply run the request.
func TestResentNamespaceChangesAnswerOnce(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	store := h.localStore()
	for _, c := range resentCases {
		for _, point := range []string{"begin", "store", "reply"} {
			variant := point
			where := c.op + "/" + point + "/" + c.name(variant)
			t.Run(c.op+"/"+c.name(variant), func(t *testing.T) {
				if c.setup != nil {
					c.setup(t, h.mnt, variant)
				}
				if err := crashAndRestart(t, h, where, func() error { return c.do(h.mnt, variant) }); err != nil {
					t.Fatalf("%s with the server killed at %s: %v, want success", c.op, point, err)
				}
				c.check(t, h.mnt, store, variant)
				waitNoSpillFiles(t, h.cache)
			})
		}
	}
}

// TestCommitWithLostAnswer: the serving process dies after a file's commit
// reached the store and before it answered the FLUSH of close(2). The
// restarted server's commit finds the blob changed (its If-Match or
// If-None-Match fails) by its own predecessor, recognises the commit's
// nonce, and close succeeds with the data in the store once.
func TestCommitWithLostAnswer(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	store := h.localStore()

	t.Run("append to an existing blob (If-Match)", func(t *testing.T) {
		mustWrite(t, join(h.mnt, "log"), []byte("line 1\n"))
		err := crashAndRestart(t, h, "commit/store/log", func() error {
			return writeAndClose(join(h.mnt, "log"), os.O_WRONLY|os.O_APPEND, []byte("line 2\n"))
		})
		if err != nil {
			t.Fatalf("close with the server killed after its commit: %v, want success", err)
		}
		wantBlob(t, store, "log", []byte("line 1\nline 2\n"))
		if got := mustRead(t, join(h.mnt, "log")); string(got) != "line 1\nline 2\n" {
			t.Fatalf("read back %q", got)
		}
		waitNoSpillFiles(t, h.cache)
	})

	t.Run("exclusive create (If-None-Match)", func(t *testing.T) {
		data := pattern(300<<10, 7)
		err := crashAndRestart(t, h, "commit/store/excl", func() error {
			return writeAndClose(join(h.mnt, "excl"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, data)
		})
		if err != nil {
			t.Fatalf("close with the server killed after its commit: %v, want success", err)
		}
		wantBlob(t, store, "excl", data)
		waitNoSpillFiles(t, h.cache)
	})

	// Creates without O_EXCL and O_TRUNC are conditional too (on
	// absence, and on the ETag seen at open): the retry recognises its
	// own commit the same way.
	t.Run("create without O_EXCL (If-None-Match)", func(t *testing.T) {
		data := pattern(200<<10, 9)
		err := crashAndRestart(t, h, "commit/store/created", func() error {
			return writeAndClose(join(h.mnt, "created"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, data)
		})
		if err != nil {
			t.Fatalf("close with the server killed after its commit: %v, want success", err)
		}
		wantBlob(t, store, "created", data)
		waitNoSpillFiles(t, h.cache)
	})

	t.Run("O_TRUNC of an existing blob (If-Match of the open)", func(t *testing.T) {
		mustWrite(t, join(h.mnt, "trunc"), []byte("before\n"))
		data := pattern(100<<10, 11)
		err := crashAndRestart(t, h, "commit/store/trunc", func() error {
			return writeAndClose(join(h.mnt, "trunc"), os.O_WRONLY|os.O_TRUNC, data)
		})
		if err != nil {
			t.Fatalf("close with the server killed after its commit: %v, want success", err)
		}
		wantBlob(t, store, "trunc", data)
		waitNoSpillFiles(t, h.cache)
	})
}

// TestRestoredSpillUploadedOnClose: bytes written through a descriptor are
// acknowledged once they are in the spill file; the serving process dies
// before any commit, and the next one finds the spill file through the
// state region and uploads it when the application closes the file.
func TestRestoredSpillUploadedOnClose(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	store := h.localStore()
	mustWrite(t, join(h.mnt, "base"), pattern(100<<10, 3))

	// A new file, and an existing one rewritten in the middle (its spill
	// file was loaded from the blob and commits with If-Match).
	created, err := os.Create(join(h.mnt, "fresh"))
	if err != nil {
		t.Fatal(err)
	}
	rewritten, err := os.OpenFile(join(h.mnt, "base"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fresh := pattern(2<<20+123, 5)
	if _, err := created.Write(fresh); err != nil {
		t.Fatal(err)
	}
	patch := []byte("PATCHED")
	if _, err := rewritten.WriteAt(patch, 5000); err != nil {
		t.Fatal(err)
	}
	h.kill()
	h.start()
	if err := created.Close(); err != nil {
		t.Fatalf("close of a file written before the restart: %v", err)
	}
	if err := rewritten.Close(); err != nil {
		t.Fatalf("close of a file rewritten before the restart: %v", err)
	}
	wantBlob(t, store, "fresh", fresh)
	want := pattern(100<<10, 3)
	copy(want[5000:], patch)
	wantBlob(t, store, "base", want)
	waitNoSpillFiles(t, h.cache)
}

// TestCommitAnswerLostInTransit: the store applies a commit but its answer
// is lost (a timeout after the service acted); the retry layer tries again
// and the retry's ETag condition fails on the blob the first try wrote.
// The commit recognises its own nonce in the blob's metadata, so close
// succeeds: every backend must keep that metadata.
func TestCommitAnswerLostInTransit(t *testing.T) {
	storetest.Run(t, func(t *testing.T, backend blobstore.Store) {
		faulty := blobstore.NewFaulty(backend, blobstore.FaultOptions{})
		store := blobstore.NewRetrying(faulty, blobstore.RetryPolicy{BaseDelay: time.Millisecond})
		mnt, _ := mountStore(t, store, Options{UploadBlockSize: 64 << 10})
		for _, tc := range []struct {
			name string
			op   blobstore.Op
			size int
		}{
			{"put", blobstore.OpPut, 1000},
			{"blocks", blobstore.OpCommitBlocks, 200 << 10},
		} {
			t.Run(tc.name, func(t *testing.T) {
				first, second := pattern(tc.size, 1), pattern(tc.size, 2)
				f, err := os.Create(join(mnt, tc.name))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.Write(first); err != nil {
					t.Fatal(err)
				}
				// The first commit makes the second conditional (If-Match).
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(second, 0); err != nil {
					t.Fatal(err)
				}
				faulty.FailNextAfter(tc.op, 1, blobstore.ErrTransient)
				if err := f.Close(); err != nil {
					t.Fatalf("close after a commit whose answer was lost: %v, want success", err)
				}
				wantBlob(t, backend, tc.name, second)
			})
		}
	})
}

// TestMtimeRightAfterClose: utimes on a file whose handle is still open
// (or whose RELEASE the kernel has not sent yet, right after close(2)) and
// whose content is committed goes to the store at once; it is neither lost
// when the release drops the spill file nor waits for another upload.
func TestMtimeRightAfterClose(t *testing.T) {
	store := blobstore.NewMemory()
	mnt, _ := mountStore(t, store, Options{})
	f, err := os.Create(join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("content")); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	puts := store.Requests()[blobstore.OpPut]
	when := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	if err := os.Chtimes(join(mnt, "f"), when, when); err != nil {
		t.Fatal(err)
	}
	a, err := store.Stat(context.Background(), "f")
	if err != nil || !meta.EntryOf(a).Mtime.Equal(when) {
		t.Fatalf("mtime in the store right after utimes on an open, clean file: %v %v, want %v", meta.EntryOf(a).Mtime, err, when)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := store.Requests()[blobstore.OpPut]; got != puts {
		t.Fatalf("utimes of a clean file uploaded it again (%d puts, want %d)", got, puts)
	}
	// A write after utimes makes the time now again, as on a local disk.
	f2, err := os.OpenFile(join(mnt, "f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f2.Write([]byte(" more")); err != nil {
		t.Fatal(err)
	}
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(join(mnt, "f"))
	if err != nil || time.Since(st.ModTime()) > time.Minute {
		t.Fatalf("mtime after a write that followed utimes: %v %v, want about now", st.ModTime(), err)
	}
	// Many close+utimes pairs: the release racing the utimes never loses it.
	for i := range 20 {
		path := join(mnt, fmt.Sprintf("g%d", i))
		mustWrite(t, path, []byte{byte(i)})
		when := time.Date(2020, 1, 1, 0, 0, i, 0, time.UTC)
		if err := os.Chtimes(path, when, when); err != nil {
			t.Fatal(err)
		}
		a, err := store.Stat(context.Background(), fmt.Sprintf("g%d", i))
		if err != nil || !meta.EntryOf(a).Mtime.Equal(when) {
			t.Fatalf("g%d: mtime in the store right after close+utimes: %v %v, want %v", i, meta.EntryOf(a).Mtime, err, when)
		}
	}
}

// TestUnknownIDsAfterRestore: ids and handles that a restored process does
// not know (the kernel may hold some the state region could not keep) get
// ESTALE and EBADF, never a panic.
func TestUnknownIDsAfterRestore(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	first, err := New(store, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SaveInit(fakeInit()); err != nil {
		t.Fatal(err)
	}
	var out fuse.EntryOut
	if st := first.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 2, Opcode: 9}}, "d", &out); !st.Ok() {
		t.Fatalf("mkdir: %v", st)
	}
	first.Close()

	fsys, err := New(store, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if fsys.AdoptInit() == nil {
		t.Fatal("the state region was not restored")
	}
	const badNode, badFh = 1 << 40, 1 << 41
	hdr := fuse.InHeader{NodeId: badNode, Unique: 100}
	estale := fuse.Status(syscall.ESTALE)
	var (
		entry  fuse.EntryOut
		attr   fuse.AttrOut
		open   fuse.OpenOut
		create fuse.CreateOut
		buf    = make([]byte, 4096)
	)
	nodeOps := map[string]func() fuse.Status{
		"lookup":  func() fuse.Status { return fsys.Lookup(nil, &hdr, "x", &entry) },
		"getattr": func() fuse.Status { return fsys.GetAttr(nil, &fuse.GetAttrIn{InHeader: hdr}, &attr) },
		"setattr": func() fuse.Status {
			in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: hdr, Valid: fuse.FATTR_MTIME, Mtime: 1}}
			return fsys.SetAttr(nil, in, &attr)
		},
		"open":     func() fuse.Status { return fsys.Open(nil, &fuse.OpenIn{InHeader: hdr}, &open) },
		"opendir":  func() fuse.Status { return fsys.OpenDir(nil, &fuse.OpenIn{InHeader: hdr}, &open) },
		"create":   func() fuse.Status { return fsys.Create(nil, &fuse.CreateIn{InHeader: hdr}, "x", &create) },
		"mkdir":    func() fuse.Status { return fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: hdr}, "x", &entry) },
		"mknod":    func() fuse.Status { return fsys.Mknod(nil, &fuse.MknodIn{InHeader: hdr}, "x", &entry) },
		"symlink":  func() fuse.Status { return fsys.Symlink(nil, &hdr, "t", "x", &entry) },
		"readlink": func() fuse.Status { _, st := fsys.Readlink(nil, &hdr); return st },
		"unlink":   func() fuse.Status { return fsys.Unlink(nil, &hdr, "x") },
		"rmdir":    func() fuse.Status { return fsys.Rmdir(nil, &hdr, "x") },
		"rename from": func() fuse.Status {
			return fsys.Rename(nil, &fuse.RenameIn{InHeader: hdr, Newdir: 1}, "x", "y")
		},
		"rename to": func() fuse.Status {
			return fsys.Rename(nil, &fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 1}, Newdir: badNode}, "d", "y")
		},
	}
	for name, op := range nodeOps {
		if st := op(); st != estale {
			t.Errorf("%s on an unknown node: %v, want ESTALE", name, st)
		}
	}
	fh := &fuse.ReadIn{InHeader: hdr, Fh: badFh, Size: 4096}
	handleOps := map[string]func() fuse.Status{
		"read": func() fuse.Status { _, st := fsys.Read(nil, fh, buf); return st },
		"write": func() fuse.Status {
			_, st := fsys.Write(nil, &fuse.WriteIn{InHeader: hdr, Fh: badFh}, []byte("x"))
			return st
		},
		"flush":       func() fuse.Status { return fsys.Flush(nil, &fuse.FlushIn{InHeader: hdr, Fh: badFh}) },
		"fsync":       func() fuse.Status { return fsys.Fsync(nil, &fuse.FsyncIn{InHeader: hdr, Fh: badFh}) },
		"readdir":     func() fuse.Status { return fsys.ReadDir(nil, fh, fuse.NewDirEntryList(buf, 0)) },
		"readdirplus": func() fuse.Status { return fsys.ReadDirPlus(nil, fh, fuse.NewDirEntryList(buf, 0)) },
	}
	for name, op := range handleOps {
		if st := op(); st != fuse.EBADF {
			t.Errorf("%s on an unknown handle: %v, want EBADF", name, st)
		}
	}
	// No reply, and no panic.
	fsys.Release(nil, &fuse.ReleaseIn{InHeader: hdr, Fh: badFh})
	fsys.ReleaseDir(&fuse.ReleaseIn{InHeader: hdr, Fh: badFh})
	fsys.Forget(badNode, 1)

	// What the restored tables do know still works.
	if st := fsys.Lookup(nil, &fuse.InHeader{NodeId: 1}, "d", &entry); !st.Ok() || entry.NodeId != out.NodeId {
		t.Fatalf("lookup of the restored directory: %v node %d, want node %d", st, entry.NodeId, out.NodeId)
	}
}

// TestResentRequestsDirectly drives the filesystem with resent requests
// (bit 63 of unique) without FUSE: one whose unique the state region does
// not know runs normally; one whose first run completed gets the answer
// that run would have given, the same node id, and no second reference.
func TestResentRequestsDirectly(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	first, err := New(store, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SaveInit(fakeInit()); err != nil {
		t.Fatal(err)
	}
	const opMkdir = 9
	var firstOut fuse.EntryOut
	if st := first.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 40, Opcode: opMkdir}}, "made", &firstOut); !st.Ok() {
		t.Fatalf("mkdir: %v", st)
	}
	// A checkpoint rewrites the region from the tables: the intent must
	// be part of it.
	first.mu.Lock()
	first.nodes.checkpoint()
	first.mu.Unlock()
	first.Close() // its reply "never reached the kernel"

	fsys, err := New(store, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()

	var out fuse.EntryOut
	resent := fuse.InHeader{NodeId: 1, Unique: 40 | resendBit, Opcode: opMkdir}
	if st := fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: resent}, "made", &out); !st.Ok() {
		t.Fatalf("resent mkdir the first process completed: %v, want OK", st)
	}
	if out.NodeId != firstOut.NodeId {
		t.Fatalf("resent mkdir answered node %d, the first run's reply carried %d", out.NodeId, firstOut.NodeId)
	}
	fsys.mu.Lock()
	lookups := fsys.nodes.get(out.NodeId).lookups
	fsys.mu.Unlock()
	if lookups != 1 {
		t.Fatalf("node has %d lookup references after the resent reply, want 1 (one reply reached the kernel)", lookups)
	}

	// An unknown unique with the resend bit: an ordinary mkdir.
	unknown := fuse.InHeader{NodeId: 1, Unique: 77 | resendBit, Opcode: opMkdir}
	if st := fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: unknown}, "fresh", &out); !st.Ok() {
		t.Fatalf("resent mkdir with an unknown unique: %v, want OK", st)
	}
	if a, err := store.Stat(context.Background(), "fresh"); err != nil || !meta.True(a.Metadata, blobstore.MetaIsFolder) {
		t.Fatalf("directory made by the resent mkdir: %+v %v", a, err)
	}
	// ...and the same with a name that exists: EEXIST, as for any mkdir.
	other := fuse.InHeader{NodeId: 1, Unique: 79 | resendBit, Opcode: opMkdir}
	if st := fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: other}, "made", &out); st != fuse.Status(syscall.EEXIST) {
		t.Fatalf("resent mkdir, unknown unique, existing name: %v, want EEXIST", st)
	}
	// A request that is not resent never takes an intent's answer.
	again := fuse.InHeader{NodeId: 1, Unique: 40, Opcode: opMkdir}
	if st := fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: again}, "made", &out); st != fuse.Status(syscall.EEXIST) {
		t.Fatalf("mkdir of an existing name, not resent: %v, want EEXIST", st)
	}
}

// fakeInit is a minimal INIT request, for a state region that must look
// like one of a mounted filesystem.
func fakeInit() []byte {
	b := make([]byte, 104)
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)))
	binary.LittleEndian.PutUint32(b[4:], 26)
	binary.LittleEndian.PutUint32(b[40:], 7)
	binary.LittleEndian.PutUint32(b[44:], 31)
	return b
}

// TestRestoreFinishesSpillRemoval: a process that journaled the removal of
// a spill file and died before removing it leaves the file to its
// successor, which removes it; nothing else in the spill directory of the
// mount is touched.
func TestRestoreFinishesSpillRemoval(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	cache := t.TempDir()
	first, err := New(store, Options{CacheDir: cache, State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SaveInit(fakeInit()); err != nil {
		t.Fatal(err)
	}
	open := func(name string, unique uint64) (*node, *fuse.CreateOut) {
		out := &fuse.CreateOut{}
		in := &fuse.CreateIn{InHeader: fuse.InHeader{NodeId: 1, Unique: unique, Opcode: opCreate}, Flags: syscall.O_WRONLY}
		if st := first.Create(nil, in, name, out); !st.Ok() {
			t.Fatalf("create %s: %v", name, st)
		}
		if _, st := first.Write(nil, &fuse.WriteIn{Fh: out.Fh}, []byte(name)); !st.Ok() {
			t.Fatalf("write %s: %v", name, st)
		}
		first.mu.Lock()
		defer first.mu.Unlock()
		return first.nodes.get(out.NodeId), out
	}
	gone, _ := open("gone", 2)
	kept, _ := open("kept", 4)
	goneSpill, keptSpill := gone.file.spillPath, kept.file.spillPath
	// The process dies right after journaling the removal.
	first.journalSpillRemoval(gone, goneSpill)
	first.Close()

	second, err := New(store, Options{CacheDir: cache, State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := os.Stat(goneSpill); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("spill file whose removal was journaled: %v, want it removed", err)
	}
	if got, err := os.ReadFile(keptSpill); err != nil || string(got) != "kept" {
		t.Fatalf("spill file of an open file: %q %v, want it kept", got, err)
	}
}

// lateStore holds the Put (or, with op OpDelete, the Delete) of one name
// until land is closed: a request the dead process sent that the store
// carries out only after its successor has looked.
type lateStore struct {
	blobstore.Store
	op   blobstore.Op // OpPut or OpDelete
	name string
	sent chan struct{} // closed when the held request is on its way
	land chan struct{} // closed by the test to let it reach the store
	// dieAfter ends the goroutine that sent the held request once it has
	// landed (runtime.Goexit): the process died with the request on its
	// way and sends nothing after it.
	dieAfter bool
}

// hold waits for land if op on name is the held request, and tells
// whether it is.
func (s *lateStore) hold(op blobstore.Op, name string) bool {
	if op == s.op && name == s.name {
		close(s.sent)
		<-s.land
		return true
	}
	return false
}

func (s *lateStore) landed(held bool) {
	if held && s.dieAfter {
		runtime.Goexit()
	}
}

func (s *lateStore) Put(ctx context.Context, name string, data []byte, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	held := s.hold(blobstore.OpPut, name)
	defer s.landed(held)
	return s.Store.Put(ctx, name, data, opts)
}

func (s *lateStore) Delete(ctx context.Context, name string, cond blobstore.Conditions) error {
	held := s.hold(blobstore.OpDelete, name)
	defer s.landed(held)
	return s.Store.Delete(ctx, name, cond)
}

// dyingFirstRun starts the first of two processes sharing state, over
// held: its run of request dies (runtime.Goexit) at crash point die, right
// after the request held has been sent. It returns once that request is on
// its way, with the first FS and a channel closed when the run has ended.
func dyingFirstRun(t *testing.T, state *os.File, held *lateStore, die string, request func(first *FS)) (*FS, <-chan struct{}) {
	t.Helper()
	held.sent, held.land = make(chan struct{}), make(chan struct{})
	first, err := New(held, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.SaveInit(fakeInit()); err != nil {
		t.Fatal(err)
	}
	// The first process runs nothing after the crash point: it is dead.
	first.crashHook = func(where string) {
		if where == die {
			runtime.Goexit()
		}
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		request(first)
		t.Errorf("the first run answered; it should have died at %s", die)
	}()
	<-held.sent
	return first, ended
}

// successor starts the process that adopts state after the first died;
// the caller closes it.
func successor(t *testing.T, store blobstore.Store, state *os.File) *FS {
	t.Helper()
	second, err := New(store, Options{CacheDir: t.TempDir(), State: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return second
}

// lookUpOthers has fs look up names that do not exist in the root, as
// other applications do: the second lookup lists the root.
func lookUpOthers(fs *FS) {
	var entry fuse.EntryOut
	for _, name := range []string{"other-1", "other-2"} {
		fs.Lookup(nil, &fuse.InHeader{NodeId: 1}, name, &entry)
	}
}

// TestResentMkdirWhosePutLandsLate: the serving process dies with its
// mkdir's Put on its way; its successor lists the directory (the name is
// not there yet), then the Put lands, then the kernel resends the mkdir.
// The successor's own Put finds the marker and the intent says it is the
// first run's: the answer is OK, not the EEXIST the stale listing implies.
func TestResentMkdirWhosePutLandsLate(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	held := &lateStore{Store: store, op: blobstore.OpPut, name: "late"}
	const opMkdir = 9
	first, firstRun := dyingFirstRun(t, state, held, "mkdir/store/late", func(first *FS) {
		var out fuse.EntryOut
		first.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 60, Opcode: opMkdir}}, "late", &out)
	})

	second := successor(t, store, state)
	defer second.Close()
	// The successor lists the root while the Put is still on its way.
	lookUpOthers(second)
	if _, found, ok := second.lists.Lookup("", "late"); !ok || found {
		t.Fatalf("root listing before the Put landed: ok=%v found=%v, want a listing without the name", ok, found)
	}

	close(held.land)
	<-firstRun
	first.Close()
	// Another client writes into the directory before the resend: the
	// resent mkdir, which made nothing, must not take it for empty.
	putBlob(t, store, "late/child", []byte("x"), nil)

	var out fuse.EntryOut
	resent := fuse.InHeader{NodeId: 1, Unique: 60 | resendBit, Opcode: opMkdir}
	if st := second.Mkdir(nil, &fuse.MkdirIn{InHeader: resent}, "late", &out); !st.Ok() {
		t.Fatalf("resent mkdir whose first Put landed after the successor listed: %v, want OK", st)
	}
	second.mu.Lock()
	n := second.nodes.get(out.NodeId)
	second.mu.Unlock()
	if n == nil || n.kind != meta.KindDir || n.name != "late" {
		t.Fatalf("resent mkdir answered node %d (%+v), want the directory late", out.NodeId, n)
	}
	if _, found, ok := second.lists.Lookup("late", "child"); ok && !found {
		t.Fatal("after the resent mkdir, the listing of late says child does not exist: the mkdir took another client's directory for the empty one it makes")
	}
}

// opRename is FUSE_RENAME.
const opRename = 12

// TestResentRenameWhoseDeleteLandsLate: the serving process dies with its
// file rename's Copy done and its Delete of the source on its way; its
// successor lists the directory (both names there), then the Delete lands,
// then the kernel resends the rename. The listing still shows the source,
// so the successor copies it again and finds it gone: the first run moved
// it, and the answer is OK, not ENOENT.
func TestResentRenameWhoseDeleteLandsLate(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	putBlob(t, store, "from", []byte("moved"), nil)
	held := &lateStore{Store: store, op: blobstore.OpDelete, name: "from"}
	in := fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 70, Opcode: opRename}, Newdir: 1}
	first, firstRun := dyingFirstRun(t, state, held, "rename/store/from", func(first *FS) {
		first.Rename(nil, &in, "from", "to")
	})

	second := successor(t, store, state)
	defer second.Close()
	lookUpOthers(second)
	if _, found, ok := second.lists.Lookup("", "from"); !ok || !found {
		t.Fatalf("root listing before the Delete landed: ok=%v found=%v, want a listing with the source", ok, found)
	}

	close(held.land)
	<-firstRun
	first.Close()

	in.Unique |= resendBit
	if st := second.Rename(nil, &in, "from", "to"); !st.Ok() {
		t.Fatalf("resent rename whose first Delete landed after the successor listed: %v, want OK", st)
	}
	wantNoBlob(t, store, "from")
	wantBlob(t, store, "to", []byte("moved"))
	// Lookups answer from the tables and the listing the rename updated.
	var entry fuse.EntryOut
	if st := second.Lookup(nil, &fuse.InHeader{NodeId: 1}, "from", &entry); st.Ok() && entry.NodeId != 0 {
		t.Fatalf("lookup of the old name after the resent rename: %v node %d, want no such name", st, entry.NodeId)
	}
	if st := second.Lookup(nil, &fuse.InHeader{NodeId: 1}, "to", &entry); !st.Ok() || entry.NodeId == 0 {
		t.Fatalf("lookup of the new name after the resent rename: %v node %d, want the file", st, entry.NodeId)
	}
}

// copyHookStore calls beforeCopy with the source of each Copy.
type copyHookStore struct {
	blobstore.Store
	beforeCopy func(src string)
}

func (s *copyHookStore) Copy(ctx context.Context, dst, src string) (blobstore.Attrs, error) {
	s.beforeCopy(src)
	return s.Store.Copy(ctx, dst, src)
}

// TestResentDirRenameWhoseDeleteLandsLate: the serving process dies during
// a directory rename with every copy done and the Delete of a source blob
// on its way. The successor's resent rename lists the source directory
// (the blob still there), then that Delete lands, then the successor
// copies the blob: the copy finds no source. The first run deletes only
// after every copy landed, so the blob is in the destination already; the
// answer is OK, not ENOENT.
func TestResentDirRenameWhoseDeleteLandsLate(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	putBlob(t, store, "fromdir/inside", []byte("inside"), nil)
	held := &lateStore{Store: store, op: blobstore.OpDelete, name: "fromdir/inside"}
	in := fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 71, Opcode: opRename}, Newdir: 1}
	first, firstRun := dyingFirstRun(t, state, held, "rename/store/fromdir", func(first *FS) {
		first.Rename(nil, &in, "fromdir", "todir")
	})

	// The held Delete lands once the successor has listed the source
	// directory and is about to copy the blob.
	landed := false
	successorStore := &copyHookStore{Store: store, beforeCopy: func(src string) {
		if src == "fromdir/inside" && !landed {
			landed = true
			close(held.land)
			<-firstRun
		}
	}}
	second := successor(t, successorStore, state)
	defer second.Close()

	in.Unique |= resendBit
	if st := second.Rename(nil, &in, "fromdir", "todir"); !st.Ok() {
		t.Fatalf("resent directory rename whose first Delete landed after the successor listed: %v, want OK", st)
	}
	if !landed {
		t.Fatal("the resent rename copied nothing; the test did not exercise the late Delete")
	}
	first.Close()
	wantNoBlob(t, store, "fromdir/inside")
	wantBlob(t, store, "todir/inside", []byte("inside"))
}

// TestResentDirRenameOverEmptyDirWhoseDeleteLandsLate: the serving process
// dies as it replaces an empty directory by renaming another over it, with
// the Delete of the target's marker on its way. Its successor's resent
// rename completes the move, putting the target's marker back, and only
// then does the dead process's Delete land. It must not take the new
// marker with it: the empty directory the rename made would vanish.
func TestResentDirRenameOverEmptyDirWhoseDeleteLandsLate(t *testing.T) {
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	store := blobstore.NewMemory()
	putBlob(t, store, "fromdir", nil, folderMeta)
	putBlob(t, store, "todir", nil, folderMeta)
	held := &lateStore{Store: store, op: blobstore.OpDelete, name: "todir", dieAfter: true}
	in := fuse.RenameIn{InHeader: fuse.InHeader{NodeId: 1, Unique: 73, Opcode: opRename}, Newdir: 1}
	first, firstRun := dyingFirstRun(t, state, held, "none: the held Delete ends the run", func(first *FS) {
		first.Rename(nil, &in, "fromdir", "todir")
	})

	second := successor(t, store, state)
	defer second.Close()
	in.Unique |= resendBit
	if st := second.Rename(nil, &in, "fromdir", "todir"); !st.Ok() {
		t.Fatalf("resent rename over an empty directory: %v, want OK", st)
	}
	close(held.land)
	<-firstRun
	first.Close()
	wantNoBlob(t, store, "fromdir")
	a, err := store.Stat(t.Context(), "todir")
	if err != nil {
		t.Fatalf("the directory the rename made lost its marker to the dead process's late Delete: %v", err)
	}
	if !meta.True(a.Metadata, blobstore.MetaIsFolder) {
		t.Fatalf("todir is no directory marker: %v", a.Metadata)
	}
}

// TestDeleteDirMarkerLeavesOthers: the marker deletion of a rename over an
// empty directory deletes nothing that is not a directory marker, nor a
// marker that changed after it looked.
func TestDeleteDirMarkerLeavesOthers(t *testing.T) {
	store := blobstore.NewMemory()
	fs, err := New(store, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	putBlob(t, store, "file", []byte("data"), nil)
	if err := fs.deleteDirMarker(t.Context(), "file"); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("deleting a directory marker that is a file: %v, want ENOTDIR", err)
	}
	wantBlob(t, store, "file", []byte("data"))

	// Each Stat sees a marker that is replaced before the Delete.
	racing := &statHookStore{Store: store, afterStat: func(name string) {
		putBlob(t, store, name, nil, folderMeta)
	}}
	putBlob(t, store, "dir", nil, folderMeta)
	fs2, err := New(racing, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fs2.Close()
	if err := fs2.deleteDirMarker(t.Context(), "dir"); !errors.Is(err, blobstore.ErrPreconditionFailed) {
		t.Fatalf("deleting a marker replaced after every look: %v, want ErrPreconditionFailed", err)
	}
	if racing.stats != 3 {
		t.Fatalf("%d looks, want 3 attempts", racing.stats)
	}
	if _, err := store.Stat(t.Context(), "dir"); err != nil {
		t.Fatalf("the marker that came in between was deleted: %v", err)
	}
	if err := fs.deleteDirMarker(t.Context(), "dir"); err != nil {
		t.Fatalf("deleting an unchanged marker: %v", err)
	}
	wantNoBlob(t, store, "dir")
	if err := fs.deleteDirMarker(t.Context(), "dir"); err != nil {
		t.Fatalf("deleting a marker already gone: %v, want nil", err)
	}
}

// statHookStore calls afterStat after each Stat that finds a blob.
type statHookStore struct {
	blobstore.Store
	afterStat func(name string)
	stats     int
}

func (s *statHookStore) Stat(ctx context.Context, name string) (blobstore.Attrs, error) {
	a, err := s.Store.Stat(ctx, name)
	if err == nil {
		s.stats++
		s.afterStat(name)
	}
	return a, err
}

// TestRenameOfOpenFileAcrossRestart: a file open for writing is renamed,
// and the serving process dies once the rename is in the store, before its
// reply; a successor adopts the mount and the kernel resends the rename.
// The open file's next commit goes to the new name on the condition of the
// copy its rename made: fchmod, write and close succeed, and the store
// holds what was written. (Found by the crash checker: the dead process had
// not journaled the condition the rename gave the file, and the successor's
// commit failed with ESTALE, the data in lost+found.)
func TestRenameOfOpenFileAcrossRestart(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	s := h.localStore()
	putBlob(t, s, "a", []byte("stored before"), nil)
	f, err := os.OpenFile(join(h.mnt, "a"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWriteAt(t, f, []byte("first"), 0)
	err = crashAndRestart(t, h, "rename/store/a", func() error {
		return os.Rename(join(h.mnt, "a"), join(h.mnt, "b"))
	})
	if err != nil {
		t.Fatalf("rename across the restart: %v", err)
	}
	if err := f.Chmod(0o640); err != nil {
		t.Fatalf("fchmod after the rename: %v", err)
	}
	mustWriteAt(t, f, []byte(" and second"), 5)
	mustClose(t, f.Close())
	wantBlob(t, s, "b", []byte("first and second"))
	wantNoBlob(t, s, "a")
	wantNoLostFound(t, h.cache)
}

// TestOtherMetadataChangeAcrossRestart: a file open for writing whose
// serving process is killed and adopted, then chmod'ed by another client
// (a metadata change, the content the same), commits over that change, as
// it does without the restart (TestOtherMetadataChangeIsNoConflict): the
// content its condition stands for is journaled. Found by TestModelCrash
// (seed 5558123100288648252): the fsync gave ESTALE.
func TestOtherMetadataChangeAcrossRestart(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	s := h.localStore()
	old := []byte("stored before")
	sum := md5.Sum(old)
	if _, err := s.Put(context.Background(), "a", old, blobstore.PutOptions{ContentMD5: sum[:]}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(join(h.mnt, "a"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWriteAt(t, f, []byte("new"), 0)
	h.kill()
	h.start()
	// Another client changes the blob's metadata only.
	a, err := s.Stat(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	md := meta.Copy(a.Metadata)
	md[blobstore.MetaMode] = "100600"
	if _, err := s.SetMetadata(context.Background(), "a", md, blobstore.Conditions{IfMatch: a.ETag}); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after the restart and another client's chmod: %v", err)
	}
	mustClose(t, f.Close())
	wantBlob(t, s, "a", []byte("new"))
	wantNoLostFound(t, h.cache)
}
