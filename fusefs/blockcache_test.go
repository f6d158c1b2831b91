package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/memory"
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
	mapped := memory.BlocksInUse
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

// TestBlockCachePassedBlocksGoFirst: the buffer of a block a stream has
// passed is taken for the next block before the cache grows or evicts
// another file's block; a passed block read again is kept like any other,
// and so is one another handle's read-ahead asked for too.
func TestBlockCachePassedBlocksGoFirst(t *testing.T) {
	ctx := context.Background()
	mem := blobstore.NewMemory()
	const bs = 64 << 10
	putBlob(t, mem, "hot", pattern(bs, 1), nil)
	big := pattern(16*bs, 2)
	putBlob(t, mem, "big", big, nil)
	hot, err := mem.Stat(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	a, err := mem.Stat(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	c := newBlockCache(mem, bs, 8*bs, 4)
	p := make([]byte, bs)
	read := func(name, etag string, size, idx int64) {
		t.Helper()
		if _, err := c.read(ctx, name, etag, size, p, idx*bs); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int64) blockKey { return blockKey{"big", a.ETag, i} }
	const stream = 1 // the handle streaming through big
	// stream reads block i of big as a stream does: asked for by its
	// read-ahead, then read.
	streamRead := func(i int64) {
		t.Helper()
		if !c.prefetch(key(i), a.Size, stream) {
			t.Fatalf("prefetch of block %d reported it neither cached nor on its way", i)
		}
		read("big", a.ETag, a.Size, i)
	}
	used := func() int64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.used / bs
	}
	cached := func(name, etag string, idx int64) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.blocks[blockKey{name, etag, idx}] != nil
	}

	read("hot", hot.ETag, hot.Size, 0)
	for i := range int64(4) {
		streamRead(i)
	}
	if got := used(); got != 5 {
		t.Fatalf("%d blocks of buffers after 5 blocks read, want 5", got)
	}
	c.pass(key(0), stream)
	c.pass(key(1), stream)
	// Blocks 4 and 5 take the passed blocks' buffers: no growth.
	streamRead(4)
	streamRead(5)
	if got := used(); got != 5 {
		t.Errorf("%d blocks of buffers after reading two blocks in place of two passed ones, want 5", got)
	}
	if cached("big", a.ETag, 0) || cached("big", a.ETag, 1) {
		t.Error("a passed block is still cached after its buffer was needed")
	}
	for _, i := range []int64{2, 3, 4, 5} {
		if !cached("big", a.ETag, i) {
			t.Errorf("block %d was evicted, with passed blocks to take", i)
		}
	}
	if !cached("hot", hot.ETag, 0) {
		t.Error("another file's block was evicted, with passed blocks to take")
	}
	// Read again after it was passed: wanted, kept like any other.
	c.pass(key(2), stream)
	read("big", a.ETag, a.Size, 2)
	streamRead(6)
	if got := used(); got != 6 {
		t.Errorf("%d blocks of buffers, want 6: block 6 should grow the cache, block 2 was read again", got)
	}
	if !cached("big", a.ETag, 2) {
		t.Error("a passed block read again was evicted first")
	}
	// A handle that seeks demotes its unread read-ahead blocks into lru:
	// a passed block still goes first.
	if !c.prefetch(key(13), a.Size, 3) {
		t.Fatal("prefetch of block 13 reported it neither cached nor on its way")
	}
	settleFetches(t, c)
	c.pass(key(3), stream)
	c.demote(3)
	streamRead(7)
	if got := used(); got != 7 || cached("big", a.ETag, 3) || !cached("big", a.ETag, 13) {
		t.Errorf("after passing block 3, demoting block 13 and reading block 7: %d blocks of buffers (want 7), block 3 cached %v (want false), block 13 cached %v (want true)", got, cached("big", a.ETag, 3), cached("big", a.ETag, 13))
	}
	// Block 8, asked for by another handle's read-ahead too before the
	// stream passes it (a second reader following the first): kept.
	// Block 9, asked for by the stream alone, twice, is passed.
	for _, k := range []int64{8, 9} {
		if !c.prefetch(key(k), a.Size, stream) {
			t.Fatalf("prefetch of block %d reported it neither cached nor on its way", k)
		}
	}
	if !c.prefetch(key(8), a.Size, 2) {
		t.Fatal("prefetch of a cached block reported it neither cached nor on its way")
	}
	streamRead(8)
	streamRead(9)
	c.pass(key(8), stream)
	c.pass(key(9), stream)
	streamRead(10)
	if got := used(); got != 8 || !cached("big", a.ETag, 8) || cached("big", a.ETag, 9) {
		t.Errorf("after passing blocks 8 (shared) and 9 and reading block 10: %d blocks of buffers (want 8), block 8 cached %v (want true), block 9 cached %v (want false)", got, cached("big", a.ETag, 8), cached("big", a.ETag, 9))
	}
	// Only the stream that fetched a block passes it; a block not
	// cached, or passed twice, changes nothing; the block passed longest
	// ago goes first.
	c.pass(key(2), 2)
	c.pass(key(10), stream)
	c.pass(key(15), stream)
	c.pass(key(2), stream)
	c.pass(key(2), stream)
	streamRead(11)
	if got := used(); got != 8 || cached("big", a.ETag, 10) || !cached("big", a.ETag, 2) {
		t.Errorf("after passing blocks 10 and 2 and reading block 11: %d blocks of buffers (want 8), block 10 cached %v (want false: passed longest ago), block 2 cached %v (want true)", got, cached("big", a.ETag, 10), cached("big", a.ETag, 2))
	}
	// A block a demand read fetched is not passed: its reader is not known.
	read("hot", hot.ETag, hot.Size, 0)
	c.pass(blockKey{"hot", hot.ETag, 0}, stream)
	c.pass(blockKey{"hot", hot.ETag, 0}, 0)
	c.mu.Lock()
	hotPassed := c.passed.Len() > 1 || c.blocks[blockKey{"hot", hot.ETag, 0}].passed
	c.mu.Unlock()
	if hotPassed {
		t.Error("a block fetched by a demand read was passed")
	}
	// Full: the passed blocks are gone and the oldest read block goes.
	for i := int64(12); i < 16; i++ {
		streamRead(i)
	}
	if got := used(); got > 8 {
		t.Errorf("%d blocks of buffers in a cache of 8", got)
	}
	got := make([]byte, 16*bs)
	if _, err := c.read(ctx, "big", a.ETag, a.Size, got, 0); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("a whole read after all that: %v, bytes equal %v", err, bytes.Equal(got, big))
	}
}
