package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// posixCheck is one POSIX behaviour, checked on a fresh mount; s is the
// store behind it, to check what landed there.
type posixCheck func(t *testing.T, mnt string, s blobstore.Store)

var posixChecks = []struct {
	name  string
	check posixCheck
}{
	{"CreateWriteReadBack", checkCreateWriteRead},
	{"EmptyFile", checkEmptyFile},
	{"Append", checkAppend},
	{"OverwriteMiddle", checkOverwriteMiddle},
	{"WriteOnlySeenByOpenReader", checkWriteOnlySeenByOpenReader},
	{"Truncate", checkTruncate},
	{"RenameFile", checkRenameFile},
	{"RenameFileOverwrite", checkRenameFileOverwrite},
	{"RenameNoReplace", checkRenameNoReplace},
	{"RenameDir", checkRenameDir},
	{"RenameDirOverwrite", checkRenameDirOverwrite},
	{"MkdirRmdir", checkMkdirRmdir},
	{"Unlink", checkUnlink},
	{"UnlinkOpenFile", checkUnlinkOpenFile},
	{"WriteAfterUnlink", checkWriteAfterUnlink},
	{"WriteAfterRenameOver", checkWriteAfterRenameOver},
	{"Symlink", checkSymlink},
	{"ReaddirPaging", checkReaddirPaging},
	{"StatSizesMtimes", checkStatSizesMtimes},
	{"Exclusive", checkExclusive},
	{"OAppend", checkOAppend},
	{"Blobfuse2Layout", checkBlobfuse2Layout},
	{"LastChildKeepsDir", checkLastChildKeepsDir},
	{"BadNames", checkBadNames},
	{"Unsupported", checkUnsupported},
}

func TestPOSIX(t *testing.T) {
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		for _, c := range posixChecks {
			t.Run(c.name, func(t *testing.T) {
				// Each check gets its own mount, on its own prefix
				// of the backend's container.
				mnt, _ := mountStore(t, s, Options{})
				c.check(t, mnt, s)
			})
			// Start the next check from an empty container.
			clearStore(t, s)
		}
	})
}

func clearStore(t *testing.T, s blobstore.Store) {
	ctx := context.Background()
	opts := blobstore.ListOptions{}
	for {
		page, err := s.List(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range page.Blobs {
			if err := s.Delete(ctx, b.Name, blobstore.Conditions{}); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
				t.Fatal(err)
			}
		}
		if page.NextMarker == "" {
			return
		}
		opts.Marker = page.NextMarker
	}
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
}

// checkWriteOnlySeenByOpenReader: a write through a write-only handle
// (which bypasses the kernel's page cache) is seen by a reader that had
// the file open, and cached, before it.
func checkWriteOnlySeenByOpenReader(t *testing.T, mnt string, s blobstore.Store) {
	path := join(mnt, "shared.bin")
	old := pattern(64<<10, 1)
	mustWrite(t, path, old)
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, len(old))
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("first read: %v", err)
	}
	w, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	patch := pattern(8<<10, 9)
	if _, err := w.WriteAt(patch, 4096); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(old)
	copy(want[4096:], patch)
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the open reader does not see the write (err %v)", err)
	}
	wantBlob(t, s, "shared.bin", want)
}

func checkCreateWriteRead(t *testing.T, mnt string, s blobstore.Store) {
	data := pattern(100_000, 1)
	mustWrite(t, join(mnt, "a.bin"), data)
	if got := mustRead(t, join(mnt, "a.bin")); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	wantBlob(t, s, "a.bin", data)
}

func checkEmptyFile(t *testing.T, mnt string, s blobstore.Store) {
	f, err := os.Create(join(mnt, "empty"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "empty", []byte{})
}

func checkAppend(t *testing.T, mnt string, s blobstore.Store) {
	putBlob(t, s, "log", []byte("first\n"), nil)
	f, err := os.OpenFile(join(mnt, "log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("second\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "log", []byte("first\nsecond\n"))
}

func checkOverwriteMiddle(t *testing.T, mnt string, s blobstore.Store) {
	data := pattern(50_000, 2)
	putBlob(t, s, "m", data, nil)
	f, err := os.OpenFile(join(mnt, "m"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("HELLO"), 20_000); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(data[20_000:], "HELLO")
	wantBlob(t, s, "m", data)
	if got := mustRead(t, join(mnt, "m")); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
}

func checkTruncate(t *testing.T, mnt string, s blobstore.Store) {
	data := pattern(10_000, 3)
	putBlob(t, s, "t", data, nil)
	p := join(mnt, "t")
	if err := os.Truncate(p, 4000); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "t", data[:4000])
	if err := os.Truncate(p, 6000); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, data[:4000]...), make([]byte, 2000)...)
	wantBlob(t, s, "t", want)
	if st, err := os.Stat(p); err != nil || st.Size() != 6000 {
		t.Fatalf("stat after grow: %v %v", st, err)
	}
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "t", []byte{})
	// O_TRUNC through open.
	putBlob(t, s, "u", data, nil)
	mustWrite(t, join(mnt, "u"), []byte("short"))
	wantBlob(t, s, "u", []byte("short"))
}

func checkRenameFile(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "old"), []byte("content"))
	if err := os.Mkdir(join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(join(mnt, "old"), join(mnt, "d", "new")); err != nil {
		t.Fatal(err)
	}
	wantNoBlob(t, s, "old")
	wantBlob(t, s, "d/new", []byte("content"))
	if _, err := os.Stat(join(mnt, "old")); !os.IsNotExist(err) {
		t.Fatalf("old name: %v", err)
	}
	if got := mustRead(t, join(mnt, "d", "new")); string(got) != "content" {
		t.Fatalf("got %q", got)
	}
}

func checkRenameFileOverwrite(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "a"), []byte("A"))
	mustWrite(t, join(mnt, "b"), []byte("B"))
	if err := os.Rename(join(mnt, "a"), join(mnt, "b")); err != nil {
		t.Fatal(err)
	}
	wantNoBlob(t, s, "a")
	wantBlob(t, s, "b", []byte("A"))
	if got := mustRead(t, join(mnt, "b")); string(got) != "A" {
		t.Fatalf("got %q", got)
	}
	// A directory cannot replace a file, nor a file a directory.
	if err := os.Mkdir(join(mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// syscall.Rename: os.Rename refuses on its own to replace a directory.
	wantErrno(t, syscall.Rename(join(mnt, "dir"), join(mnt, "b")), syscall.ENOTDIR)
	wantErrno(t, syscall.Rename(join(mnt, "b"), join(mnt, "dir")), syscall.EISDIR)
}

func checkRenameNoReplace(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "a"), []byte("A"))
	mustWrite(t, join(mnt, "b"), []byte("B"))
	err := renameat2(join(mnt, "a"), join(mnt, "b"), 1 /* RENAME_NOREPLACE */)
	wantErrno(t, err, syscall.EEXIST)
	wantBlob(t, s, "b", []byte("B"))
	if err := renameat2(join(mnt, "a"), join(mnt, "c"), 1); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "c", []byte("A"))
}

func renameat2(from, to string, flags uint) error {
	return unixRenameat2(from, to, flags)
}

func checkRenameDir(t *testing.T, mnt string, s blobstore.Store) {
	if err := os.MkdirAll(join(mnt, "src", "sub", "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		mustWrite(t, join(mnt, "src", fmt.Sprintf("f%02d", i)), []byte(fmt.Sprint(i)))
	}
	mustWrite(t, join(mnt, "src", "sub", "deep"), []byte("deep"))
	if err := os.Rename(join(mnt, "src"), join(mnt, "dst")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(join(mnt, "src")); !os.IsNotExist(err) {
		t.Fatalf("src still there: %v", err)
	}
	for i := range 30 {
		wantBlob(t, s, fmt.Sprintf("dst/f%02d", i), []byte(fmt.Sprint(i)))
		wantNoBlob(t, s, fmt.Sprintf("src/f%02d", i))
	}
	wantBlob(t, s, "dst/sub/deep", []byte("deep"))
	if got := mustRead(t, join(mnt, "dst", "sub", "deep")); string(got) != "deep" {
		t.Fatalf("got %q", got)
	}
	if st, err := os.Stat(join(mnt, "dst", "sub", "empty")); err != nil || !st.IsDir() {
		t.Fatalf("empty dir after rename: %v %v", st, err)
	}
}

func checkRenameDirOverwrite(t *testing.T, mnt string, s blobstore.Store) {
	os.Mkdir(join(mnt, "a"), 0o755)
	mustWrite(t, join(mnt, "a", "x"), []byte("x"))
	os.Mkdir(join(mnt, "empty"), 0o755)
	if err := syscall.Rename(join(mnt, "a"), join(mnt, "empty")); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, s, "empty/x", []byte("x"))
	os.Mkdir(join(mnt, "b"), 0o755)
	mustWrite(t, join(mnt, "b", "y"), []byte("y"))
	os.Mkdir(join(mnt, "c"), 0o755)
	wantErrno(t, syscall.Rename(join(mnt, "c"), join(mnt, "b")), syscall.ENOTEMPTY)
}

func checkMkdirRmdir(t *testing.T, mnt string, s blobstore.Store) {
	d := join(mnt, "dir")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, os.Mkdir(d, 0o755), syscall.EEXIST)
	a, err := s.Stat(context.Background(), "dir")
	if err != nil || !meta.True(a.Metadata, blobstore.MetaIsFolder) {
		t.Fatalf("marker blob: %+v %v", a, err)
	}
	mustWrite(t, join(d, "f"), []byte("f"))
	wantErrno(t, syscall.Rmdir(d), syscall.ENOTEMPTY)
	if err := os.Remove(join(d, "f")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Rmdir(d); err != nil {
		t.Fatal(err)
	}
	wantNoBlob(t, s, "dir")
	if _, err := os.Stat(d); !os.IsNotExist(err) {
		t.Fatalf("dir still there: %v", err)
	}
}

func checkUnlink(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "f"), []byte("x"))
	if err := os.Remove(join(mnt, "f")); err != nil {
		t.Fatal(err)
	}
	wantNoBlob(t, s, "f")
	wantErrno(t, syscall.Unlink(join(mnt, "f")), syscall.ENOENT)
	os.Mkdir(join(mnt, "d"), 0o755)
	wantErrno(t, syscall.Unlink(join(mnt, "d")), syscall.EISDIR)
}

func checkUnlinkOpenFile(t *testing.T, mnt string, s blobstore.Store) {
	f, err := os.Create(join(mnt, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("scratch")
	if err := os.Remove(join(mnt, "tmp")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := f.ReadAt(buf, 0); err != nil || string(buf) != "scratch" {
		t.Fatalf("read unlinked open file: %q %v", buf, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantNoBlob(t, s, "tmp")
}

// unwrittenChanges are changes through a handle on an existing file
// that nothing was written to yet, each keeping some of the old content;
// after is "old content\n" changed so.
var unwrittenChanges = []struct {
	name   string
	flag   int
	change func(f *os.File) error
	after  string
}{
	{"pwrite", os.O_RDWR, func(f *os.File) error { _, err := f.WriteAt([]byte("NEW"), 4); return err }, "old NEWtent\n"},
	{"append", os.O_RDWR | os.O_APPEND, func(f *os.File) error { _, err := f.Write([]byte("more\n")); return err }, "old content\nmore\n"},
	{"ftruncate", os.O_RDWR, func(f *os.File) error { return f.Truncate(3) }, "old"},
}

// checkWriteAfterUnlink: a file opened for writing and unlinked before
// anything was written to it lives on without a name until its last
// close: a write (or a truncate that keeps some of it) through the open
// handle succeeds on its content, reads see it, the close succeeds and
// nothing comes back in the store.
func checkWriteAfterUnlink(t *testing.T, mnt string, s blobstore.Store) {
	// Every blob is there before the mount first looks: its listing
	// cache would hide a blob put behind its back later.
	for i := range unwrittenChanges {
		putBlob(t, s, fmt.Sprintf("unlinked%d", i), []byte("old content\n"), nil)
	}
	for i, c := range unwrittenChanges {
		name := fmt.Sprintf("unlinked%d", i)
		f, err := os.OpenFile(join(mnt, name), c.flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Closed before the unmount even when the check fails: a file
		// left open would make the test process hang at its exit.
		t.Cleanup(func() { f.Close() })
		if err := os.Remove(join(mnt, name)); err != nil {
			t.Fatal(err)
		}
		if err := c.change(f); err != nil {
			t.Fatalf("%s after unlink: %v", c.name, err)
		}
		got := make([]byte, 64)
		n, err := f.ReadAt(got, 0)
		if err != nil && !errors.Is(err, io.EOF) || string(got[:n]) != c.after {
			t.Errorf("%s after unlink: read %q (%v), want %q", c.name, got[:n], err, c.after)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close after %s: %v", c.name, err)
		}
		wantNoBlob(t, s, name)
		if _, err := os.Stat(join(mnt, name)); !os.IsNotExist(err) {
			t.Errorf("%s: the unlinked name is back: %v", c.name, err)
		}
	}
}

// checkWriteAfterRenameOver: a file opened for writing, nothing written
// yet, whose name a rename gives to another file lives on without a name
// as for unlink; its changes do not reach the store, which keeps the
// renamed file.
func checkWriteAfterRenameOver(t *testing.T, mnt string, s blobstore.Store) {
	for i := range unwrittenChanges {
		putBlob(t, s, fmt.Sprintf("dst%d", i), []byte("old content\n"), nil)
		putBlob(t, s, fmt.Sprintf("src%d", i), []byte("renamed\n"), nil)
	}
	for i, c := range unwrittenChanges {
		dst, src := fmt.Sprintf("dst%d", i), fmt.Sprintf("src%d", i)
		f, err := os.OpenFile(join(mnt, dst), c.flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Closed before the unmount even when the check fails: a file
		// left open would make the test process hang at its exit.
		t.Cleanup(func() { f.Close() })
		if err := os.Rename(join(mnt, src), join(mnt, dst)); err != nil {
			t.Fatal(err)
		}
		if err := c.change(f); err != nil {
			t.Fatalf("%s after rename over it: %v", c.name, err)
		}
		got := make([]byte, 64)
		n, err := f.ReadAt(got, 0)
		if err != nil && !errors.Is(err, io.EOF) || string(got[:n]) != c.after {
			t.Errorf("%s after rename over it: read %q (%v), want %q", c.name, got[:n], err, c.after)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close after %s: %v", c.name, err)
		}
		wantBlob(t, s, dst, []byte("renamed\n"))
		wantNoBlob(t, s, src)
	}
}

func checkSymlink(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "target"), []byte("T"))
	if err := os.Symlink("target", join(mnt, "link")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(join(mnt, "link")); err != nil || got != "target" {
		t.Fatalf("readlink: %q %v", got, err)
	}
	if got := mustRead(t, join(mnt, "link")); string(got) != "T" {
		t.Fatalf("through link: %q", got)
	}
	a, err := s.Stat(context.Background(), "link")
	if err != nil || !meta.True(a.Metadata, blobstore.MetaIsSymlink) {
		t.Fatalf("symlink blob: %+v %v", a, err)
	}
	wantBlob(t, s, "link", []byte("target"))
	if st, err := os.Lstat(join(mnt, "link")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("lstat: %v %v", st, err)
	}
}

func checkReaddirPaging(t *testing.T, mnt string, s blobstore.Store) {
	// More names than one listing page (5,000) and than one READDIR reply.
	const n = 6_000
	want := make([]string, 0, n+1)
	ctx := context.Background()
	for i := range n {
		name := fmt.Sprintf("big/f%05d", i)
		if _, err := s.Put(ctx, name, []byte("x"), blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
		want = append(want, name[4:])
	}
	putBlob(t, s, "big/sub/x", nil, nil)
	want = append(want, "sub")
	sort.Strings(want)
	entries, err := os.ReadDir(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Fatalf("got %d entries, want %d", len(entries), len(want))
	}
	for i, e := range entries {
		if e.Name() != want[i] {
			t.Fatalf("entry %d: %q, want %q", i, e.Name(), want[i])
		}
	}
	if !entries[len(entries)-1].IsDir() {
		t.Fatal("sub is not a directory")
	}
}

func checkStatSizesMtimes(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "f"), pattern(12345, 4))
	st, err := os.Stat(join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 12345 {
		t.Fatalf("size %d", st.Size())
	}
	if d := time.Since(st.ModTime()); d < -time.Minute || d > time.Minute {
		t.Fatalf("mtime %v is not recent", st.ModTime())
	}
	when := time.Date(2020, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(join(mnt, "f"), when, when); err != nil {
		t.Fatal(err)
	}
	st, err = os.Stat(join(mnt, "f"))
	if err != nil || !st.ModTime().Equal(when) {
		t.Fatalf("mtime after chtimes: %v %v", st.ModTime(), err)
	}
	a, err := s.Stat(context.Background(), "f")
	if err != nil || !meta.EntryOf(a).Mtime.Equal(when) {
		t.Fatalf("mtime in store: %+v %v", a, err)
	}
	if st, err := os.Stat(mnt); err != nil || !st.IsDir() {
		t.Fatalf("root: %v %v", st, err)
	}
}

func checkExclusive(t *testing.T, mnt string, s blobstore.Store) {
	f, err := os.OpenFile(join(mnt, "x"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = os.OpenFile(join(mnt, "x"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	wantErrno(t, err, syscall.EEXIST)
}

func checkOAppend(t *testing.T, mnt string, s blobstore.Store) {
	p := join(mnt, "a")
	for i := range 5 {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "line %d\n", i)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	wantBlob(t, s, "a", []byte("line 0\nline 1\nline 2\nline 3\nline 4\n"))
}

// checkBlobfuse2Layout reads a container as blobfuse2 writes it.
func checkBlobfuse2Layout(t *testing.T, mnt string, s blobstore.Store) {
	putBlob(t, s, "emptydir", nil, map[string]string{"hdi_isfolder": "true"})
	putBlob(t, s, "implicit/file", []byte("i"), nil)
	putBlob(t, s, "ln", []byte("implicit/file"), map[string]string{"is_symlink": "true"})
	for _, d := range []string{"emptydir", "implicit"} {
		if st, err := os.Stat(join(mnt, d)); err != nil || !st.IsDir() {
			t.Fatalf("%s: %v %v", d, st, err)
		}
	}
	if got, err := os.Readlink(join(mnt, "ln")); err != nil || got != "implicit/file" {
		t.Fatalf("readlink: %q %v", got, err)
	}
	if got := mustRead(t, join(mnt, "ln")); string(got) != "i" {
		t.Fatalf("through link: %q", got)
	}
	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, fmt.Sprintf("%s:%v", e.Name(), e.Type()))
	}
	want := []string{"emptydir:d---------", "implicit:d---------", "ln:L---------"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("root listing %v, want %v", names, want)
	}
}

func checkLastChildKeepsDir(t *testing.T, mnt string, s blobstore.Store) {
	putBlob(t, s, "p/only", []byte("x"), nil) // a directory without marker
	if err := os.Remove(join(mnt, "p", "only")); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(join(mnt, "p")); err != nil || !st.IsDir() {
		t.Fatalf("directory vanished with its last child: %v %v", st, err)
	}
	a, err := s.Stat(context.Background(), "p")
	if err != nil || !meta.True(a.Metadata, blobstore.MetaIsFolder) {
		t.Fatalf("marker: %+v %v", a, err)
	}
}

func checkBadNames(t *testing.T, mnt string, s blobstore.Store) {
	for _, name := range []string{"trailing.", "back\\slash", "ctl\x01"} {
		err := os.WriteFile(join(mnt, name), []byte("x"), 0o644)
		wantErrno(t, err, syscall.EINVAL)
	}
	long := string(bytes.Repeat([]byte("n"), 256))
	wantErrno(t, os.WriteFile(join(mnt, long), nil, 0o644), syscall.ENAMETOOLONG)
	page, err := s.List(context.Background(), blobstore.ListOptions{})
	if err != nil || len(page.Blobs) != 0 {
		t.Fatalf("bad names reached the store: %+v %v", page.Blobs, err)
	}
}

func checkUnsupported(t *testing.T, mnt string, s blobstore.Store) {
	mustWrite(t, join(mnt, "f"), []byte("x"))
	wantErrno(t, os.Link(join(mnt, "f"), join(mnt, "g")), syscall.EPERM)
	// No extended attributes: the kernel is told once (ENOSYS) and then
	// answers EOPNOTSUPP itself.
	for range 2 {
		_, err := unix.Getxattr(join(mnt, "f"), "user.x", make([]byte, 64))
		wantErrno(t, err, syscall.EOPNOTSUPP)
		wantErrno(t, unix.Setxattr(join(mnt, "f"), "user.x", []byte("v"), 0), syscall.EOPNOTSUPP)
		_, err = unix.Listxattr(join(mnt, "f"), make([]byte, 64))
		wantErrno(t, err, syscall.EOPNOTSUPP)
	}
	// Reading past the end is not an error.
	f, err := os.Open(join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := f.ReadAt(make([]byte, 10), 100); n != 0 || err != io.EOF {
		t.Fatalf("read past end: %d %v", n, err)
	}
}
