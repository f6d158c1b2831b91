package fusefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// concurrencyStore counts the ReadAt calls in flight and remembers the
// most there ever were; each call takes at least delay, like a GET.
type concurrencyStore struct {
	blobstore.Store
	delay time.Duration

	mu          sync.Mutex
	inFlight    int
	maxInFlight int
}

func (s *concurrencyStore) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	s.mu.Lock()
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	time.Sleep(s.delay)
	n, err := s.Store.ReadAt(ctx, name, p, off, etag)
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	return n, err
}

func (s *concurrencyStore) maxConcurrent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight
}

// A sequential reader's first 1 MiB read puts the whole read-ahead window
// in flight at once: against a store with high latency and limited
// bandwidth per stream, a window that ramps up over several round trips
// costs most of the throughput.
func TestReadAheadFullWindowOnFirstRead(t *testing.T) {
	const block = 1 << 20
	mem := blobstore.NewMemory()
	data := pattern(40*block, 7)
	putBlob(t, mem, "big", data, nil)
	store := &concurrencyStore{Store: mem, delay: 300 * time.Millisecond}
	opts := Options{ReadBlockSize: block, BlockCacheBytes: 32 * block}
	mnt, fsys := mountStore(t, store, opts)
	window := fsys.opts.MaxReadAheadBlocks
	if window != 16 {
		t.Fatalf("default read-ahead window of a 32-block cache: %d blocks, want 16", window)
	}

	f, err := os.Open(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, block)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	// The demand fetch of block 0 and the window behind it started
	// together, while the first read waited.
	if got := store.maxConcurrent(); got < window+1 {
		t.Errorf("%d fetches in flight during the first read, want %d (block 0 and a window of %d)", got, window+1, window)
	}
	got := make([]byte, 0, len(data))
	got = append(got, buf...)
	for off := int64(block); ; off += block {
		n, err := f.ReadAt(buf, off)
		got = append(got, buf[:n]...)
		if n < block || err != nil {
			break
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(data))
	}
}

// Read-ahead never evicts blocks fetched by read-ahead and not read yet:
// that bandwidth would be wasted. Once their handle lets go of them
// (seek, close), they are evictable like any other.
func TestBlockCacheKeepsUnreadReadAhead(t *testing.T) {
	const block = 64 << 10
	ctx := context.Background()
	mem, data, a := storedBlob(t, 16*block, 3)
	c := newBlockCache(mem, block, 4*block, 4)
	key := func(i int64) blockKey { return blockKey{"f", a.ETag, i} }
	settle := func() { settleFetches(t, c) }
	cached := func(i int64) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.blocks[key(i)] != nil
	}

	// Handle 1 reads ahead blocks 0-1, handle 2 blocks 2-3: the cache
	// is full of unread blocks.
	for i := range int64(4) {
		c.prefetch(key(i), a.Size, uint64(1+i/2))
	}
	settle()
	// More read-ahead finds no buffer it may take.
	c.prefetch(key(4), a.Size, 2)
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
	c.demote(1)
	c.prefetch(key(4), a.Size, 2)
	settle()
	if !cached(4) {
		t.Fatal("read-ahead of block 4 skipped after handle 1's blocks were demoted")
	}
	if cached(2) != true || cached(3) != true {
		t.Fatal("handle 2's unread blocks were evicted instead of handle 1's")
	}
	// A demand read may always take a buffer, and reads the right bytes.
	p := make([]byte, 2*block)
	if n, err := c.read(ctx, "f", a.ETag, a.Size, p, 6*block); err != nil || n != len(p) {
		t.Fatalf("read: %d, %v", n, err)
	}
	if !bytes.Equal(p, data[6*block:8*block]) {
		t.Fatal("read returned the wrong bytes")
	}
}

// settleFetches waits until c's read-ahead fetches, which queue for a slot
// in goroutines of their own, are done and every block is unpinned into a
// list.
func settleFetches(t *testing.T, c *blockCache) {
	t.Helper()
	for range 1000 {
		c.mu.Lock()
		busy := c.active > 0 || c.queue.Len() > 0
		for _, b := range c.blocks {
			busy = busy || b.elem == nil
		}
		c.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("read-ahead fetches did not finish")
}

// Large files opened read-only bypass the page cache (FOPEN_DIRECT_IO):
// every read reaches blobfs, and returns the right bytes whatever its
// size and alignment; mmap, shared and private, still works. Small files
// keep the page cache.
func TestDirectReadLargeFiles(t *testing.T) {
	const block = 1 << 20
	mem := blobstore.NewMemory()
	big := pattern(3*block+12345, 5)
	small := pattern(block/2, 9)
	putBlob(t, mem, "big", big, nil)
	putBlob(t, mem, "small", small, nil)
	mnt, fsys := mountStore(t, mem, Options{ReadBlockSize: block, BlockCacheBytes: 8 * block})
	if !fsys.directIOMmap.Load() {
		t.Skip("kernel without FUSE_DIRECT_IO_ALLOW_MMAP (Linux < 6.6)")
	}

	// Reading a range twice reaches blobfs twice under direct I/O,
	// once through the page cache.
	reads := func(name string) uint64 {
		f, err := os.Open(join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 4096)
		h0, m0 := fsys.blocks.stats()
		for range 2 {
			if _, err := f.ReadAt(buf, 8192); err != nil {
				t.Fatal(err)
			}
		}
		h1, m1 := fsys.blocks.stats()
		return h1 + m1 - h0 - m0
	}
	if n := reads("big"); n != 2 {
		t.Errorf("big file: 2 reads of one range reached the block cache %d times, want 2 (direct I/O)", n)
	}
	if n := reads("small"); n != 1 {
		t.Errorf("small file: 2 reads of one range reached the block cache %d times, want 1 (page cache)", n)
	}

	// Odd sizes and offsets, across block boundaries and the end.
	f, err := os.Open(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, r := range []struct{ off, n int }{{0, 1}, {1, 4095}, {block - 7, 14}, {block - 100, 2*block + 200}, {len(big) - 10, 100}, {12345, 3 * block}} {
		buf := make([]byte, r.n)
		n, err := f.ReadAt(buf, int64(r.off))
		want := big[r.off:min(r.off+r.n, len(big))]
		if n != len(want) || !bytes.Equal(buf[:n], want) {
			t.Errorf("ReadAt(%d bytes at %d): %d bytes, %v; want %d bytes of the file", r.n, r.off, n, err, len(want))
		}
	}

	for _, flags := range []int{syscall.MAP_SHARED, syscall.MAP_PRIVATE} {
		m, err := syscall.Mmap(int(f.Fd()), 0, len(big), syscall.PROT_READ, flags)
		if err != nil {
			t.Fatalf("mmap (flags %#x) of a direct-I/O file: %v", flags, err)
		}
		if !bytes.Equal(copyOutOfMapping(t, m), big) {
			t.Errorf("mmap (flags %#x) shows other bytes than the file's", flags)
		}
		syscall.Munmap(m)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read whole file after mmap: %d bytes, %v", len(got), err)
	}
}

// Read-ahead asked for beyond the fetch slots is queued, not dropped: the
// slots stay full, never more than their number in flight (plus the one
// block the reader may take over from the queue, TestReadAheadFetchesInOrder),
// and every block asked for arrives without the reader asking again.
func TestReadAheadQueuesBeyondFetchSlots(t *testing.T) {
	ctx := context.Background()
	const bs = 64 << 10
	mem, data, a := storedBlob(t, 8*bs, 3)
	cs := &concurrencyStore{Store: mem, delay: 20 * time.Millisecond}
	c := newBlockCache(cs, bs, 16*bs, 2)
	for i := range int64(8) {
		if !c.prefetch(blockKey{"f", a.ETag, i}, a.Size, 1) {
			t.Fatalf("block %d: prefetch refused with room in the cache", i)
		}
	}
	got := make([]byte, len(data))
	if _, err := c.read(ctx, "f", a.ETag, a.Size, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("content differs")
	}
	if m := cs.maxConcurrent(); m > 3 {
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
	c := newBlockCache(s, block, 12*block, 1)
	defer c.close()
	for i := int64(1); i <= 8; i++ {
		c.prefetch(blockKey{"f", a.ETag, i}, a.Size, 1)
	}
	waitFor := func(n int) []int64 {
		t.Helper()
		for range 2000 {
			if got := s.order(); len(got) >= n {
				return got
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("fetches started: %v, want %d", s.order(), n)
		return nil
	}
	if got := waitFor(1); len(got) != 1 || got[0] != 1 {
		t.Fatalf("first fetches: %v, want block 1 alone (one slot)", got)
	}
	// Block 7 is queued behind 2-6: a read of it starts it now.
	readDone := make(chan error, 1)
	go func() {
		p := make([]byte, block)
		_, err := c.read(ctx, "f", a.ETag, a.Size, p, 7*block)
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

// READs answered from the block cache are written to the kernel from the
// cache's blocks (replySlot), whatever their offset and length, including
// reads across two blocks and the short read at the end; every block is
// unpinned once the replies are written.
func TestReadRepliesFromCacheBlocks(t *testing.T) {
	const block = 1 << 20
	mem := blobstore.NewMemory()
	data := pattern(3*block+block/2, 7)
	putBlob(t, mem, "f", data, nil)
	mnt, fsys := mountStore(t, mem, Options{ReadBlockSize: block, BlockCacheBytes: 8 * block})
	before := zeroCopyReplies.Load()
	f, err := os.Open(join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ off, n int }{
		{0, block}, {block - 100, 4096}, {2*block + 5, block}, {len(data) - 1000, 4096}, {0, len(data)},
	} {
		p := make([]byte, r.n)
		n, err := f.ReadAt(p, int64(r.off))
		want := data[r.off:min(r.off+r.n, len(data))]
		if n != len(want) || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d bytes", r.off, r.n, n, err, len(want))
		}
		if !bytes.Equal(p[:n], want) {
			t.Fatalf("ReadAt(%d, %d) returned other bytes", r.off, r.n)
		}
	}
	f.Close()
	if zeroCopyReplies.Load() == before {
		t.Fatal("no READ was answered from the cache's blocks")
	}
	c := fsys.blocks
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, b := range c.blocks {
		if b.pins != 0 {
			t.Errorf("block %d still pinned %d times after the reads", k.idx, b.pins)
		}
	}
}

// storedBlob puts a blob "f" of size patterned bytes in a fresh in-memory
// store and returns the store, the bytes and the blob's attributes.
func storedBlob(t *testing.T, size int, seed byte) (*blobstore.Memory, []byte, blobstore.Attrs) {
	t.Helper()
	mem := blobstore.NewMemory()
	data := pattern(size, seed)
	putBlob(t, mem, "f", data, nil)
	a, err := mem.Stat(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	return mem, data, a
}

// copyOutOfMapping copies a mapping of a file on a mount this process
// serves, faulting its pages in inside a write(2) to a temporary file. A
// goroutine that touched them itself would be running, from the Go
// runtime's view, while its thread waits in the kernel for the FUSE reply;
// a garbage collection that stops the world meanwhile waits for it, the
// goroutines that would answer are stopped, and the test hangs until its
// timeout (seen once, in a run of the whole package). In a system call, the goroutine does
// not hold the world up.
func copyOutOfMapping(t *testing.T, m []byte) []byte {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "mapping")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(m); err != nil {
		t.Fatalf("copy the mapping: %v", err)
	}
	out := make([]byte, len(m))
	if _, err := f.ReadAt(out, 0); err != nil {
		t.Fatalf("read the copy back: %v", err)
	}
	return out
}

// A stream through a file larger than the cache keeps about its read-ahead
// window in memory, not the whole cache, and leaves another file's blocks
// cached: the blocks it has passed give their buffers to the next ones.
func TestStreamThroughLargerFileKeepsItsWindow(t *testing.T) {
	const block = 1 << 20
	mem := blobstore.NewMemory()
	hotData := pattern(block, 5)
	putBlob(t, mem, "hot", hotData, nil)
	data := pattern(48*block, 6)
	putBlob(t, mem, "big", data, nil)
	// A window of 4 blocks (twice 2 fetches) in a cache of 16. Without
	// the whole-read check, which holds each block until it is hashed
	// (up to 3/4 of the cache when the hash falls behind the reader).
	opts := Options{ReadBlockSize: block, BlockCacheBytes: 16 * block, MaxReadAheadBlocks: 2, NoContentCheck: true}
	mnt, fsys := mountStore(t, &concurrencyStore{Store: mem, delay: time.Millisecond}, opts)
	if got, err := os.ReadFile(join(mnt, "hot")); err != nil || !bytes.Equal(got, hotData) {
		t.Fatalf("read hot: %v (equal %v)", err, bytes.Equal(got, hotData))
	}
	hot, err := mem.Stat(context.Background(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	if !fsys.blocks.has(blockKey{"hot", hot.ETag, 0}) {
		t.Fatal("the small file's block is not in the cache after its read")
	}

	var peak atomic.Int64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), fsys.blocks.usage()))
			select {
			case <-done:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	got, err := os.ReadFile(join(mnt, "big"))
	close(done)
	<-sampled
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read big: %v (equal %v)", err, bytes.Equal(got, data))
	}
	// The window, the block being read, the one behind it (not passed
	// yet), the one passed and not taken yet, and the small file's block,
	// with two blocks of slack: a block still pinned by a reply being
	// written when it is passed goes to the passed list only when its
	// reply is done, and the next fetch grows the cache meanwhile. (15
	// before streams passed their blocks.)
	p := peak.Load() / block
	t.Logf("peak: %d blocks", p)
	if p > 4+1+1+1+1+2 {
		t.Errorf("the stream took %d blocks of memory at its peak, want its window's and a few", p)
	}
	if !fsys.blocks.has(blockKey{"hot", hot.ETag, 0}) {
		t.Error("the stream through a file larger than the cache evicted the small file's block")
	}
}

// Two handles stream the same file larger than the cache, the second 4
// blocks behind the first: the blocks the first passes are the ones the
// second is about to read, and its read-ahead asked for them, so they stay
// cached: each block is fetched once, but blocks 1 and 2, which the first
// had passed before the second started.
func TestTrailingStreamKeepsPassedBlocks(t *testing.T) {
	const block = 1 << 20
	const blocks = 48
	mem := blobstore.NewMemory()
	data := pattern(blocks*block, 8)
	putBlob(t, mem, "big", data, nil)
	opts := Options{ReadBlockSize: block, BlockCacheBytes: 16 * block, MaxReadAheadBlocks: 2, NoContentCheck: true}
	mnt, _ := mountStore(t, mem, opts)
	lead, err := os.Open(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer lead.Close()
	trail, err := os.Open(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer trail.Close()
	before := mem.Requests()[blobstore.OpReadAt]
	buf := make([]byte, block)
	read := func(f *os.File, i int) {
		t.Helper()
		if _, err := f.ReadAt(buf, int64(i)*block); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, data[i*block:(i+1)*block]) {
			t.Fatalf("block %d read back wrong", i)
		}
	}
	const behind = 4
	for i := range blocks + behind {
		if i < blocks {
			read(lead, i)
		}
		if i >= behind {
			read(trail, i-behind)
		}
		// Let read-ahead land, so that the order of events is the
		// one a real pair of readers has, not a race between them.
		time.Sleep(2 * time.Millisecond)
	}
	got := mem.Requests()[blobstore.OpReadAt] - before
	t.Logf("%d GETs for %d blocks", got, blocks)
	if got > blocks+2 {
		t.Errorf("%d GETs for %d blocks read by two streams 4 blocks apart, want %d (90 when the second stream's read-ahead did not keep the blocks the first passed)", got, blocks, blocks+2)
	}
}
