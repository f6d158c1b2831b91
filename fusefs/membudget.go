package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
)

// The process's memory budget (SetMemoryBudget), shared by every mount it
// serves: `blobfs csi` serves all the volumes of a node in one process,
// and without it each volume could take its own Options.BlockCacheBytes
// and its own upload buffers, however many volumes there are.
//
//   - Read block caches (read-ahead included) take up to three quarters of
//     it together. Each mount keeps its own bound (BlockCacheBytes, the
//     per-mount cap a mount option sets), and may always hold minShare:
//     two read blocks, so that its readers never wait on other mounts.
//     Over the budget, a mount's new block takes the memory of other
//     mounts' least recently read blocks (reclaimRead); read-ahead that
//     finds none is skipped.
//   - Upload buffers (blocks being staged: streamed blocks, whole-file
//     uploads, write-back) take up to a quarter, by bytes; a block waits
//     for its bytes. Each mount keeps its own bound as well (FS.uploadSlots).
//
// So a process's read and upload buffers stay within the budget plus two
// read blocks per mount reading at once (16 MiB at the default block size).
// Listings have their own process-wide bound (SetListCacheBytes).
var memBudget struct {
	// readLimit is 0 when there is no process-wide bound.
	readLimit atomic.Int64
	readUsed  atomic.Int64
	upload    atomic.Pointer[semaphore.Weighted]
	uploadCap atomic.Int64

	mu     sync.Mutex
	caches map[*blockCache]bool
}

// SetMemoryBudget bounds the read caches and upload buffers of every mount
// of the process together to bytes (0: no process-wide bound, each mount
// only its own). Call it before mounting.
func SetMemoryBudget(bytes int64) {
	if bytes <= 0 {
		memBudget.readLimit.Store(0)
		memBudget.upload.Store(nil)
		memBudget.uploadCap.Store(0)
		return
	}
	memBudget.readLimit.Store(bytes - bytes/4)
	memBudget.uploadCap.Store(bytes / 4)
	memBudget.upload.Store(semaphore.NewWeighted(bytes / 4))
}

// MemoryUse reports the read caches' bytes over every mount and the
// process-wide limits (0: none).
func MemoryUse() (readUsed, readLimit, uploadLimit int64) {
	return memBudget.readUsed.Load(), memBudget.readLimit.Load(), memBudget.uploadCap.Load()
}

func registerCache(c *blockCache) {
	memBudget.mu.Lock()
	defer memBudget.mu.Unlock()
	if memBudget.caches == nil {
		memBudget.caches = map[*blockCache]bool{}
	}
	memBudget.caches[c] = true
}

func unregisterCache(c *blockCache) {
	memBudget.mu.Lock()
	defer memBudget.mu.Unlock()
	delete(memBudget.caches, c)
}

// addUsedLocked changes the bytes c's buffers take, here and in the
// process's count.
func (c *blockCache) addUsedLocked(delta int64) {
	c.used += delta
	memBudget.readUsed.Add(delta)
}

// minShare is what a read cache may hold whatever the process-wide budget.
func (c *blockCache) minShare() int64 { return 2 * c.blockSize }

// budgetAllowsLocked tells whether n more bytes fit the process's budget.
func (c *blockCache) budgetAllowsLocked(n int64) bool {
	limit := memBudget.readLimit.Load()
	return limit == 0 || c.used+n <= c.minShare() || memBudget.readUsed.Load()+n <= limit
}

// timedWaitLocked waits on c.cond, at most d.
func (c *blockCache) timedWaitLocked(d time.Duration) {
	t := time.AfterFunc(d, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	c.cond.Wait()
	t.Stop()
}

// reclaimRead frees at least n bytes of other mounts' read caches, if it
// can: their free buffers, then their least recently read blocks; never
// below a cache's minShare. It holds one cache's lock at a time.
func reclaimRead(self *blockCache, n int64) {
	memBudget.mu.Lock()
	others := make([]*blockCache, 0, len(memBudget.caches))
	for c := range memBudget.caches {
		if c != self {
			others = append(others, c)
		}
	}
	memBudget.mu.Unlock()
	freed := int64(0)
	for _, o := range others {
		o.mu.Lock()
		for freed < n && o.used > o.minShare() {
			if k := len(o.free); k > 0 {
				freed += int64(cap(o.free[k-1]))
				o.dropBufLocked(o.free[k-1])
				o.free = o.free[:k-1]
				continue
			}
			b := o.evictLocked(o.passed)
			if b == nil {
				b = o.evictLocked(o.lru)
			}
			if b == nil {
				break
			}
			freed += int64(cap(b.buf))
			o.dropBufLocked(b.buf)
		}
		o.mu.Unlock()
		if freed >= n {
			return
		}
	}
}

// takeUploadBuf lends an upload block buffer of at least n bytes: a slot of
// the mount's own (FS.uploadSlots), the bytes from the process's budget if
// there is one, and a pooled buffer. Without wait it returns false at once
// when either is not free; with it, it waits until they are or ctx ends.
func (fs *FS) takeUploadBuf(ctx context.Context, n int64, wait bool) ([]byte, bool, error) {
	if wait {
		select {
		case fs.uploadSlots <- struct{}{}:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	} else {
		select {
		case fs.uploadSlots <- struct{}{}:
		default:
			return nil, false, nil
		}
	}
	size := max(n, fs.opts.UploadBlockSize)
	sem := memBudget.upload.Load()
	var w int64
	if sem != nil {
		w = min(size, memBudget.uploadCap.Load())
		if wait {
			if err := sem.Acquire(ctx, w); err != nil {
				<-fs.uploadSlots
				return nil, false, err
			}
		} else if !sem.TryAcquire(w) {
			<-fs.uploadSlots
			return nil, false, nil
		}
	}
	// Full blocks (of either size a stream uses, blockGrowAfter) come
	// from the process's pool of mapped buffers, like the block cache's
	// (blockbuf.go): on the heap, each fresh 8 MiB buffer was faulted in
	// page by page while the writer waited, half a second of a core per
	// GiB on a fresh mount.
	var buf []byte
	if size == fs.opts.UploadBlockSize || size == 2*fs.opts.UploadBlockSize {
		buf = allocBlockBuf(size)
	} else {
		buf = make([]byte, size)
	}
	if sem != nil {
		// Given back to the semaphore it came from, even if the
		// budget changes meanwhile.
		fs.uploadSems.Store(&buf[0], heldBytes{sem, w})
	}
	return buf, true, nil
}

// heldBytes is what a lent upload buffer holds of a budget's semaphore.
type heldBytes struct {
	sem *semaphore.Weighted
	n   int64
}

// giveUploadBuf takes back a buffer of takeUploadBuf.
func (fs *FS) giveUploadBuf(buf []byte) {
	size := int64(cap(buf))
	buf = buf[:size]
	if h, ok := fs.uploadSems.LoadAndDelete(&buf[0]); ok {
		h.(heldBytes).sem.Release(h.(heldBytes).n)
	}
	freeBlockBuf(buf) // leaves a heap buffer to the garbage collector
	<-fs.uploadSlots
}

// uploadBuffers lends a mount's upload buffers to blobstore.Upload.
type uploadBuffers struct{ fs *FS }

func (u uploadBuffers) Get(ctx context.Context, n int64) ([]byte, error) {
	buf, _, err := u.fs.takeUploadBuf(ctx, n, true)
	return buf, err
}

func (u uploadBuffers) Put(buf []byte) { u.fs.giveUploadBuf(buf) }
