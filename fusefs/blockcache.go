package fusefs

import (
	"container/list"
	"context"
	"errors"
	"io"
	"sync"

	"github.com/blobfs/blobfs/blobstore"
)

// blockCache holds fixed-size blocks of blob content in memory.
//
// A block is keyed by blob name, ETag and index, so a rewritten blob never
// serves stale bytes: its old blocks simply age out. Memory is bounded: at
// most maxBlocks buffers of blockSize bytes ever exist, recycled through a
// free list, and a fetch in flight holds one (allocated by the fetch, off
// the READ path). When every buffer is in use,
// demand reads wait for one and read-ahead is skipped.
//
// Eviction: an unpinned block that has been read sits in lru. A block
// fetched by read-ahead and not read yet sits in ahead instead, tagged with
// the handle that asked for it: read-ahead only ever evicts from lru, so
// one stream's read-ahead cannot throw away another's (or its own) blocks
// before they are read, which would waste their bandwidth. A demand read
// evicts from lru first and from ahead only when lru is empty. Blocks leave
// ahead for lru when read, or when their handle seeks elsewhere or closes
// (demote).
//
// Concurrent readers of the same block share one GET. A failed fetch is
// forgotten once its waiters have seen the error, so the next read retries.
//
// Locking: mu guards every field below it and every block's pins, elem,
// owner and membership in blocks; a block's buf and err are written by its
// fetch before ready is closed, and read only after.
type blockCache struct {
	store     blobstore.Store
	blockSize int64
	maxBlocks int
	fetchSem  chan struct{} // bounds read-ahead fetches in flight

	mu        sync.Mutex
	cond      *sync.Cond
	blocks    map[blockKey]*block
	lru       *list.List // fetched, unpinned, read blocks; front is most recent
	ahead     *list.List // fetched, unpinned blocks not read yet; front is most recent
	free      [][]byte
	allocated int

	hits, misses uint64 // guarded by mu
}

type blockKey struct {
	name string
	etag string
	idx  int64
}

type block struct {
	key   blockKey
	buf   []byte
	err   error
	ready chan struct{}
	pins  int
	elem  *list.Element // in lru or ahead when fetched and unpinned
	// owner is the handle whose read-ahead fetched the block, until
	// the block is first read (then 0): the block waits in ahead.
	owner uint64
}

func newBlockCache(store blobstore.Store, blockSize, capacity int64, maxFetches int) *blockCache {
	c := &blockCache{
		store:     store,
		blockSize: blockSize,
		maxBlocks: int(capacity / blockSize),
		fetchSem:  make(chan struct{}, maxFetches),
		blocks:    map[blockKey]*block{},
		lru:       list.New(),
		ahead:     list.New(),
	}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// read copies the bytes of blob name (of the given size and ETag) at off
// into p, fetching blocks as needed. It returns the number of bytes copied.
func (c *blockCache) read(ctx context.Context, name, etag string, size int64, p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), size)
	done := 0
	for pos := off; pos < end; {
		idx := pos / c.blockSize
		b, err := c.get(ctx, blockKey{name, etag, idx}, size)
		if err != nil {
			return done, err
		}
		start := pos - idx*c.blockSize
		n := copy(p[pos-off:end-off], b.buf[min(start, int64(len(b.buf))):])
		c.unpin(b)
		if n == 0 {
			// The blob is shorter than its attributes said.
			return done, io.ErrUnexpectedEOF
		}
		done += n
		pos += int64(n)
	}
	return done, nil
}

// get returns the block pinned; the caller must unpin it.
func (c *blockCache) get(ctx context.Context, key blockKey, size int64) (*block, error) {
	c.mu.Lock()
	b := c.blocks[key]
	if b != nil {
		c.hits++
		c.pinLocked(b)
		b.owner = 0 // read: evictable like any other
		c.mu.Unlock()
	} else {
		c.misses++
		buf, ok := c.reserveLocked(true)
		if !ok {
			c.mu.Unlock()
			return nil, errors.New("block cache: no buffer")
		}
		// Another reader may have started the same block while we
		// waited for a buffer.
		if other := c.blocks[key]; other != nil {
			if buf == nil {
				c.allocated--
			} else {
				c.free = append(c.free, buf)
			}
			c.cond.Signal()
			b = other
			c.pinLocked(b)
			b.owner = 0
			c.mu.Unlock()
		} else {
			b = &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1}
			c.blocks[key] = b
			c.mu.Unlock()
			if b.buf == nil {
				b.buf = newBlockBuf(c.blockSize)
			}
			c.fetch(b, size)
		}
	}
	select {
	case <-b.ready:
	case <-ctx.Done():
		c.unpin(b)
		return nil, ctx.Err()
	}
	if b.err != nil {
		err := b.err
		c.unpin(b)
		return nil, err
	}
	return b, nil
}

// prefetch starts fetching a block in the background for handle owner
// unless it is cached, in flight, or no buffer is free without evicting a
// block that has not been read yet.
//
// A buffer allocated for the first time is allocated by the fetch, not
// here: faulting in fresh memory costs milliseconds per block, and a
// stream's first READ starts a whole window of fetches.
func (c *blockCache) prefetch(key blockKey, size int64, owner uint64) {
	if key.idx*c.blockSize >= size {
		return
	}
	select {
	case c.fetchSem <- struct{}{}:
	default:
		return
	}
	c.mu.Lock()
	if c.blocks[key] != nil {
		c.mu.Unlock()
		<-c.fetchSem
		return
	}
	buf, ok := c.reserveLocked(false)
	if !ok {
		c.mu.Unlock()
		<-c.fetchSem
		return
	}
	// Pinned by the fetch itself so that it cannot be evicted half-filled.
	b := &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1, owner: owner}
	c.blocks[key] = b
	c.mu.Unlock()
	go func() {
		defer func() { <-c.fetchSem }()
		if b.buf == nil {
			b.buf = newBlockBuf(c.blockSize)
		}
		c.fetch(b, size)
		c.unpin(b)
	}()
}

// newBlockBuf allocates a block buffer and faults its pages in. Fresh
// memory from the OS is faulted in page by page on first write (about 4 ms
// per 8 MiB block here); done now, before the GET, that cost overlaps the
// store's latency instead of landing on the copy at the end of the fetch,
// when every block of a window arrives at once.
func newBlockBuf(n int64) []byte {
	buf := make([]byte, n)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 0
	}
	return buf
}

// fetch fills b from the store. It does not depend on any one reader's
// context: other readers may be waiting for the same block.
func (c *blockCache) fetch(b *block, size int64) {
	off := b.key.idx * c.blockSize
	n := min(c.blockSize, size-off)
	if n < 0 {
		n = 0
	}
	buf := b.buf[:n]
	got, err := c.store.ReadAt(context.Background(), b.key.name, buf, off, b.key.etag)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	b.buf = buf[:got]
	b.err = err
	close(b.ready)
	if err != nil {
		c.mu.Lock()
		if c.blocks[b.key] == b {
			delete(c.blocks, b.key)
		}
		c.mu.Unlock()
	}
}

func (c *blockCache) pinLocked(b *block) {
	b.pins++
	if b.elem != nil {
		c.listOf(b).Remove(b.elem)
		b.elem = nil
	}
}

// listOf returns the list an unpinned block belongs in.
func (c *blockCache) listOf(b *block) *list.List {
	if b.owner != 0 {
		return c.ahead
	}
	return c.lru
}

// demote makes the unread read-ahead blocks of handle owner evictable, as
// the least recently used: the handle has moved elsewhere or closed, so
// nothing expects them soon.
func (c *blockCache) demote(owner uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.blocks {
		if b.owner != owner {
			continue
		}
		b.owner = 0
		if b.elem != nil {
			// Fetched and waiting in ahead; one still in flight
			// lands in lru when its fetch unpins it.
			c.ahead.Remove(b.elem)
			b.elem = c.lru.PushBack(b)
			c.cond.Signal()
		}
	}
}

func (c *blockCache) unpin(b *block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b.pins--
	if b.pins > 0 {
		return
	}
	if c.blocks[b.key] != b {
		// Failed or dropped: its buffer goes straight back.
		c.free = append(c.free, b.buf[:cap(b.buf)])
		c.cond.Signal()
		return
	}
	b.elem = c.listOf(b).PushFront(b)
	c.cond.Signal()
}

// reserveLocked returns a block buffer: a free one, the least recently
// used read block's, or, while under the bound, nil and true: the caller
// allocates a new one, outside mu (faulting in fresh memory takes
// milliseconds). With demand (a reader is waiting for the block) it may
// also take the oldest unread read-ahead block's, and it blocks until one
// is unpinned.
func (c *blockCache) reserveLocked(demand bool) ([]byte, bool) {
	for {
		if n := len(c.free); n > 0 {
			buf := c.free[n-1]
			c.free = c.free[:n-1]
			return buf[:c.blockSize], true
		}
		if c.allocated < c.maxBlocks {
			c.allocated++
			return nil, true
		}
		if buf, ok := c.evictLocked(c.lru); ok {
			return buf, true
		}
		if !demand {
			return nil, false
		}
		if buf, ok := c.evictLocked(c.ahead); ok {
			return buf, true
		}
		c.cond.Wait()
	}
}

// evictLocked drops the least recently used block of l and returns its
// buffer.
func (c *blockCache) evictLocked(l *list.List) ([]byte, bool) {
	e := l.Back()
	if e == nil {
		return nil, false
	}
	b := e.Value.(*block)
	l.Remove(e)
	b.elem = nil
	delete(c.blocks, b.key)
	return b.buf[:c.blockSize], true
}

// stats returns hit and miss counts.
func (c *blockCache) stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
