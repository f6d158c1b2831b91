package fusefs

import (
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
