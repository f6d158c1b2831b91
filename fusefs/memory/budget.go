package memory

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// The process's memory budget (SetBudget), shared by every mount it
// serves: `blobfs csi` serves all the volumes of a node in one process,
// and without it each volume could take its own Options.BlockCacheBytes
// and its own upload buffers, however many volumes there are.
//
//   - Read block caches (read-ahead included) take up to three quarters of
//     it together. Each mount keeps its own bound (BlockCacheBytes, the
//     per-mount cap a mount option sets), and may always hold its minimum
//     share: two read blocks, so that its readers never wait on other
//     mounts. Over the budget, a mount's new block takes the memory of
//     other mounts' least recently read blocks (ReclaimRead); read-ahead
//     that finds none is skipped.
//   - Upload buffers (blocks being staged: streamed blocks, whole-file
//     uploads, write-back) take up to a quarter, by bytes; a block waits
//     for its bytes. Each mount keeps its own bound as well (Uploads).
//
// So a process's read and upload buffers stay within the budget plus two
// read blocks per mount reading at once (16 MiB at the default block size).
// Listings have their own process-wide bound (SetListCacheBytes).
var budget struct {
	// readLimit is 0 when there is no process-wide bound.
	readLimit atomic.Int64
	readUsed  atomic.Int64
	upload    atomic.Pointer[semaphore.Weighted]
	uploadCap atomic.Int64

	mu     sync.Mutex
	caches map[ReadCache]bool
}

// A ReadCache is a mount's read cache, whose memory counts against the
// process's budget (AddRead) and which gives memory back when another
// mount's cache needs it.
type ReadCache interface {
	// Reclaim frees up to n bytes of the cache's memory, its least
	// recently read first and never below its own minimum share, and
	// says how many it freed. It must not call back into this package
	// while holding a lock that AddRead's callers hold.
	Reclaim(n int64) (freed int64)
}

// SetBudget bounds the read caches and upload buffers of every mount of
// the process together to bytes (0: no process-wide bound, each mount
// only its own). Call it before mounting.
func SetBudget(bytes int64) {
	if bytes <= 0 {
		budget.readLimit.Store(0)
		budget.upload.Store(nil)
		budget.uploadCap.Store(0)
		return
	}
	budget.readLimit.Store(bytes - bytes/4)
	budget.uploadCap.Store(bytes / 4)
	budget.upload.Store(semaphore.NewWeighted(bytes / 4))
}

// Use reports the read caches' bytes over every mount and the process-wide
// limits (0: none).
func Use() (readUsed, readLimit, uploadLimit int64) {
	return budget.readUsed.Load(), budget.readLimit.Load(), budget.uploadCap.Load()
}

// Register makes c one of the caches ReclaimRead may take memory from.
func Register(c ReadCache) {
	budget.mu.Lock()
	defer budget.mu.Unlock()
	if budget.caches == nil {
		budget.caches = map[ReadCache]bool{}
	}
	budget.caches[c] = true
}

// Unregister undoes Register, when a cache closes.
func Unregister(c ReadCache) {
	budget.mu.Lock()
	defer budget.mu.Unlock()
	delete(budget.caches, c)
}

// AddRead changes the process's count of read cache bytes by delta.
func AddRead(delta int64) { budget.readUsed.Add(delta) }

// ReadAllows tells whether a read cache that holds used bytes, of which
// minShare are its own whatever the budget, may take n more.
func ReadAllows(used, minShare, n int64) bool {
	limit := budget.readLimit.Load()
	return limit == 0 || used+n <= minShare || budget.readUsed.Load()+n <= limit
}

// ReclaimRead frees at least n bytes of other mounts' read caches, if it
// can. It holds no lock while a cache reclaims, so caches take only their
// own lock, one at a time.
func ReclaimRead(self ReadCache, n int64) {
	budget.mu.Lock()
	others := make([]ReadCache, 0, len(budget.caches))
	for c := range budget.caches {
		if c != self {
			others = append(others, c)
		}
	}
	budget.mu.Unlock()
	freed := int64(0)
	for _, o := range others {
		freed += o.Reclaim(n - freed)
		if freed >= n {
			return
		}
	}
}
