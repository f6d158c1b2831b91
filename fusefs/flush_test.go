package fusefs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// TestFlushIgnoresInterrupt: the kernel interrupts a FLUSH whenever the
// closing thread gets a signal; the upload must go on and close succeed.
func TestFlushIgnoresInterrupt(t *testing.T) {
	mem := blobstore.NewMemory()
	fsys, err := New(mem, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	var out fuse.CreateOut
	in := &fuse.CreateIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Flags: 1 /* O_WRONLY */, Mode: 0o644}
	if st := fsys.Create(nil, in, "f", &out); !st.Ok() {
		t.Fatalf("create: %v", st)
	}
	if _, st := fsys.Write(nil, &fuse.WriteIn{Fh: out.Fh}, []byte("payload")); !st.Ok() {
		t.Fatalf("write: %v", st)
	}
	interrupted := make(chan struct{})
	close(interrupted)
	if st := fsys.Flush(interrupted, &fuse.FlushIn{Fh: out.Fh}); !st.Ok() {
		t.Fatalf("flush with an interrupt pending: %v", st)
	}
	wantBlob(t, mem, "f", []byte("payload"))
}

// Unmounted (the end of a foreground mount, after its last Sync) lets go of
// the spill files of files whose RELEASE never came: the kernel sends it
// after close returns, so a mount stopped right after a write left one in
// the cache directory. A file with changes the store lacks keeps its spill
// file: that is where its data is. (The files stay open here; after a real
// unmount no request can use them.)
func TestUnmountedDropsCleanSpills(t *testing.T) {
	mem := blobstore.NewMemory()
	mnt, fsys := mountStore(t, mem, Options{})
	clean, err := os.Create(join(mnt, "clean"))
	if err != nil {
		t.Fatal(err)
	}
	defer clean.Close()
	mustWriteHandle(t, clean, []byte("committed"))
	if err := clean.Sync(); err != nil {
		t.Fatal(err)
	}
	spills := func() []string {
		t.Helper()
		names, err := filepath.Glob(filepath.Join(fsys.spillDir, spillPrefix+"*"))
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	if n := len(spills()); n != 1 {
		t.Fatalf("%d spill files for one open file, want 1", n)
	}
	fsys.Unmounted()
	if left := spills(); len(left) != 0 {
		t.Fatalf("spill files left for a file with nothing unsaved: %v", left)
	}
	if got := blobContent(t, mem, "clean"); string(got) != "committed" {
		t.Fatalf("store has %q", got)
	}

	// A file with changes the store lacks keeps its spill file.
	dirty, err := os.Create(join(mnt, "dirty"))
	if err != nil {
		t.Fatal(err)
	}
	defer dirty.Close()
	mustWriteHandle(t, dirty, []byte("not uploaded"))
	fsys.Unmounted()
	if n := len(spills()); n != 1 {
		t.Fatalf("%d spill files for a file with unsaved changes, want 1", n)
	}
}
