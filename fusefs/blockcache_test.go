package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// TestBlockCacheSmallBlocksByBytes: the last block of a blob takes a
// buffer of its own length, so a cache of two full blocks holds hundreds of
// small files, and the bytes held never exceed the capacity.
func TestBlockCacheSmallBlocksByBytes(t *testing.T) {
	ctx := context.Background()
	mem := blobstore.NewMemory()
	const bs = 1 << 20
	big := bytes.Repeat([]byte("b"), 3*bs)
	putBlob(t, mem, "big", big, nil)
	const files = 400
	for i := range files {
		putBlob(t, mem, fmt.Sprintf("s%03d", i), bytes.Repeat([]byte{byte(i)}, 4096), nil)
	}
	c := newBlockCache(mem, bs, 2*bs, 4)
	read := func(name string, size int64) {
		t.Helper()
		a, err := mem.Stat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, size)
		if _, err := c.read(ctx, name, a.ETag, a.Size, p, 0); err != nil {
			t.Fatal(err)
		}
		if c.used > c.capacity {
			t.Fatalf("after %s: %d bytes of buffers, capacity %d", name, c.used, c.capacity)
		}
	}
	read("big", bs)
	for i := range files {
		read(fmt.Sprintf("s%03d", i), 4096)
	}
	// The small files fit beside the big block: reading them all again
	// costs no request.
	before := mem.Requests()[blobstore.OpReadAt]
	for i := range files {
		read(fmt.Sprintf("s%03d", i), 4096)
	}
	if got := mem.Requests()[blobstore.OpReadAt] - before; got != 0 {
		t.Errorf("second pass over %d small files: %d reads from the store, want 0", files, got)
	}
	// Full blocks evict small ones and still fit.
	for range 3 {
		read("big", 3*bs)
	}
	if c.used > c.capacity {
		t.Fatalf("%d bytes of buffers, capacity %d", c.used, c.capacity)
	}
}
