package fusefs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// A sequential reader's first 1 MiB read puts the whole read-ahead window
// in flight at once: against a store with high latency and limited
// bandwidth per stream, a window that ramps up over several round trips
// costs most of the throughput.
func TestReadAheadFullWindowOnFirstRead(t *testing.T) {
	const block = 1 << 20
	mem := blobstore.NewMemory()
	data := pattern(40*block, 7)
	putBlob(t, mem, "big", data, nil)
	store := &storetest.ConcurrencyStore{Store: mem, Delay: 300 * time.Millisecond}
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
	if got := store.MaxConcurrent(); got < window+1 {
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
		h0, m0 := fsys.blocks.Stats()
		for range 2 {
			if _, err := f.ReadAt(buf, 8192); err != nil {
				t.Fatal(err)
			}
		}
		h1, m1 := fsys.blocks.Stats()
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
	before := kernel.ZeroCopyReplies()
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
	if kernel.ZeroCopyReplies() == before {
		t.Fatal("no READ was answered from the cache's blocks")
	}
	if n := fsys.blocks.PinnedBlocks(); n != 0 {
		t.Errorf("%d blocks still pinned after the reads", n)
	}
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
	mnt, fsys := mountStore(t, &storetest.ConcurrencyStore{Store: mem, Delay: time.Millisecond}, opts)
	if got, err := os.ReadFile(join(mnt, "hot")); err != nil || !bytes.Equal(got, hotData) {
		t.Fatalf("read hot: %v (equal %v)", err, bytes.Equal(got, hotData))
	}
	hot, err := mem.Stat(context.Background(), "hot")
	if err != nil {
		t.Fatal(err)
	}
	if !fsys.blocks.Has(cache.BlockKey{Name: "hot", ETag: hot.ETag, Idx: 0}) {
		t.Fatal("the small file's block is not in the cache after its read")
	}

	var peak atomic.Int64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), fsys.blocks.Usage()))
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
	if !fsys.blocks.Has(cache.BlockKey{Name: "hot", ETag: hot.ETag, Idx: 0}) {
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
