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
// serves stale bytes: its old blocks simply age out. Memory is bounded by
// bytes: the buffers that exist never add up to more than capacity. A full
// block's buffer (blockSize bytes) is recycled through a free list; the
// last block of a blob gets a buffer of its own length, so that a cache
// full of small files holds thousands of them, not capacity/blockSize. A
// fetch in flight holds its buffer. When no room is left, demand reads wait
// for a buffer to be unpinned and read-ahead is skipped.
//
// Concurrent readers of the same block share one GET. A failed fetch is
// forgotten once its waiters have seen the error, so the next read retries.
//
// Locking: mu guards every field below it and every block's pins, elem and
// membership in blocks; a block's buf and err are written once, before ready
// is closed, and read only after.
type blockCache struct {
	store     blobstore.Store
	blockSize int64
	capacity  int64
	fetchSem  chan struct{} // bounds read-ahead fetches in flight

	mu     sync.Mutex
	cond   *sync.Cond
	blocks map[blockKey]*block
	lru    *list.List // fetched, unpinned blocks; front is most recent
	free   [][]byte   // full-size buffers not in use
	used   int64      // bytes of every buffer that exists, free ones included

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
	elem  *list.Element // in lru when fetched and unpinned
}

func newBlockCache(store blobstore.Store, blockSize, capacity int64, maxFetches int) *blockCache {
	c := &blockCache{
		store:     store,
		blockSize: blockSize,
		capacity:  capacity,
		fetchSem:  make(chan struct{}, maxFetches),
		blocks:    map[blockKey]*block{},
		lru:       list.New(),
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
		c.mu.Unlock()
	} else {
		c.misses++
		buf, ok := c.allocLocked(c.blockLen(key.idx, size), true)
		if !ok {
			c.mu.Unlock()
			return nil, errors.New("block cache: no buffer")
		}
		// Another reader may have started the same block while we
		// waited for a buffer.
		if other := c.blocks[key]; other != nil {
			c.releaseBufLocked(buf)
			b = other
			c.pinLocked(b)
			c.mu.Unlock()
		} else {
			b = &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1}
			c.blocks[key] = b
			c.mu.Unlock()
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

// prefetch starts fetching a block in the background unless it is cached,
// in flight, or no buffer is free without waiting. It reports whether the
// block is now cached or on its way.
func (c *blockCache) prefetch(key blockKey, size int64) bool {
	if key.idx*c.blockSize >= size {
		return false
	}
	c.mu.Lock()
	if c.blocks[key] != nil {
		c.mu.Unlock()
		return true
	}
	c.mu.Unlock()
	select {
	case c.fetchSem <- struct{}{}:
	default:
		return false
	}
	c.mu.Lock()
	if c.blocks[key] != nil {
		c.mu.Unlock()
		<-c.fetchSem
		return true
	}
	buf, ok := c.allocLocked(c.blockLen(key.idx, size), false)
	if !ok {
		c.mu.Unlock()
		<-c.fetchSem
		return false
	}
	// Pinned by the fetch itself so that it cannot be evicted half-filled.
	b := &block{key: key, buf: buf, ready: make(chan struct{}), pins: 1}
	c.blocks[key] = b
	c.mu.Unlock()
	go func() {
		defer func() { <-c.fetchSem }()
		c.fetch(b, size)
		c.unpin(b)
	}()
	return true
}

// blockLen is the length of block idx of a blob of the given size.
func (c *blockCache) blockLen(idx, size int64) int64 {
	return max(min(c.blockSize, size-idx*c.blockSize), 0)
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
		c.lru.Remove(b.elem)
		b.elem = nil
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
		c.releaseBufLocked(b.buf)
		return
	}
	b.elem = c.lru.PushFront(b)
	c.cond.Signal()
}

// allocLocked returns a buffer of n bytes: a free full-size one, a new one
// while the bytes allowed are not all used, or the memory of least recently
// used blocks. With wait it blocks until a block is unpinned.
func (c *blockCache) allocLocked(n int64, wait bool) ([]byte, bool) {
	for {
		if n == c.blockSize {
			if k := len(c.free); k > 0 {
				buf := c.free[k-1]
				c.free = c.free[:k-1]
				return buf[:n], true
			}
		}
		if c.used+n <= c.capacity {
			c.used += n
			return make([]byte, n), true
		}
		if k := len(c.free); k > 0 {
			// Room is held by a full-size buffer this small one
			// does not need.
			c.used -= int64(cap(c.free[k-1]))
			c.free = c.free[:k-1]
			continue
		}
		if e := c.lru.Back(); e != nil {
			b := e.Value.(*block)
			c.lru.Remove(e)
			b.elem = nil
			delete(c.blocks, b.key)
			if int64(cap(b.buf)) == n {
				return b.buf[:n], true
			}
			c.used -= int64(cap(b.buf))
			continue
		}
		if !wait {
			return nil, false
		}
		c.cond.Wait()
	}
}

// releaseBufLocked takes back a buffer no block holds any more.
func (c *blockCache) releaseBufLocked(buf []byte) {
	if int64(cap(buf)) == c.blockSize {
		c.free = append(c.free, buf[:cap(buf)])
	} else {
		c.used -= int64(cap(buf))
	}
	c.cond.Signal()
}

// stats returns hit and miss counts.
func (c *blockCache) stats() (hits, misses uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}
