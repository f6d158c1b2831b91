package cache

import (
	"container/list"
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// BlockCache holds fixed-size blocks of blob content in memory.
//
// A block is keyed by blob name, ETag and index, so a rewritten blob never
// serves stale bytes: its old blocks simply age out. Memory is bounded by
// bytes: the buffers that exist never add up to more than capacity. A full
// block's buffer (blockSize bytes, mapped outside the Go heap: see
// memory.AllocBlock) is recycled through a free list; the last block of a blob
// gets a heap buffer of its own length, so that a cache full of small files
// holds thousands of them, not capacity/blockSize. A fetch in flight holds
// its buffer (a new one is allocated by the fetch, off the READ path). When
// no room is left, demand reads wait for a buffer to be unpinned and
// read-ahead is skipped. close frees the buffers (see freeBlockBuf); one
// still pinned is freed when its last pin goes.
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
// A stream through a blob larger than the cache passes its blocks (pass):
// they wait in passed, and their buffers are taken for the next blocks
// before the cache grows or evicts anything else. LRU keeps the blocks of
// such a scan for nothing (a second pass from the start evicts them before
// it gets there), while they pushed out every other file's blocks and made
// a fresh mount take the whole cache's memory, instead of its read-ahead
// window's. A block another handle's read-ahead asked for is shared, and
// never passed: a second reader following the first, within its window,
// finds the blocks the first has read.
//
// Concurrent readers of the same block share one GET. A failed fetch is
// forgotten once its waiters have seen the error, so the next read retries.
//
// Locking: mu guards every field below it and every block's pins, elem,
// owner and membership in blocks; a block's buf and err are written by its
// fetch before ready is closed, and read only after.
type BlockCache struct {
	store     blobstore.Store
	blockSize int64
	capacity  int64
	// maxFetches bounds read-ahead fetches in flight; more wait in
	// queue, served first in, first out.
	maxFetches int

	mu     sync.Mutex
	cond   *sync.Cond
	blocks map[BlockKey]*block
	lru    *list.List     // fetched, unpinned, read blocks; front is most recent
	ahead  *list.List     // fetched, unpinned blocks not read yet; front is most recent
	passed *list.List     // fetched, unpinned blocks a stream has passed; front is most recent
	free   [][]byte       // full-size buffers not in use
	used   int64          // bytes of every buffer that exists or is being allocated
	owned  map[uint64]int // blocks tagged with each owner
	queue  *list.List     // read-ahead blocks waiting for a fetch slot, oldest first
	active int            // fetch workers running (at most maxFetches)
	closed bool           // buffers are freed as soon as unpinned

	hits, misses uint64 // guarded by mu
	// src is where blocks come from: the disk cache, then the store. Its
	// Sums check whole reads against Content-MD5 (nil: no checks); held
	// counts the blocks they keep pinned (guarded by mu).
	src  *Sources
	held int64
}

type BlockKey struct {
	Name string
	ETag string
	Idx  int64
}

type block struct {
	key   BlockKey
	buf   []byte
	err   error
	ready chan struct{}
	pins  int
	elem  *list.Element // in lru or ahead when fetched and unpinned
	// owner is the handle whose read-ahead fetched the block, until
	// the block is first read (then 0): the block waits in ahead.
	owner uint64
	// fetchedFor is the handle whose read-ahead fetched the block (0:
	// a demand read, whose handle is not known); shared: another
	// handle's read-ahead asked for it too (prefetch), so no stream
	// passes it.
	fetchedFor uint64
	shared     bool
	// queued: asked for by read-ahead, waiting in queue (at qelem) for a
	// fetch slot; size is the blob's size, for the fetch.
	queued bool
	qelem  *list.Element
	size   int64
	// passed: a stream read past it in a blob larger than the cache
	// (pass); unpinned, it waits in passed, first to go. A read clears it.
	passed bool
}

// NewBlockCache returns a cache of blocks of blockSize bytes, at most
// capacity bytes of them, fetched from src with at most maxFetches
// read-ahead fetches at once.
func NewBlockCache(src *Sources, blockSize, capacity int64, maxFetches int) *BlockCache {
	c := &BlockCache{
		src:        src,
		blockSize:  blockSize,
		capacity:   capacity,
		owned:      map[uint64]int{},
		maxFetches: max(maxFetches, 1),
		queue:      list.New(),
		blocks:     map[BlockKey]*block{},
		lru:        list.New(),
		ahead:      list.New(),
		passed:     list.New(),
	}
	c.cond = sync.NewCond(&c.mu)
	memory.Register(c)
	return c
}

// PinnedBlocks counts the blocks a reader, a reply or a fetch holds: 0
// when no read is in flight, or a pin leaked.
func (c *BlockCache) PinnedBlocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, b := range c.blocks {
		if b.pins != 0 {
			n++
		}
	}
	return n
}

// Capacity is the most bytes the cache holds.
func (c *BlockCache) Capacity() int64 { return c.capacity }

// Read copies the bytes of blob name (of the given size and ETag) at off
// into p, fetching blocks as needed. It returns the number of bytes copied.
// It pins one block at a time: a Read longer than the cache still ends.
func (c *BlockCache) Read(ctx context.Context, name, etag string, size int64, p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), size)
	done := 0
	for pos := off; pos < end; {
		idx := pos / c.blockSize
		b, err := c.get(ctx, BlockKey{name, etag, idx}, size)
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

// Has reports whether the block is cached, or being fetched.
func (c *BlockCache) Has(key BlockKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.blocks[key]
	return ok
}

// Pin returns the bytes of blob name (of the given size and ETag) from off,
// at most n, in the cache's own block, fetched if need be; the block stays
// pinned, its bytes unchanged, until the range is released. ok is false,
// and nothing is pinned, when the bytes span two blocks: holding one block
// while waiting for a buffer for the next could deadlock readers in a small
// cache, so such reads copy (read).
func (c *BlockCache) Pin(ctx context.Context, name, etag string, size, off int64, n int) (r *PinnedRange, ok bool, err error) {
	end := min(off+int64(n), size)
	if end <= off {
		return &PinnedRange{c: c}, true, nil
	}
	idx := off / c.blockSize
	if (end-1)/c.blockSize != idx {
		return nil, false, nil
	}
	b, err := c.get(ctx, BlockKey{name, etag, idx}, size)
	if err != nil {
		return nil, true, err
	}
	start := off - idx*c.blockSize
	data := b.buf[min(start, int64(len(b.buf))):min(int64(len(b.buf)), end-idx*c.blockSize)]
	if len(data) == 0 {
		// The blob is shorter than its attributes said.
		c.unpin(b)
		return nil, true, io.ErrUnexpectedEOF
	}
	return &PinnedRange{c: c, b: b, data: data}, true, nil
}

// PinnedRange is a range of a blob held in a pinned cache block: the
// answer to a READ can be written to the kernel straight from the block,
// without a copy, and the block stays until Release.
type PinnedRange struct {
	c    *BlockCache
	b    *block // nil once released, and for an empty range
	data []byte // the bytes, within b.buf
}

// Data is the range's bytes; they must not be used after Release.
func (r *PinnedRange) Data() []byte { return r.data }

// Release unpins the block.
func (r *PinnedRange) Release() {
	if r.b != nil {
		r.c.unpin(r.b)
	}
	r.b, r.data = nil, nil
}

// get returns the block pinned; the caller must unpin it.
func (c *BlockCache) get(ctx context.Context, key BlockKey, size int64) (*block, error) {
	c.mu.Lock()
	b := c.blocks[key]
	if b != nil {
		c.hits++
		c.pinLocked(b)
		c.disownLocked(b) // read: evictable like any other
		b.passed = false  // read again: wanted after all (unpin puts it in lru)
		queued := b.queued
		if queued {
			// Still waiting for a slot: a reader must not wait
			// behind read-ahead, so fetch it now, for the queue.
			c.unqueueLocked(b)
		}
		c.mu.Unlock()
		if queued {
			c.runFetch(b)
		}
	} else {
		c.misses++
		n := c.blockLen(key.Idx, size)
		buf, ok := c.reserveLocked(n, true)
		if !ok {
			c.mu.Unlock()
			return nil, errors.New("block cache: no buffer")
		}
		// Another reader may have started the same block while we
		// waited for a buffer.
		if other := c.blocks[key]; other != nil {
			if buf == nil {
				c.addUsedLocked(-n)
				c.cond.Signal()
			} else {
				c.releaseBufLocked(buf)
			}
			b = other
			c.pinLocked(b)
			c.disownLocked(b)
			b.passed = false // read again, as on a hit
			c.mu.Unlock()
		} else {
			b = &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1}
			c.blocks[key] = b
			c.mu.Unlock()
			if b.buf == nil {
				b.buf = c.newBuf(n)
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

// Prefetch starts fetching a block in the background for handle owner (0:
// none) unless it is cached, in flight, or no buffer is free without
// evicting a block that has not been read yet. It reports whether the
// block is now cached or on its way.
//
// A buffer allocated for the first time is allocated by the fetch, not
// here: faulting in fresh memory costs milliseconds per block, and a
// stream's first READ starts a whole window of fetches.
func (c *BlockCache) Prefetch(key BlockKey, size int64, owner uint64) bool {
	if key.Idx*c.blockSize >= size {
		return false
	}
	c.mu.Lock()
	if b := c.blocks[key]; b != nil {
		if owner != 0 && b.fetchedFor != 0 && owner != b.fetchedFor && !b.shared {
			// Another stream of the same blob is coming: no stream
			// passes it now.
			b.shared = true
			if b.passed {
				if b.elem != nil {
					c.passed.Remove(b.elem)
					b.elem = c.lru.PushFront(b)
				}
				b.passed = false
			}
		}
		c.mu.Unlock()
		return true
	}
	if c.closed {
		c.mu.Unlock()
		return false
	}
	n := c.blockLen(key.Idx, size)
	buf, ok := c.reserveLocked(n, false)
	if !ok {
		c.mu.Unlock()
		return false
	}
	if c.blocks[key] != nil || c.closed {
		// Started by another reader, or closed, while reserveLocked
		// let go of mu (memory.ReclaimRead).
		if buf == nil {
			c.addUsedLocked(-n)
			c.cond.Signal()
		} else {
			c.releaseBufLocked(buf)
		}
		started := c.blocks[key] != nil
		c.mu.Unlock()
		return started
	}
	// Pinned by the fetch itself so that it cannot be evicted half-filled.
	b := &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1, owner: owner, fetchedFor: owner, size: size}
	if owner != 0 {
		c.owned[owner]++
	}
	c.blocks[key] = b
	// Queued for a fetch slot, in the order asked for, so that a window
	// wider than the slots keeps every slot busy with the blocks the
	// reader needs first: the next block starts as soon as one arrives,
	// whether or not the reader has moved on yet. (Goroutines waiting on
	// a semaphore each did not start in the order they were created: a
	// random half of a window went first, and the reader waited a whole
	// fetch time for a block queued behind blocks it needed later.)
	b.queued = true
	b.qelem = c.queue.PushBack(b)
	if c.active < c.maxFetches {
		c.active++
		go c.fetchWorker()
	}
	c.mu.Unlock()
	return true
}

// fetchWorker fetches queued read-ahead blocks, oldest first, until the
// queue is empty.
func (c *BlockCache) fetchWorker() {
	for {
		c.mu.Lock()
		e := c.queue.Front()
		if e == nil {
			c.active--
			c.mu.Unlock()
			return
		}
		b := e.Value.(*block)
		c.unqueueLocked(b)
		if c.closed {
			c.abandonLocked(b)
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		c.runFetch(b)
	}
}

// unqueueLocked takes b off the fetch queue; its fetch is the caller's.
func (c *BlockCache) unqueueLocked(b *block) {
	c.queue.Remove(b.qelem)
	b.queued, b.qelem = false, nil
}

// runFetch fetches a block that read-ahead asked for and drops the
// fetch's own pin.
func (c *BlockCache) runFetch(b *block) {
	if b.buf == nil {
		b.buf = c.newBuf(c.blockLen(b.key.Idx, b.size))
	}
	c.fetch(b, b.size)
	c.unpin(b)
}

// abandonLocked gives up a queued block that nobody has pinned but its
// fetch, without fetching it.
func (c *BlockCache) abandonLocked(b *block) {
	if c.blocks[b.key] == b {
		delete(c.blocks, b.key)
	}
	c.disownLocked(b)
	if b.buf == nil {
		// Its bytes were counted when reserved, its buffer not made.
		c.addUsedLocked(-c.blockLen(b.key.Idx, b.size))
		c.cond.Signal()
	} else {
		c.releaseBufLocked(b.buf)
	}
	b.err = errCacheClosed
	close(b.ready)
}

// errCacheClosed ends a read-ahead fetch abandoned by close.
var errCacheClosed = errors.New("block cache closed")

// blockLen is the length of block idx of a blob of the given size.
func (c *BlockCache) blockLen(idx, size int64) int64 {
	return max(min(c.blockSize, size-idx*c.blockSize), 0)
}

// newBuf allocates a buffer of n bytes with its pages faulted in: done
// before the GET, that cost overlaps the store's latency instead of landing
// on the copy at the end of the fetch, when every block of a window arrives
// at once. Full-size buffers are mapped (memory.AllocBlock), others are on the
// heap.
func (c *BlockCache) newBuf(n int64) []byte {
	if n == c.blockSize {
		return memory.AllocBlock(n)
	}
	return memory.FaultedHeap(n)
}

// fetch fills b from the store. It does not depend on any one reader's
// context: other readers may be waiting for the same block.
func (c *BlockCache) fetch(b *block, size int64) {
	off := b.key.Idx * c.blockSize
	n := min(c.blockSize, size-off)
	if n < 0 {
		n = 0
	}
	buf := b.buf[:n]
	// Before ready: once readers have the block, it may be evicted and its
	// buffer reused, and readThrough writes the disk cache from it.
	check := c.src.Sums.Begin(b.key.Name, b.key.ETag, off, n)
	got, err := c.src.readThrough(context.Background(), false, b.key.Name, b.key.ETag, size, buf, off)
	// Before ready too: the block of a whole read that lands last waits
	// for the verdict, and fails on a mismatch. The others are ready at
	// once, pinned until hashed.
	if verr := c.src.Sums.EndHeld(check, buf[:got], err, func() func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		// At most 3/4 of the cache held (read-ahead's window at
		// most): readers must still find room.
		if (c.held+1)*c.blockSize > c.capacity*3/4 {
			return nil
		}
		c.held++
		c.pinLocked(b)
		return func() {
			c.mu.Lock()
			c.held--
			c.mu.Unlock()
			c.unpin(b)
		}
	}); err == nil {
		err = verr
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

func (c *BlockCache) pinLocked(b *block) {
	b.pins++
	if b.elem != nil {
		c.listOf(b).Remove(b.elem)
		b.elem = nil
	}
}

// listOf returns the list an unpinned block belongs in.
func (c *BlockCache) listOf(b *block) *list.List {
	switch {
	case b.owner != 0:
		return c.ahead
	case b.passed:
		return c.passed
	}
	return c.lru
}

// Demote makes the unread read-ahead blocks of handle owner evictable, as
// the least recently used: the handle has moved elsewhere or closed, so
// nothing expects them soon.
func (c *BlockCache) Demote(owner uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owned[owner] == 0 {
		return // the common case: walking every block would cost more
	}
	for _, b := range c.blocks {
		if b.owner != owner {
			continue
		}
		c.disownLocked(b)
		if b.elem != nil {
			// Fetched and waiting in ahead; one still in flight
			// lands in lru when its fetch unpins it.
			c.ahead.Remove(b.elem)
			b.elem = c.lru.PushBack(b)
			c.cond.Signal()
		}
	}
}

func (c *BlockCache) unpin(b *block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b.pins--
	if b.pins > 0 {
		return
	}
	if c.closed && c.blocks[b.key] == b {
		delete(c.blocks, b.key)
	}
	if c.blocks[b.key] != b {
		// Failed, dropped or closed: its buffer goes straight back.
		c.disownLocked(b)
		c.releaseBufLocked(b.buf)
		return
	}
	b.elem = c.listOf(b).PushFront(b)
	c.cond.Signal()
}

// Pass marks block key as passed by the stream of handle by (see
// blockCache): unless it is read again first, its buffer is among the next
// taken. Only a block by's read-ahead fetched and read is passed: not one
// a demand read fetched (whose reader is not known), nor one another
// handle's read-ahead asked for too (shared).
func (c *BlockCache) Pass(key BlockKey, by uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.blocks[key]
	if b == nil || b.fetchedFor == 0 || b.fetchedFor != by || b.owner != 0 || b.queued || b.passed || b.shared {
		return
	}
	if b.elem != nil { // unpinned, in lru
		c.lru.Remove(b.elem)
		b.elem = c.passed.PushFront(b)
	}
	b.passed = true // a pinned block's unpin puts it in passed
}

// disownLocked clears b's owner.
func (c *BlockCache) disownLocked(b *block) {
	if b.owner == 0 {
		return
	}
	if c.owned[b.owner]--; c.owned[b.owner] <= 0 {
		delete(c.owned, b.owner)
	}
	b.owner = 0
}

// reserveLocked returns a buffer of n bytes, the first of: a free
// full-size one; a passed block's; while the bytes allowed are not all
// used, nil and true (the caller allocates a new one, outside mu: faulting
// in fresh memory takes milliseconds); the least recently used read
// block's. With demand (a reader is waiting for the block) it may also take
// the oldest unread read-ahead blocks', and it blocks until a block is
// unpinned.
func (c *BlockCache) reserveLocked(n int64, demand bool) ([]byte, bool) {
	reclaimed := false
	for {
		if k := len(c.free); k > 0 && n == c.blockSize {
			buf := c.free[k-1]
			c.free = c.free[:k-1]
			return buf[:n], true
		}
		if n == c.blockSize {
			// Before growing: a passed block's memory, the one
			// passed longest ago.
			if b := c.evictLocked(c.passed); b != nil {
				if int64(cap(b.buf)) == n {
					return b.buf[:n], true
				}
				c.releaseBufLocked(b.buf) // a blob's last block
				continue
			}
		}
		if c.used+n <= c.capacity && c.budgetAllowsLocked(n) {
			c.addUsedLocked(n)
			return nil, true
		}
		if c.dropFreeLocked() > 0 {
			// Room was held by a full-size buffer this smaller one
			// does not need.
			continue
		}
		if b := c.evictOldestLocked(demand); b != nil {
			if int64(cap(b.buf)) == n {
				return b.buf[:n], true
			}
			c.dropBufLocked(b.buf)
			continue
		}
		if c.used+n <= c.capacity && !reclaimed {
			// Within this mount's share, but the process's budget is
			// taken: other mounts' least recently read blocks go.
			reclaimed = true
			c.mu.Unlock()
			memory.ReclaimRead(c, n)
			c.mu.Lock()
			continue
		}
		if !demand {
			return nil, false
		}
		if c.used+n <= c.capacity {
			// Nothing to reclaim now: wait for this mount's own
			// blocks (it holds at least minShare of them, pinned by
			// its readers), or for others to free some.
			c.timedWaitLocked(100 * time.Millisecond)
			reclaimed = false
			continue
		}
		c.cond.Wait()
	}
}

// evictLocked drops the least recently used block of l and returns it.
func (c *BlockCache) evictLocked(l *list.List) *block {
	e := l.Back()
	if e == nil {
		return nil
	}
	b := e.Value.(*block)
	l.Remove(e)
	b.elem = nil
	b.passed = false
	delete(c.blocks, b.key)
	c.disownLocked(b)
	return b
}

// releaseBufLocked takes back a buffer no block holds any more.
func (c *BlockCache) releaseBufLocked(buf []byte) {
	if int64(cap(buf)) == c.blockSize && !c.closed {
		c.free = append(c.free, buf[:cap(buf)])
	} else {
		c.dropBufLocked(buf)
	}
	c.cond.Signal()
}

// dropBufLocked frees a buffer no block holds and no one has pinned.
func (c *BlockCache) dropBufLocked(buf []byte) {
	c.addUsedLocked(-int64(cap(buf)))
	memory.FreeBlock(buf)
}

// Close drops the read-ahead not started yet, frees every buffer not
// pinned now, and makes the cache free each remaining one when its pin
// goes. A read after Close still works, from a
// buffer freed when the read is done. Call it once the mount is gone.
func (c *BlockCache) Close() {
	memory.Unregister(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for e := c.queue.Front(); e != nil; e = c.queue.Front() {
		b := e.Value.(*block)
		c.unqueueLocked(b)
		c.abandonLocked(b)
	}
	for _, buf := range c.free {
		c.dropBufLocked(buf)
	}
	c.free = nil
	for _, l := range []*list.List{c.passed, c.lru, c.ahead} {
		for b := c.evictLocked(l); b != nil; b = c.evictLocked(l) {
			c.dropBufLocked(b.buf)
		}
	}
	c.cond.Broadcast()
}

// DropVersion forgets every block of one version of a blob (its content
// did not match its Content-MD5); a block pinned now is freed by its last
// unpin.
func (c *BlockCache) DropVersion(name, etag string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, b := range c.blocks {
		if key.Name != name || key.ETag != etag {
			continue
		}
		if b.queued {
			c.unqueueLocked(b)
			c.abandonLocked(b)
			continue
		}
		delete(c.blocks, key)
		if b.elem != nil {
			c.listOf(b).Remove(b.elem)
			b.elem = nil
			c.disownLocked(b)
			c.releaseBufLocked(b.buf)
		}
	}
}

// Usage is the memory the cache's blocks take.
func (c *BlockCache) Usage() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

func (c *BlockCache) Stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// addUsedLocked changes the bytes c's buffers take, here and in the
// process's count.
func (c *BlockCache) addUsedLocked(delta int64) {
	c.used += delta
	memory.AddRead(delta)
}

// minShare is what a read cache may hold whatever the process-wide budget.
func (c *BlockCache) minShare() int64 { return 2 * c.blockSize }

// budgetAllowsLocked tells whether n more bytes fit the process's budget.
func (c *BlockCache) budgetAllowsLocked(n int64) bool {
	return memory.ReadAllows(c.used, c.minShare(), n)
}

// timedWaitLocked waits on c.cond, at most d.
func (c *BlockCache) timedWaitLocked(d time.Duration) {
	t := time.AfterFunc(d, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	c.cond.Wait()
	t.Stop()
}

// Reclaim gives up to n bytes of the cache's memory back to the process's
// budget for another mount (memory.ReclaimRead): its free buffers, then
// its least recently read blocks; never below its minShare.
func (c *BlockCache) Reclaim(n int64) (freed int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for freed < n && c.used > c.minShare() {
		if d := c.dropFreeLocked(); d > 0 {
			freed += d
			continue
		}
		b := c.evictOldestLocked(false)
		if b == nil {
			break
		}
		freed += int64(cap(b.buf))
		c.dropBufLocked(b.buf)
	}
	return freed
}

// dropFreeLocked drops the last free buffer, if there is one, and says how
// many bytes it held.
func (c *BlockCache) dropFreeLocked() int64 {
	k := len(c.free)
	if k == 0 {
		return 0
	}
	n := int64(cap(c.free[k-1]))
	c.dropBufLocked(c.free[k-1])
	c.free = c.free[:k-1]
	return n
}

// evictOldestLocked evicts the block that goes first: the one a stream
// passed longest ago, else the least recently read, else, only for a
// reader waiting (demand), the oldest read-ahead nobody read yet.
func (c *BlockCache) evictOldestLocked(demand bool) *block {
	b := c.evictLocked(c.passed)
	if b == nil {
		b = c.evictLocked(c.lru)
	}
	if b == nil && demand {
		b = c.evictLocked(c.ahead)
	}
	return b
}
