package fusefs

import (
	"context"
	"os"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// Upload buffers of every mount draw on the process's budget: a writer
// waits (or a stream skips a block) once it is taken.
func TestMemoryBudgetUploads(t *testing.T) {
	mem := blobstore.NewMemory()
	fsys, err := New(mem, Options{CacheDir: t.TempDir(), UploadBlockSize: 1 << 20, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	memory.SetBudget(8 << 20) // a quarter for uploads: two 1 MiB blocks
	defer memory.SetBudget(0)
	ctx := context.Background()
	b1, ok1, _ := fsys.up.Buffers.Take(ctx, 1<<20, false)
	b2, ok2, _ := fsys.up.Buffers.Take(ctx, 1<<20, false)
	_, ok3, _ := fsys.up.Buffers.Take(ctx, 1<<20, false)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("took %v %v %v; want two buffers of 1 MiB from a 2 MiB upload budget, then none", ok1, ok2, ok3)
	}
	got := make(chan bool)
	go func() {
		b, ok, _ := fsys.up.Buffers.Take(ctx, 1<<20, true)
		if ok {
			fsys.up.Buffers.Give(b)
		}
		got <- ok
	}()
	fsys.up.Buffers.Give(b1)
	if !<-got {
		t.Error("a waiting writer did not get the buffer given back")
	}
	fsys.up.Buffers.Give(b2)
	// A whole-file upload through the budget lands intact.
	data := pattern(5<<20+3, 4)
	mnt, _ := mountStore(t, mem, Options{UploadBlockSize: 1 << 20})
	if err := os.WriteFile(join(mnt, "up"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if !storeHas(t, mem, "up", data) {
		t.Error("the upload under a budget is not in the store whole")
	}
}
