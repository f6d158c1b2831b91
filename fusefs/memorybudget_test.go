package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// The read caches of many mounts stay within the process's budget (plus
// two blocks per cache) while all of them stream at once, every byte read
// is right, and a cache over its share gives memory back to the others.
func TestMemoryBudgetSharedByCaches(t *testing.T) {
	ctx := context.Background()
	mem := blobstore.NewMemory()
	const bs = 1 << 20
	const caches, blobSize = 12, 24 * bs
	for i := range caches {
		putBlob(t, mem, fmt.Sprintf("b%02d", i), pattern(blobSize, byte(i)), nil)
	}
	base, _, _ := memory.Use() // caches of other tests, never closed
	const budget = 32 * bs     // three quarters for reads: 24 blocks
	memory.SetBudget(budget + base*4/3)
	defer memory.SetBudget(0)
	_, limit, _ := memory.Use()

	cs := make([]*blockCache, caches)
	for i := range cs {
		cs[i] = newBlockCache(mem, bs, 16*bs, 4) // each alone could take 16 blocks
		defer cs[i].close()
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			used, _, _ := memory.Use()
			if used > peak.Load() {
				peak.Store(used)
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, caches)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("b%02d", i)
			a, err := mem.Stat(ctx, name)
			if err != nil {
				errs <- err
				return
			}
			want := pattern(blobSize, byte(i))
			buf := make([]byte, 256<<10)
			for pass := range 2 {
				for off := int64(0); off < blobSize; off += int64(len(buf)) {
					// Read-ahead as a stream would ask for it.
					for k := int64(1); k <= 4; k++ {
						c.prefetch(blockKey{name, a.ETag, off/bs + k}, a.Size, uint64(i+1))
					}
					n, err := c.read(ctx, name, a.ETag, a.Size, buf, off)
					if err != nil || !bytes.Equal(buf[:n], want[off:off+int64(n)]) {
						errs <- fmt.Errorf("%s pass %d at %d: %d bytes, %v", name, pass, off, n, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	bound := limit + caches*2*bs
	t.Logf("peak %d MiB of read buffers over %d caches; budget for reads %d MiB, bound with two blocks a cache %d MiB",
		(peak.Load()-base)>>20, caches, (limit-base)>>20, (bound-base)>>20)
	if peak.Load() > bound {
		t.Errorf("peak %d bytes over the bound %d", peak.Load(), bound)
	}

	// One cache holds what it read; another reading now takes that
	// memory back (its own share is free).
	a, b := cs[0], cs[1]
	fill := func(c *blockCache, name string) {
		at, _ := mem.Stat(ctx, name)
		buf := make([]byte, blobSize)
		if _, err := c.read(ctx, name, at.ETag, at.Size, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cs[2:] {
		c.close()
	}
	fill(a, "b00")
	held := a.usage()
	fill(b, "b01")
	if a.usage() >= held && b.usage() <= 2*bs {
		t.Errorf("cache a kept %d bytes and b got %d: nothing was reclaimed", a.usage(), b.usage())
	}
	if used, _, _ := memory.Use(); used > limit+2*2*bs {
		t.Errorf("%d bytes of read buffers, limit %d", used, limit)
	}
}

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
	b1, ok1, _ := fsys.uploads.Take(ctx, 1<<20, false)
	b2, ok2, _ := fsys.uploads.Take(ctx, 1<<20, false)
	_, ok3, _ := fsys.uploads.Take(ctx, 1<<20, false)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("took %v %v %v; want two buffers of 1 MiB from a 2 MiB upload budget, then none", ok1, ok2, ok3)
	}
	got := make(chan bool)
	go func() {
		b, ok, _ := fsys.uploads.Take(ctx, 1<<20, true)
		if ok {
			fsys.uploads.Give(b)
		}
		got <- ok
	}()
	fsys.uploads.Give(b1)
	if !<-got {
		t.Error("a waiting writer did not get the buffer given back")
	}
	fsys.uploads.Give(b2)
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
