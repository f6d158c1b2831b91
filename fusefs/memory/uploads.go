package memory

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// Uploads lends a mount's upload buffers: blocks being staged (streamed
// blocks, whole-file uploads, write-back). A buffer takes a slot of the
// mount's own (at most slots at once, over all its files) and its bytes
// from the process's budget, if there is one (SetBudget).
type Uploads struct {
	slots     chan struct{}
	blockSize int64
	// held records what each lent buffer holds of a budget's semaphore,
	// by the address of its first byte.
	held sync.Map
}

// NewUploads makes a mount's lender of at most slots buffers at once, each
// at least blockSize bytes.
func NewUploads(slots int, blockSize int64) *Uploads {
	return &Uploads{slots: make(chan struct{}, slots), blockSize: blockSize}
}

// heldBytes is what a lent upload buffer holds of a budget's semaphore.
type heldBytes struct {
	sem *semaphore.Weighted
	n   int64
}

// Take lends a buffer of at least n bytes. Without wait it returns false
// at once when a slot or the budget's bytes are not free; with it, it
// waits until they are or ctx ends.
func (u *Uploads) Take(ctx context.Context, n int64, wait bool) ([]byte, bool, error) {
	if wait {
		select {
		case u.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	} else {
		select {
		case u.slots <- struct{}{}:
		default:
			return nil, false, nil
		}
	}
	size := max(n, u.blockSize)
	sem := budget.upload.Load()
	var w int64
	if sem != nil {
		w = min(size, budget.uploadCap.Load())
		if wait {
			if err := sem.Acquire(ctx, w); err != nil {
				<-u.slots
				return nil, false, err
			}
		} else if !sem.TryAcquire(w) {
			<-u.slots
			return nil, false, nil
		}
	}
	// Full blocks (of either size a stream uses: it doubles its blocks
	// after a while) come from the process's pool of mapped buffers, like
	// the block cache's (buffers.go): on the heap, each fresh 8 MiB buffer
	// was faulted in page by page while the writer waited, half a second
	// of a core per GiB on a fresh mount.
	var buf []byte
	if size == u.blockSize || size == 2*u.blockSize {
		buf = AllocBlock(size)
	} else {
		buf = make([]byte, size)
	}
	if sem != nil {
		// Given back to the semaphore it came from, even if the
		// budget changes meanwhile.
		u.held.Store(Base(buf), heldBytes{sem, w})
	}
	return buf, true, nil
}

// Give takes back a buffer of Take.
func (u *Uploads) Give(buf []byte) {
	buf = buf[:cap(buf)]
	if h, ok := u.held.LoadAndDelete(Base(buf)); ok {
		h.(heldBytes).sem.Release(h.(heldBytes).n)
	}
	FreeBlock(buf) // leaves a heap buffer to the garbage collector
	<-u.slots
}

// Lent counts the buffers lent and not given back.
func (u *Uploads) Lent() int { return len(u.slots) }

// Get and Put lend the buffers to blobstore.Upload (its Buffers), waiting
// for one.
func (u *Uploads) Get(ctx context.Context, n int64) ([]byte, error) {
	buf, _, err := u.Take(ctx, n, true)
	return buf, err
}

func (u *Uploads) Put(buf []byte) { u.Give(buf) }
