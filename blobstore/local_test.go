package blobstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests look at the local store's files on disk; the behaviour it
// shares with the other backends is in conformance_test.go.

func newLocal(t *testing.T) *Local {
	t.Helper()
	l, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustPut(t *testing.T, s Store, name, data string, md map[string]string) Attrs {
	t.Helper()
	a, err := s.Put(t.Context(), name, []byte(data), PutOptions{Metadata: md})
	if err != nil {
		t.Fatalf("Put(%q): %v", name, err)
	}
	return a
}

func fileContent(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func listNames(t *testing.T, s Store, opts ListOptions) []string {
	t.Helper()
	var out []string
	for {
		page, err := s.List(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range page.Blobs {
			out = append(out, b.Name)
		}
		out = append(out, page.Prefixes...)
		if page.NextMarker == "" {
			return out
		}
		opts.Marker = page.NextMarker
	}
}

func TestLocalLayout(t *testing.T) {
	l := newLocal(t)
	a := mustPut(t, l, "a/b/c.txt", "hello", map[string]string{"k": "v"})
	path := filepath.Join(l.Dir(), "a", "b", "c.txt")
	if got := fileContent(t, path); got != "hello" {
		t.Errorf("blob a/b/c.txt is %q on disk, want the natural file with its content", got)
	}
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, localMetaXattr, buf)
	if err != nil {
		t.Fatalf("xattr %s: %v", localMetaXattr, err)
	}
	var m localMeta
	if err := json.Unmarshal(buf[:n], &m); err != nil || m.ETag != a.ETag || m.Metadata["k"] != "v" {
		t.Errorf("xattr = %s (%v), want the ETag %s and metadata", buf[:n], err, a.ETag)
	}
	if _, err := os.Stat(filepath.Join(l.Dir(), localStaging)); err != nil {
		t.Errorf("no staging area: %v", err)
	}
	if got := listNames(t, l, ListOptions{Delimiter: "/"}); len(got) != 1 || got[0] != "a/" {
		t.Errorf("List = %q, want only a/ (the staging area is hidden)", got)
	}
}

func TestLocalSelfFile(t *testing.T) {
	for _, exchange := range []bool{true, false} {
		t.Run(fmt.Sprintf("exchange=%v", exchange), func(t *testing.T) {
			l := newLocal(t)
			l.noExchange = !exchange
			ctx := t.Context()
			dirA := filepath.Join(l.Dir(), "a")
			self := filepath.Join(dirA, localSelf)
			marker := mustPut(t, l, "a", "", map[string]string{MetaIsFolder: "true"})
			if fi, err := os.Lstat(dirA); err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("blob a alone should be the file DIR/a: %v %v", fi, err)
			}
			mustPut(t, l, "a/b", "child", nil)
			if fi, err := os.Lstat(dirA); err != nil || !fi.IsDir() {
				t.Fatalf("DIR/a should now be a directory: %v %v", fi, err)
			}
			if _, err := os.Lstat(self); err != nil {
				t.Fatalf("blob a should live in %s: %v", self, err)
			}
			got, err := l.Stat(ctx, "a")
			if err != nil || got.ETag != marker.ETag || got.Metadata[MetaIsFolder] != "true" {
				t.Errorf("Stat(a) = %+v, %v: moving the blob must not change it", got, err)
			}
			if entries, _ := os.ReadDir(l.tmpDir); len(entries) != 0 {
				t.Errorf("staging area not clean after the conversion: %v", entries)
			}
			mustPut(t, l, "a/b/c/d", "deep", nil) // a/b converts too
			if c := fileContent(t, filepath.Join(dirA, "b", localSelf)); c != "child" {
				t.Errorf("a/b's self file holds %q", c)
			}
			for _, name := range []string{"a/b/c/d", "a/b"} {
				if err := l.Delete(ctx, name, Conditions{}); err != nil {
					t.Fatal(err)
				}
			}
			if entries, err := os.ReadDir(dirA); err != nil || len(entries) != 1 || entries[0].Name() != localSelf {
				t.Errorf("DIR/a after deleting its children: %v, %v; want only the self file", entries, err)
			}
			if got := listNames(t, l, ListOptions{Delimiter: "/"}); len(got) != 1 || got[0] != "a" {
				t.Errorf("List = %q, want just the blob a", got)
			}
			if err := l.Delete(ctx, "a", Conditions{}); err != nil {
				t.Fatal(err)
			}
			if entries, _ := os.ReadDir(l.Dir()); len(entries) != 1 || entries[0].Name() != localStaging {
				t.Errorf("root after deleting everything: %v, want only the staging area", entries)
			}
		})
	}
}

// TestLocalRecoverConversion simulates a crash inside the fallback
// conversion (no RENAME_EXCHANGE), after the blob file was removed and
// before the directory holding it took its place.
func TestLocalRecoverConversion(t *testing.T) {
	cases := []struct {
		name         string
		targetExists bool
	}{
		{"target missing: finish it", false},
		{"target present: the directory is garbage", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := newLocal(t)
			a := mustPut(t, l, "x/a", "blob a", map[string]string{"k": "v"})
			src := filepath.Join(l.Dir(), "x", "a")
			conv := filepath.Join(l.tmpDir, "conv-123")
			if err := os.Mkdir(conv, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(src, filepath.Join(conv, localSelf)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(conv+convTargetSuffix, []byte("x/a"), 0o600); err != nil {
				t.Fatal(err)
			}
			if !c.targetExists {
				if err := os.Remove(src); err != nil {
					t.Fatal(err)
				}
			}
			l2, err := NewLocal(l.Dir())
			if err != nil {
				t.Fatal(err)
			}
			got, err := l2.Stat(t.Context(), "x/a")
			if err != nil || got.ETag != a.ETag {
				t.Fatalf("Stat(x/a) after recovery = %+v, %v; want the blob back", got, err)
			}
			if entries, _ := os.ReadDir(l.tmpDir); len(entries) != 0 {
				t.Errorf("staging area after recovery: %v", entries)
			}
		})
	}
}

func TestLocalCleansStagingArea(t *testing.T) {
	l := newLocal(t)
	old := time.Now().Add(-8 * 24 * time.Hour)
	make := func(path string, mtime time.Time, dir bool) {
		t.Helper()
		var err error
		if dir {
			err = os.Mkdir(path, 0o700)
		} else {
			err = os.WriteFile(path, []byte("x"), 0o600)
		}
		if err == nil {
			err = os.Chtimes(path, mtime, mtime)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	entries := []struct {
		path string
		dir  bool
		old  bool
		kept bool
	}{
		{filepath.Join(l.tmpDir, "put-old"), false, true, false},
		{filepath.Join(l.tmpDir, "put-new"), false, false, true}, // may belong to a running writer
		{filepath.Join(l.tmpDir, "claim-old"), true, true, false},
		{filepath.Join(l.tmpDir, "drop-new"), true, false, false}, // only used under the lock
		{filepath.Join(l.blockDir, "oldblocks"), true, true, false},
		{filepath.Join(l.blockDir, "newblocks"), true, false, true},
	}
	for _, e := range entries {
		mtime := time.Now()
		if e.old {
			mtime = old
		}
		make(e.path, mtime, e.dir)
	}
	if _, err := NewLocal(l.Dir()); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		_, err := os.Lstat(e.path)
		if kept := err == nil; kept != e.kept {
			t.Errorf("%s: kept = %v, want %v", e.path, kept, e.kept)
		}
	}
}

func TestLocalNames(t *testing.T) {
	l := newLocal(t)
	ctx := t.Context()
	for _, name := range []string{
		".blobfs-tmp/lock", ".blobfs-tmp", "a/.blobfs-self", "a/.blobfs-anything/b",
		strings.Repeat("n", 256), "a/" + strings.Repeat("n", 256),
	} {
		_, err := l.Put(ctx, name, []byte("x"), PutOptions{})
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("Put(%.50q): %v, want ErrInvalidName", name, err)
		}
		_, err = l.Stat(ctx, name)
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("Stat(%.50q): %v, want ErrInvalidName", name, err)
		}
	}
	// 255 bytes is a valid file name, and a leading dot is fine.
	for _, name := range []string{strings.Repeat("n", 255), ".blobfs", ".hidden/.blobfsx"} {
		if _, err := l.Put(ctx, name, []byte("x"), PutOptions{}); err != nil {
			t.Errorf("Put(%.50q): %v", name, err)
		}
	}
}

// TestLocalForeignFiles: files put into the directory by hand are served
// (without metadata); what cannot be a blob is ignored, and symlinks are
// never followed.
func TestLocalForeignFiles(t *testing.T) {
	l := newLocal(t)
	ctx := t.Context()
	dir := l.Dir()
	if err := os.MkdirAll(filepath.Join(dir, "hand"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "hand", "made.txt")
	if err := os.WriteFile(path, []byte("by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"trailing.", ".blobfs-x"} {
		if err := os.WriteFile(filepath.Join(dir, "hand", junk), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "hand", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(dir, "etc")); err != nil {
		t.Fatal(err)
	}
	a, err := l.Stat(ctx, "hand/made.txt")
	if err != nil || a.Size != 7 || a.ETag == "" || !a.ModTime.Equal(mtime) || len(a.Metadata) != 0 {
		t.Fatalf("Stat of a hand-made file = %+v, %v", a, err)
	}
	if got := listNames(t, l, ListOptions{}); len(got) != 1 || got[0] != "hand/made.txt" {
		t.Errorf("List = %q, want only hand/made.txt", got)
	}
	for _, name := range []string{"hand/link", "etc/passwd", "etc"} {
		if _, err := l.Stat(ctx, name); !errors.Is(err, ErrNotFound) {
			t.Errorf("Stat(%q) through a symlink: %v, want ErrNotFound", name, err)
		}
	}
	if err := os.WriteFile(path, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := l.Stat(ctx, "hand/made.txt"); err != nil || b.ETag == a.ETag {
		t.Errorf("ETag after changing the file by hand: %+v, %v; want a new one", b, err)
	}
}

// TestLocalTwoInstances has two stores on one directory (two processes,
// or an old and a new one during a hand-over) increment a counter under
// If-Match: the flock must make check-and-rename atomic across them.
func TestLocalTwoInstances(t *testing.T) {
	l1 := newLocal(t)
	l2, err := NewLocal(l1.Dir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mustPut(t, l1, "n", "0", nil)
	const each = 15
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, s := range []*Local{l1, l2, l1, l2} {
		wg.Go(func() {
			for done := 0; done < each; {
				a, err := s.Stat(ctx, "n")
				if err != nil {
					errs <- err
					return
				}
				buf := make([]byte, a.Size)
				n, err := s.ReadAt(ctx, "n", buf, 0, a.ETag)
				if errors.Is(err, ErrPreconditionFailed) {
					continue
				}
				v, _ := strconv.Atoi(string(buf[:n]))
				_, err = s.Put(ctx, "n", []byte(strconv.Itoa(v+1)), PutOptions{Conditions: Conditions{IfMatch: a.ETag}})
				if errors.Is(err, ErrPreconditionFailed) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				done++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := fileContent(t, filepath.Join(l1.Dir(), "n")); got != strconv.Itoa(4*each) {
		t.Errorf("counter = %s, want %d", got, 4*each)
	}
}

// TestLocalStagedBlocksSurviveRestart: blocks staged by one process can be
// committed by the next, as the filesystem's uploader does after a
// restart.
func TestLocalStagedBlocksSurviveRestart(t *testing.T) {
	l := newLocal(t)
	ctx := t.Context()
	ids := []string{BlockID("nonce", 0), BlockID("nonce", 1)}
	for i, id := range ids {
		if err := l.StageBlock(ctx, "f", id, []byte{'a' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	l2, err := NewLocal(l.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.CommitBlocks(ctx, "f", ids, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := fileContent(t, filepath.Join(l.Dir(), "f")); got != "ab" {
		t.Errorf("content %q", got)
	}
	if entries, _ := os.ReadDir(l.blockDir); len(entries) != 0 {
		t.Errorf("blocks left after the commit: %v", entries)
	}
}

// TestLocalFailedCommitKeepsBlocks: a commit that fails its condition
// leaves the staged blocks for another try, as Azure does.
func TestLocalFailedCommitKeepsBlocks(t *testing.T) {
	l := newLocal(t)
	ctx := t.Context()
	old := mustPut(t, l, "f", "v1", nil)
	mustPut(t, l, "f", "v2", nil)
	id := BlockID("n", 0)
	if err := l.StageBlock(ctx, "f", id, []byte("v3")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CommitBlocks(ctx, "f", []string{id}, PutOptions{Conditions: Conditions{IfMatch: old.ETag}}); !errors.Is(err, ErrPreconditionFailed) {
		t.Fatalf("commit with a stale ETag: %v", err)
	}
	if _, err := l.CommitBlocks(ctx, "f", []string{id}, PutOptions{}); err != nil {
		t.Fatalf("commit after the failed one: %v", err)
	}
	if got := fileContent(t, filepath.Join(l.Dir(), "f")); got != "v3" {
		t.Errorf("content %q", got)
	}
}

// TestLocalCommitFailsAfterClaim: when a commit fails after it took the
// staged blocks (here: the blob's parent turned out to be a symlink that
// cannot become a directory), the blocks go back, merged with blocks
// staged meanwhile.
func TestLocalCommitFailsAfterClaim(t *testing.T) {
	l := newLocal(t)
	ctx := t.Context()
	ids := []string{BlockID("n", 0), BlockID("n", 1)}
	for i, id := range ids {
		if err := l.StageBlock(ctx, "s/f", id, []byte{'a' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(l.Dir(), "s")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CommitBlocks(ctx, "s/f", ids, PutOptions{}); err == nil {
		t.Fatal("commit below a symlink succeeded")
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CommitBlocks(ctx, "s/f", ids, PutOptions{}); err != nil {
		t.Fatalf("commit after the failed one: %v", err)
	}
	if got := fileContent(t, filepath.Join(l.Dir(), "s", "f")); got != "ab" {
		t.Errorf("content %q", got)
	}

	// Blocks staged while a commit holds the claimed ones are merged
	// back; a block staged again keeps its newer content.
	for i, id := range ids {
		if err := l.StageBlock(ctx, "g", id, []byte{'a' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	claimed, _, err := l.claimBlocks("g", ids, Conditions{})
	if err != nil {
		t.Fatal(err)
	}
	id2 := BlockID("n", 2)
	for _, st := range []struct{ id, data string }{{ids[1], "B"}, {id2, "c"}} {
		if err := l.StageBlock(ctx, "g", st.id, []byte(st.data)); err != nil {
			t.Fatal(err)
		}
	}
	l.unclaimBlocks("g", claimed)
	if _, err := l.CommitBlocks(ctx, "g", []string{ids[0], ids[1], id2}, PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := fileContent(t, filepath.Join(l.Dir(), "g")); got != "aBc" {
		t.Errorf("content %q, want aBc", got)
	}
}

func TestLocalLargeMetadata(t *testing.T) {
	l := newLocal(t)
	// Valid for Azure (under 8 KiB) but more than one ext4 xattr block:
	// either it round-trips or it is refused as unrepresentable.
	md := map[string]string{"big": strings.Repeat("v", 6000)}
	_, err := l.Put(t.Context(), "f", []byte("x"), PutOptions{Metadata: md})
	switch {
	case errors.Is(err, ErrInvalidName):
		if _, err := l.Stat(t.Context(), "f"); !errors.Is(err, ErrNotFound) {
			t.Errorf("refused Put left a blob: %v", err)
		}
	case err != nil:
		t.Fatalf("Put with 6000 bytes of metadata: %v, want success or ErrInvalidName", err)
	default:
		if a, err := l.Stat(t.Context(), "f"); err != nil || a.Metadata["big"] != md["big"] {
			t.Errorf("metadata did not round-trip: %v", err)
		}
	}
}

func TestLocalCheck(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "store")
	if _, err := NewLocal(dir); !errors.Is(err, ErrNotFound) {
		t.Errorf("NewLocal of a missing directory: %v, want ErrNotFound", err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocal(file); err == nil {
		t.Error("NewLocal of a file succeeded")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(t.Context()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	// A root reached through a symlink works: blobs are opened without
	// following symlinks, but only below the resolved root.
	link := filepath.Join(parent, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	viaLink, err := NewLocal(link)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, viaLink, "f", "x", nil)
	if _, err := viaLink.Stat(t.Context(), "f"); err != nil {
		t.Errorf("Stat through a store opened via a symlink: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(t.Context()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Check after the directory was removed: %v, want ErrNotFound", err)
	}
	if _, err := l.List(t.Context(), ListOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("List after the directory was removed: %v, want ErrNotFound", err)
	}
}

// TestLocalListSkipsSubtrees: listing with a delimiter reads a directory
// only as far as needed to prove that it holds a blob, then seeks past it.
func TestLocalListSkipsSubtrees(t *testing.T) {
	l := newLocal(t)
	const subs, dirs = 5, 20
	for i := range subs {
		for j := range dirs {
			d := filepath.Join(l.Dir(), "d", fmt.Sprintf("sub%d", i), fmt.Sprintf("dir%02d", j))
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "x"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	root, err := (&localCursor{}).readFrame(l.Dir(), "")
	if err != nil {
		t.Fatal(err)
	}
	c := &localCursor{prefix: "d/", stack: []*localFrame{root}}
	_, prefixes, _, err := listPage(t.Context(), ListOptions{Prefix: "d/", Delimiter: "/"}, c.seek)
	if err != nil || len(prefixes) != subs {
		t.Fatalf("listPage = %q, %v", prefixes, err)
	}
	// "d", then each sub and its first dir: not the other dirs.
	if want := 1 + 2*subs; c.reads != want {
		t.Errorf("read %d directories, want %d (of %d)", c.reads, want, 1+subs*(1+dirs))
	}
}

// TestLocalReadIsOneVersion: a reader that opened a blob keeps reading
// that version while it is overwritten (the rename replaces the inode).
func TestLocalReadIsOneVersion(t *testing.T) {
	l := newLocal(t)
	mustPut(t, l, "f", strings.Repeat("1", 100), nil)
	f, err := l.openBlob("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustPut(t, l, "f", strings.Repeat("2", 100), nil)
	buf := make([]byte, 100)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, bytes.Repeat([]byte("1"), 100)) {
		t.Errorf("open version changed under the reader: %q, %v", buf, err)
	}
}

// TestLocalOpenWalk covers the fallback of openNoSymlinks for kernels
// without openat2.
func TestLocalOpenWalk(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "real", "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "sub", "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "real", "sub", "flink")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		ok   bool
	}{
		{"real/sub/f", true},
		{"link/sub/f", false},
		{"real/sub/flink", false},
		{"real/missing", false},
	}
	for _, c := range cases {
		fd, err := openWalk(filepath.Join(dir, c.path), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW)
		if (err == nil) != c.ok {
			t.Errorf("openWalk(%s): %v, want ok=%v", c.path, err, c.ok)
		}
		if err == nil {
			buf := make([]byte, 10)
			n, _ := unix.Read(fd, buf)
			if string(buf[:n]) != "data" {
				t.Errorf("openWalk(%s) read %q", c.path, buf[:n])
			}
			unix.Close(fd)
		}
	}
}

// TestLocalCommittedListLifetime: a commit of blocks leaves the blob's
// committed block list beside it; a Put, a Copy onto it and a Delete take
// it away, so that lists do not pile up for blobs that have none.
func TestLocalCommittedListLifetime(t *testing.T) {
	ctx := t.Context()
	l := newLocal(t)
	id := BlockID("n", 0)
	commit := func(name string) {
		t.Helper()
		if err := l.StageBlock(ctx, name, id, []byte("block")); err != nil {
			t.Fatal(err)
		}
		if _, err := l.CommitBlocks(ctx, name, []string{id}, PutOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := l.readList(name); !ok {
			t.Fatalf("%s: no committed list after a commit", name)
		}
	}
	gone := func(what, name string) {
		t.Helper()
		if _, err := os.Stat(l.listOf(name)); !os.IsNotExist(err) {
			t.Fatalf("%s: the committed list of %s is still there (%v)", what, name, err)
		}
	}
	commit("p")
	if _, err := l.Put(ctx, "p", []byte("put"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	gone("Put", "p")
	commit("c")
	if _, err := l.Copy(ctx, "c", "p"); err != nil {
		t.Fatal(err)
	}
	gone("Copy", "c")
	commit("d")
	if err := l.Delete(ctx, "d", Conditions{}); err != nil {
		t.Fatal(err)
	}
	gone("Delete", "d")
}
