package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

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

// TestFailedUploadShowsStoredVersion: when a file's upload fails for good
// at close (here the store refuses every upload: EIO), its data goes to
// lost+found and the mount shows what the store holds. A file created
// through the mount disappears; an existing blob shows its stored content
// and size again. Before, the created file stayed listed (and stat'ed) at
// size 0 until the kernel forgot it, and read as empty.
func TestFailedUploadShowsStoredVersion(t *testing.T) {
	mem := blobstore.NewMemory()
	putBlob(t, mem, "existing", []byte("stored content\n"), nil)
	refuse := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	opts := Options{CacheDir: t.TempDir()}
	mnt, _ := mountStore(t, refuse, opts)
	mustRead(t, join(mnt, "existing")) // known to the mount before the failure
	refuse.SetOptions(blobstore.FaultOptions{
		OpErrorRate: map[blobstore.Op]float64{blobstore.OpPut: 1, blobstore.OpStageBlock: 1, blobstore.OpCommitBlocks: 1},
		Err:         blobstore.ErrUnauthorized,
	})
	for _, name := range []string{"created", "existing"} {
		err := writeAndClose(join(mnt, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, []byte("never stored\n"))
		wantErrno(t, err, syscall.EIO)
		if kept := waitLostFound(t, opts.CacheDir, name); string(kept) != "never stored\n" {
			t.Errorf("%s: lost+found holds %q", name, kept)
		}
	}
	refuse.SetOptions(blobstore.FaultOptions{})

	// The kernel may answer from its caches for their timeout (1 s): wait
	// for the mount to agree with the store, well beyond that.
	var (
		errCreated, errExisting error
		listed                  bool
		existing                []byte
	)
	shown := pollUntil(10*time.Second, func() bool {
		_, errCreated = os.Stat(join(mnt, "created"))
		des, err := os.ReadDir(mnt)
		if err != nil {
			t.Fatal(err)
		}
		listed = false
		for _, d := range des {
			listed = listed || d.Name() == "created"
		}
		existing, errExisting = os.ReadFile(join(mnt, "existing"))
		return errors.Is(errCreated, os.ErrNotExist) && !listed && errExisting == nil && string(existing) == "stored content\n"
	})
	if !shown {
		t.Fatalf("10 s after the failed uploads: created: stat %v, listed %v; existing reads %q (%v), want it gone and %q",
			errCreated, listed, existing, errExisting, "stored content\n")
	}
	wantNoBlob(t, mem, "created")
	wantBlob(t, mem, "existing", []byte("stored content\n"))
}
