package memory

import (
	"testing"
	"time"
)

// TestBlockBufPool: a freed buffer is handed out again instead of fresh
// memory, and unmapped once it has been idle for bufPoolIdle.
func TestBlockBufPool(t *testing.T) {
	const n = 3 << 20 // a size no other test uses
	a := AllocBlock(n)
	b := AllocBlock(n)
	a[0], b[0] = 1, 2
	FreeBlock(a)
	FreeBlock(b)
	c := AllocBlock(n)
	if Base(c) != Base(b) {
		t.Fatal("alloc after free mapped fresh memory instead of the last buffer freed")
	}
	FreeBlock(c)
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
	_, stillMapped := mappedBufs.bases[Base(a)]
	mappedBufs.Unlock()
	if stillMapped {
		t.Fatal("trimmed buffer still recorded as mapped")
	}
}
