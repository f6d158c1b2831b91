package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

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

// TestBlockCacheCloseUnmapsBuffers: full-size buffers are mapped outside the
// Go heap; close frees every one not pinned at once and a pinned one when
// its pin goes, and a read after close still returns the right bytes
// without keeping any buffer.
func TestBlockCacheCloseUnmapsBuffers(t *testing.T) {
	ctx := context.Background()
	mem := blobstore.NewMemory()
	const bs = 1 << 20
	data := make([]byte, 4*bs+100)
	for i := range data {
		data[i] = byte(i * 7)
	}
	putBlob(t, mem, "f", data, nil)
	a, err := mem.Stat(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	mapped := blockBufsInUse
	before := mapped()
	c := newBlockCache(mem, bs, 8*bs, 4)
	p := make([]byte, len(data))
	if _, err := c.read(ctx, "f", a.ETag, a.Size, p, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, data) {
		t.Fatal("read returned other bytes")
	}
	if got := mapped() - before; got != 4 {
		t.Fatalf("%d buffers mapped for 4 full blocks and a 100-byte tail, want 4", got)
	}
	pinned, err := c.get(ctx, blockKey{"f", a.ETag, 1}, a.Size)
	if err != nil {
		t.Fatal(err)
	}
	c.close()
	if got := mapped() - before; got != 1 {
		t.Fatalf("after close, %d buffers still mapped, want the pinned one", got)
	}
	if !bytes.Equal(pinned.buf, data[bs:2*bs]) {
		t.Fatal("pinned block changed by close")
	}
	c.unpin(pinned)
	if got := mapped() - before; got != 0 || c.used != 0 {
		t.Fatalf("after the last unpin: %d buffers mapped, %d bytes used; want none", got, c.used)
	}
	clear(p)
	if _, err := c.read(ctx, "f", a.ETag, a.Size, p, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, data) {
		t.Fatal("read after close returned other bytes")
	}
	if c.prefetch(blockKey{"f", a.ETag, 0}, a.Size, 0) {
		t.Fatal("prefetch started after close")
	}
	if got := mapped() - before; got != 0 || c.used != 0 || len(c.blocks) != 0 {
		t.Fatalf("after a read past close: %d buffers mapped, %d bytes used, %d blocks; want none", got, c.used, len(c.blocks))
	}
}

// blockBufsInUse counts the mapped block buffers not waiting in the pool.
func blockBufsInUse() int {
	mappedBufs.Lock()
	n := len(mappedBufs.bases)
	mappedBufs.Unlock()
	bufPool.Lock()
	defer bufPool.Unlock()
	for _, l := range bufPool.bySize {
		n -= len(l)
	}
	return n
}

// TestBlockBufPool: a freed buffer is handed out again instead of fresh
// memory, and unmapped once it has been idle for bufPoolIdle.
func TestBlockBufPool(t *testing.T) {
	const n = 3 << 20 // a size no other test uses
	a := allocBlockBuf(n)
	b := allocBlockBuf(n)
	a[0], b[0] = 1, 2
	freeBlockBuf(a)
	freeBlockBuf(b)
	c := allocBlockBuf(n)
	if bufBase(c) != bufBase(b) {
		t.Fatal("alloc after free mapped fresh memory instead of the last buffer freed")
	}
	freeBlockBuf(c)
	pooled := func() int {
		bufPool.Lock()
		defer bufPool.Unlock()
		return len(bufPool.bySize[n])
	}
	if pooled() != 2 {
		t.Fatalf("%d buffers of %d bytes pooled, want 2", pooled(), n)
	}
	trimBufPool(time.Now().Add(bufPoolIdle / 2))
	if pooled() != 2 {
		t.Fatal("trim unmapped buffers idle for less than bufPoolIdle")
	}
	trimBufPool(time.Now().Add(bufPoolIdle))
	if pooled() != 0 {
		t.Fatalf("%d buffers still pooled after bufPoolIdle", pooled())
	}
	mappedBufs.Lock()
	_, stillMapped := mappedBufs.bases[bufBase(a)]
	mappedBufs.Unlock()
	if stillMapped {
		t.Fatal("trimmed buffer still recorded as mapped")
	}
}
