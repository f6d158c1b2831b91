package cache

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
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
	storetest.PutBlob(t, mem, "big", big, nil)
	const files = 400
	for i := range files {
		storetest.PutBlob(t, mem, fmt.Sprintf("s%03d", i), bytes.Repeat([]byte{byte(i)}, 4096), nil)
	}
	c := NewBlockCache(&Sources{Store: mem}, bs, 2*bs, 4)
	read := func(name string, size int64) {
		t.Helper()
		a, err := mem.Stat(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, size)
		if _, err := c.Read(ctx, name, a.ETag, a.Size, p, 0); err != nil {
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
	storetest.PutBlob(t, mem, "f", data, nil)
	a, err := mem.Stat(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	mapped := memory.BlocksInUse
	before := mapped()
	c := NewBlockCache(&Sources{Store: mem}, bs, 8*bs, 4)
	p := make([]byte, len(data))
	if _, err := c.Read(ctx, "f", a.ETag, a.Size, p, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, data) {
		t.Fatal("read returned other bytes")
	}
	if got := mapped() - before; got != 4 {
		t.Fatalf("%d buffers mapped for 4 full blocks and a 100-byte tail, want 4", got)
	}
	pinned, err := c.get(ctx, BlockKey{"f", a.ETag, 1}, a.Size)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
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
	if _, err := c.Read(ctx, "f", a.ETag, a.Size, p, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p, data) {
		t.Fatal("read after close returned other bytes")
	}
	if c.Prefetch(BlockKey{"f", a.ETag, 0}, a.Size, 0) {
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
	storetest.PutBlob(t, mem, "hot", storetest.Pattern(bs, 1), nil)
	big := storetest.Pattern(16*bs, 2)
	storetest.PutBlob(t, mem, "big", big, nil)
	hot, err := mem.Stat(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	a, err := mem.Stat(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	c := NewBlockCache(&Sources{Store: mem}, bs, 8*bs, 4)
	p := make([]byte, bs)
	read := func(name, etag string, size, idx int64) {
		t.Helper()
		if _, err := c.Read(ctx, name, etag, size, p, idx*bs); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int64) BlockKey { return BlockKey{"big", a.ETag, i} }
	const stream = 1 // the handle streaming through big
	// stream reads block i of big as a stream does: asked for by its
	// read-ahead, then read.
	streamRead := func(i int64) {
		t.Helper()
		if !c.Prefetch(key(i), a.Size, stream) {
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
		return c.blocks[BlockKey{name, etag, idx}] != nil
	}

	read("hot", hot.ETag, hot.Size, 0)
	for i := range int64(4) {
		streamRead(i)
	}
	if got := used(); got != 5 {
		t.Fatalf("%d blocks of buffers after 5 blocks read, want 5", got)
	}
	c.Pass(key(0), stream)
	c.Pass(key(1), stream)
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
	c.Pass(key(2), stream)
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
	if !c.Prefetch(key(13), a.Size, 3) {
		t.Fatal("prefetch of block 13 reported it neither cached nor on its way")
	}
	settleFetches(t, c)
	c.Pass(key(3), stream)
	c.Demote(3)
	streamRead(7)
	if got := used(); got != 7 || cached("big", a.ETag, 3) || !cached("big", a.ETag, 13) {
		t.Errorf("after passing block 3, demoting block 13 and reading block 7: %d blocks of buffers (want 7), block 3 cached %v (want false), block 13 cached %v (want true)", got, cached("big", a.ETag, 3), cached("big", a.ETag, 13))
	}
	// Block 8, asked for by another handle's read-ahead too before the
	// stream passes it (a second reader following the first): kept.
	// Block 9, asked for by the stream alone, twice, is passed.
	for _, k := range []int64{8, 9} {
		if !c.Prefetch(key(k), a.Size, stream) {
			t.Fatalf("prefetch of block %d reported it neither cached nor on its way", k)
		}
	}
	if !c.Prefetch(key(8), a.Size, 2) {
		t.Fatal("prefetch of a cached block reported it neither cached nor on its way")
	}
	streamRead(8)
	streamRead(9)
	c.Pass(key(8), stream)
	c.Pass(key(9), stream)
	streamRead(10)
	if got := used(); got != 8 || !cached("big", a.ETag, 8) || cached("big", a.ETag, 9) {
		t.Errorf("after passing blocks 8 (shared) and 9 and reading block 10: %d blocks of buffers (want 8), block 8 cached %v (want true), block 9 cached %v (want false)", got, cached("big", a.ETag, 8), cached("big", a.ETag, 9))
	}
	// Only the stream that fetched a block passes it; a block not
	// cached, or passed twice, changes nothing; the block passed longest
	// ago goes first.
	c.Pass(key(2), 2)
	c.Pass(key(10), stream)
	c.Pass(key(15), stream)
	c.Pass(key(2), stream)
	c.Pass(key(2), stream)
	streamRead(11)
	if got := used(); got != 8 || cached("big", a.ETag, 10) || !cached("big", a.ETag, 2) {
		t.Errorf("after passing blocks 10 and 2 and reading block 11: %d blocks of buffers (want 8), block 10 cached %v (want false: passed longest ago), block 2 cached %v (want true)", got, cached("big", a.ETag, 10), cached("big", a.ETag, 2))
	}
	// A block a demand read fetched is not passed: its reader is not known.
	read("hot", hot.ETag, hot.Size, 0)
	c.Pass(BlockKey{"hot", hot.ETag, 0}, stream)
	c.Pass(BlockKey{"hot", hot.ETag, 0}, 0)
	c.mu.Lock()
	hotPassed := c.passed.Len() > 1 || c.blocks[BlockKey{"hot", hot.ETag, 0}].passed
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
	if _, err := c.Read(ctx, "big", a.ETag, a.Size, got, 0); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("a whole read after all that: %v, bytes equal %v", err, bytes.Equal(got, big))
	}
}

func openDiskCache(t *testing.T, capacity int64) *DiskCache {
	t.Helper()
	c, err := OpenDiskCache(t.TempDir(), capacity)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func cacheFiles(t *testing.T, c *DiskCache) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(c.Dir(), "*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// What a cache file holds is known by units; a range is served only when
// every unit under it was written, the last unit of a blob being short.
func TestDiskCacheUnits(t *testing.T) {
	c := openDiskCache(t, 1<<30)
	size := int64(3*diskUnit + 100)
	data := storetest.Pattern(int(size), 3)
	buf := make([]byte, 2*diskUnit)

	// Half a unit covers none: nothing kept, nothing served.
	c.store("ns", "a", `"1"`, size, data[:diskUnit/2], 0)
	if _, ok := c.read("ns", "a", `"1"`, size, buf[:10], 0); ok {
		t.Fatal("a range never wholly written was served")
	}
	// Units 1 and 2, written by a range that starts mid-unit 0.
	c.store("ns", "a", `"1"`, size, data[diskUnit/2:3*diskUnit], diskUnit/2)
	if n, ok := c.read("ns", "a", `"1"`, size, buf, diskUnit); !ok || !bytes.Equal(buf[:n], data[diskUnit:3*diskUnit]) {
		t.Fatalf("units 1-2: %d, %v", n, ok)
	}
	if _, ok := c.read("ns", "a", `"1"`, size, buf[:10], diskUnit-5); ok {
		t.Fatal("a range reaching into unit 0, never wholly written, was served")
	}
	if c.complete("ns", "a", `"1"`, size) != nil {
		t.Fatal("complete with units 0 and 3 missing")
	}
	// The short last unit, then unit 0: the blob is whole.
	c.store("ns", "a", `"1"`, size, data[3*diskUnit:], 3*diskUnit)
	c.store("ns", "a", `"1"`, size, data[:diskUnit], 0)
	e := c.complete("ns", "a", `"1"`, size)
	if e == nil {
		t.Fatal("not complete with every unit written")
	}
	whole, err := os.ReadFile(e.path)
	c.unpin(e)
	if err != nil || !bytes.Equal(whole, data) {
		t.Fatalf("the cache file is not the blob: %d bytes, %v", len(whole), err)
	}
	// Reads past the end are clamped to it.
	if n, ok := c.read("ns", "a", `"1"`, size, buf, 3*diskUnit); !ok || n != 100 || !bytes.Equal(buf[:n], data[3*diskUnit:]) {
		t.Fatalf("tail: %d, %v", n, ok)
	}
	if used, _ := c.Usage(); used != size {
		t.Errorf("usage %d, want the blob's size %d", used, size)
	}
	// Another version, another namespace, another size: misses.
	for _, k := range [][3]string{{"ns", "a", `"2"`}, {"other", "a", `"1"`}, {"ns", "b", `"1"`}} {
		if _, ok := c.read(k[0], k[1], k[2], size, buf[:10], 0); ok {
			t.Errorf("%v served from the cache of ns/a/\"1\"", k)
		}
	}
	if _, ok := c.read("ns", "a", `"1"`, size+1, buf[:10], 0); ok {
		t.Error("served for another size")
	}
	// No ETag, no caching.
	c.store("ns", "c", "", 10, data[:10], 0)
	if _, ok := c.read("ns", "c", "", 10, buf[:10], 0); ok {
		t.Error("a blob without ETag was cached")
	}
}

// Files are evicted least recently used first, never while pinned, and the
// capacity holds.
func TestDiskCacheEviction(t *testing.T) {
	const blob = 4 * diskUnit
	c := openDiskCache(t, 3*blob)
	data := storetest.Pattern(blob, 5)
	put := func(name string) { c.store("ns", name, `"e"`, blob, data, 0) }
	has := func(name string) bool {
		_, ok := c.read("ns", name, `"e"`, blob, make([]byte, 1), 0)
		return ok
	}
	put("a")
	put("b")
	put("c")
	pinned := c.complete("ns", "a", `"e"`, blob) // a pinned, as by a passthrough handle
	if pinned == nil {
		t.Fatal("a not complete")
	}
	has("b") // b used: c is now the least recent unpinned
	put("d")
	if !has("a") || !has("b") || has("c") || !has("d") {
		t.Fatalf("after d: a %v b %v c %v d %v; want c evicted (a pinned, b used)", has("a"), has("b"), has("c"), has("d"))
	}
	if n := len(cacheFiles(t, c)); n != 3 {
		t.Errorf("%d cache files, want 3", n)
	}
	c.unpin(pinned)
	put("e")
	put("f")
	put("g")
	if has("a") {
		t.Error("a, unpinned, survived three puts into a cache of three")
	}
	if used, capacity := c.Usage(); used > capacity {
		t.Errorf("used %d over capacity %d", used, capacity)
	}
	// A blob larger than the whole cache is not kept.
	big := storetest.Pattern(4*blob, 1)
	c.store("ns", "big", `"e"`, int64(len(big)), big, 0)
	if _, ok := c.read("ns", "big", `"e"`, int64(len(big)), make([]byte, 1), 0); ok {
		t.Error("a blob larger than the cache was kept")
	}
}

// One process per directory; a new process starts from an empty one.
func TestDiskCacheDirectory(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenDiskCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	c.store("ns", "a", `"1"`, 10, []byte("0123456789"), 0)
	if _, err := OpenDiskCache(dir, 1<<20); err == nil || !strings.Contains(err.Error(), "in use by another blobfs process") {
		t.Fatalf("second open of a directory in use: %v", err)
	}
	// Left behind as by a crash: the lock goes with the process.
	c.lock.Close()
	c2, err := OpenDiskCache(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if names := cacheFiles(t, c2); len(names) != 0 {
		t.Fatalf("files of the previous process kept: %v", names)
	}
	if _, err := OpenDiskCache(t.TempDir(), 0); err == nil {
		t.Error("a capacity of 0 was accepted")
	}
}

// Read-ahead never evicts blocks fetched by read-ahead and not read yet:
// that bandwidth would be wasted. Once their handle lets go of them
// (seek, close), they are evictable like any other.
func TestBlockCacheKeepsUnreadReadAhead(t *testing.T) {
	const block = 64 << 10
	ctx := context.Background()
	mem, data, a := storedBlob(t, 16*block, 3)
	c := NewBlockCache(&Sources{Store: mem}, block, 4*block, 4)
	key := func(i int64) BlockKey { return BlockKey{"f", a.ETag, i} }
	settle := func() { settleFetches(t, c) }
	cached := func(i int64) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.blocks[key(i)] != nil
	}

	// Handle 1 reads ahead blocks 0-1, handle 2 blocks 2-3: the cache
	// is full of unread blocks.
	for i := range int64(4) {
		c.Prefetch(key(i), a.Size, uint64(1+i/2))
	}
	settle()
	// More read-ahead finds no buffer it may take.
	c.Prefetch(key(4), a.Size, 2)
	settle()
	if cached(4) {
		t.Fatal("read-ahead of block 4 evicted an unread read-ahead block")
	}
	for i := range int64(4) {
		if !cached(i) {
			t.Fatalf("unread read-ahead block %d was evicted", i)
		}
	}
	// Handle 1 closes: its blocks give way to new read-ahead.
	c.Demote(1)
	c.Prefetch(key(4), a.Size, 2)
	settle()
	if !cached(4) {
		t.Fatal("read-ahead of block 4 skipped after handle 1's blocks were demoted")
	}
	if cached(2) != true || cached(3) != true {
		t.Fatal("handle 2's unread blocks were evicted instead of handle 1's")
	}
	// A demand read may always take a buffer, and reads the right bytes.
	p := make([]byte, 2*block)
	if n, err := c.Read(ctx, "f", a.ETag, a.Size, p, 6*block); err != nil || n != len(p) {
		t.Fatalf("read: %d, %v", n, err)
	}
	if !bytes.Equal(p, data[6*block:8*block]) {
		t.Fatal("read returned the wrong bytes")
	}
}

// settleFetches waits until c's read-ahead fetches, which queue for a slot
// in goroutines of their own, are done and every block is unpinned into a
// list.
func settleFetches(t *testing.T, c *BlockCache) {
	t.Helper()
	storetest.WaitFor(t, "read-ahead fetches to finish", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		busy := c.active > 0 || c.queue.Len() > 0
		for _, b := range c.blocks {
			busy = busy || b.elem == nil
		}
		return !busy
	})
}

// Read-ahead asked for beyond the fetch slots is queued, not dropped: the
// slots stay full, never more than their number in flight (plus the one
// block the reader may take over from the queue, TestReadAheadFetchesInOrder),
// and every block asked for arrives without the reader asking again.
func TestReadAheadQueuesBeyondFetchSlots(t *testing.T) {
	ctx := context.Background()
	const bs = 64 << 10
	mem, data, a := storedBlob(t, 8*bs, 3)
	cs := &storetest.ConcurrencyStore{Store: mem, Delay: 20 * time.Millisecond}
	c := NewBlockCache(&Sources{Store: cs}, bs, 16*bs, 2)
	for i := range int64(8) {
		if !c.Prefetch(BlockKey{"f", a.ETag, i}, a.Size, 1) {
			t.Fatalf("block %d: prefetch refused with room in the cache", i)
		}
	}
	got := make([]byte, len(data))
	if _, err := c.Read(ctx, "f", a.ETag, a.Size, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
	if m := cs.MaxConcurrent(); m > 3 {
		t.Errorf("%d fetches in flight at once, want at most the 2 slots and the reader's own", m)
	}
	if n := mem.Requests()[blobstore.OpReadAt]; n != 8 {
		t.Errorf("%d reads from the store, want 8 (each block once)", n)
	}
}

// orderStore records the block index of every ReadAt in the order they
// start, and holds each until release is closed.
type orderStore struct {
	blobstore.Store
	block   int64
	release chan struct{}

	mu      sync.Mutex
	started []int64
}

func (s *orderStore) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	s.mu.Lock()
	s.started = append(s.started, off/s.block)
	s.mu.Unlock()
	<-s.release
	return s.Store.ReadAt(ctx, name, p, off, etag)
}

func (s *orderStore) order() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int64(nil), s.started...)
}

// Read-ahead beyond the fetch slots starts in the order it was asked for
// (a reader needs the nearest blocks first), and a reader that needs a
// block still queued fetches it at once instead of waiting behind the
// others. One fetch slot: with two, the store can see two dequeued
// fetches start in either order, and the order checked here would be
// down to scheduling. (Before the queue, goroutines waiting on the slot
// started in random order, one slot or many.)
func TestReadAheadFetchesInOrder(t *testing.T) {
	const block = 64 << 10
	ctx := context.Background()
	mem, data, a := storedBlob(t, 12*block, 4)
	s := &orderStore{Store: mem, block: block, release: make(chan struct{})}
	c := NewBlockCache(&Sources{Store: s}, block, 12*block, 1)
	defer c.Close()
	for i := int64(1); i <= 8; i++ {
		c.Prefetch(BlockKey{"f", a.ETag, i}, a.Size, 1)
	}
	waitFor := func(n int) []int64 {
		t.Helper()
		var got []int64
		storetest.WaitFor(t, fmt.Sprintf("%d fetches to start", n), func() bool {
			got = s.order()
			return len(got) >= n
		})
		return got
	}
	if got := waitFor(1); len(got) != 1 || got[0] != 1 {
		t.Fatalf("first fetches: %v, want block 1 alone (one slot)", got)
	}
	// Block 7 is queued behind 2-6: a read of it starts it now.
	readDone := make(chan error, 1)
	go func() {
		p := make([]byte, block)
		_, err := c.Read(ctx, "f", a.ETag, a.Size, p, 7*block)
		if err == nil && !bytes.Equal(p, data[7*block:8*block]) {
			err = fmt.Errorf("read of block 7 returned other bytes")
		}
		readDone <- err
	}()
	if got := waitFor(2); got[1] != 7 {
		t.Fatalf("fetches started: %v, want block 7 second (read on demand)", got)
	}
	close(s.release)
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	got := waitFor(8)
	want := []int64{2, 3, 4, 5, 6, 8}
	if fmt.Sprint(got[2:]) != fmt.Sprint(want) {
		t.Fatalf("fetches started: %v, want the queue in order after the first two: %v", got, want)
	}
}

// The read caches of many mounts stay within the process's budget (plus
// two blocks per cache) while all of them stream at once, every byte read
// is right, and a cache over its share gives memory back to the others.
func TestMemoryBudgetSharedByCaches(t *testing.T) {
	ctx := context.Background()
	mem := blobstore.NewMemory()
	const bs = 1 << 20
	const caches, blobSize = 12, 24 * bs
	for i := range caches {
		storetest.PutBlob(t, mem, fmt.Sprintf("b%02d", i), storetest.Pattern(blobSize, byte(i)), nil)
	}
	base, _, _ := memory.Use() // caches of other tests, never closed
	const budget = 32 * bs     // three quarters for reads: 24 blocks
	memory.SetBudget(budget + base*4/3)
	defer memory.SetBudget(0)
	_, limit, _ := memory.Use()

	cs := make([]*BlockCache, caches)
	for i := range cs {
		cs[i] = NewBlockCache(&Sources{Store: mem}, bs, 16*bs, 4) // each alone could take 16 blocks
		defer cs[i].Close()
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
			want := storetest.Pattern(blobSize, byte(i))
			buf := make([]byte, 256<<10)
			for pass := range 2 {
				for off := int64(0); off < blobSize; off += int64(len(buf)) {
					// Read-ahead as a stream would ask for it.
					for k := int64(1); k <= 4; k++ {
						c.Prefetch(BlockKey{name, a.ETag, off/bs + k}, a.Size, uint64(i+1))
					}
					n, err := c.Read(ctx, name, a.ETag, a.Size, buf, off)
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
	fill := func(c *BlockCache, name string) {
		at, _ := mem.Stat(ctx, name)
		buf := make([]byte, blobSize)
		if _, err := c.Read(ctx, name, at.ETag, at.Size, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cs[2:] {
		c.Close()
	}
	fill(a, "b00")
	held := a.Usage()
	fill(b, "b01")
	if a.Usage() >= held && b.Usage() <= 2*bs {
		t.Errorf("cache a kept %d bytes and b got %d: nothing was reclaimed", a.Usage(), b.Usage())
	}
	if used, _, _ := memory.Use(); used > limit+2*2*bs {
		t.Errorf("%d bytes of read buffers, limit %d", used, limit)
	}
}

// storedBlob puts a blob "f" of size patterned bytes in a fresh in-memory
// store and returns the store, the bytes and the blob's attributes.
func storedBlob(t *testing.T, size int, seed byte) (*blobstore.Memory, []byte, blobstore.Attrs) {
	t.Helper()
	mem := blobstore.NewMemory()
	data := storetest.Pattern(size, seed)
	storetest.PutBlob(t, mem, "f", data, nil)
	a, err := mem.Stat(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	return mem, data, a
}
