package fusefs

import (
	"container/list"
	"context"
	"io"
	"sync"
	"sync/atomic"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
)

// chunkCache serves random reads: small pieces of blobs, fetched with a
// ranged GET of the chunks a READ needs instead of the ReadBlockSize block
// around it.
//
// Why: a reader that seeks before every read (a database file, an index, a
// model's weights read by offset, fio randread) used to pay a whole block,
// 8 MiB by default, for each cold 4 KiB read: on Azurite, 76-105 reads a
// second where rclone's and goofys's ranged reads did as well and
// blobfuse2's local file cache did 1,000 times better. A handle is taken
// for random once two reads in a row did not continue the one before
// (readAhead); its reads then come from the block cache when their block is
// there, else from here. A handle that reads sequentially again goes back
// to blocks and read-ahead at once.
//
// A chunk is randomChunk bytes (the last of a blob shorter), keyed like
// a block by blob name, ETag and index, so a changed blob is never served
// stale. The chunks a read lacks are fetched in one GET from the first
// missing one to the last. Memory is bounded by capacity, taken out of
// Options.BlockCacheBytes (see newChunkCache), least recently used first
// out. Two readers missing the same chunk at once both fetch it: random
// readers rarely do, and the waste is one chunk.
type chunkCache struct {
	store    blobstore.Store
	capacity int64
	fetched  *atomic.Int64      // bytes downloaded for reads, shared with the block cache
	disk     *diskTier          // asked before the store (diskcache.go); may be nil
	sums     *contentsum.Checks // checks whole reads (contentsum.go); may be nil

	mu     sync.Mutex
	chunks map[blockKey]*list.Element // of *chunk
	lru    *list.List                 // front is most recent
	used   int64
}

type chunk struct {
	key  blockKey
	data []byte
}

// randomChunk is the size of the pieces random reads fetch: a 4 KiB read
// costs a 64 KiB GET, whose time on Azure and Azurite is that of its round
// trip, not of its bytes.
const randomChunk = 64 << 10

// newChunkCache returns a chunk cache of capacity bytes (0: chunks are
// fetched for each read and not kept).
func newChunkCache(store blobstore.Store, capacity int64, fetched *atomic.Int64) *chunkCache {
	return &chunkCache{store: store, capacity: capacity, fetched: fetched, chunks: map[blockKey]*list.Element{}, lru: list.New()}
}

// chunkCapacity splits Options.BlockCacheBytes between the block cache
// and the chunk cache: a sixteenth for chunks, as long as the blocks keep
// room for two read blocks (the smallest block cache there is), else none.
func chunkCapacity(cacheBytes, blockSize int64) int64 {
	c := cacheBytes / 16
	if cacheBytes-c < 2*blockSize {
		return 0
	}
	return c
}

// read copies the bytes of blob name (of the given size and ETag) at off
// into p, from chunks kept or fetched now. It returns how many it copied.
func (c *chunkCache) read(ctx context.Context, name, etag string, size int64, p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), size)
	if end <= off {
		return 0, nil
	}
	first, last := off/randomChunk, (end-1)/randomChunk
	have := make([][]byte, last-first+1)
	c.mu.Lock()
	missFrom, missTo := int64(-1), int64(-1)
	for i := first; i <= last; i++ {
		if e, ok := c.chunks[blockKey{name, etag, i}]; ok {
			c.lru.MoveToFront(e)
			have[i-first] = e.Value.(*chunk).data
			continue
		}
		if missFrom < 0 {
			missFrom = i
		}
		missTo = i
	}
	c.mu.Unlock()
	if missFrom >= 0 {
		from, to := missFrom*randomChunk, min((missTo+1)*randomChunk, size)
		buf := make([]byte, to-from)
		got, err := readThrough(ctx, c.store, c.disk, c.sums, c.fetched, name, etag, size, buf, from)
		if err != nil {
			return 0, err
		}
		buf = buf[:got]
		for i := missFrom; i <= missTo; i++ {
			lo := (i - missFrom) * randomChunk
			if lo >= int64(len(buf)) {
				break // the blob is shorter than its attributes said
			}
			data := buf[lo:min(lo+randomChunk, int64(len(buf)))]
			have[i-first] = data
			c.keep(blockKey{name, etag, i}, data)
		}
	}
	done := 0
	for pos := off; pos < end; {
		i := pos / randomChunk
		data := have[i-first]
		start := pos - i*randomChunk
		if start >= int64(len(data)) {
			return done, io.ErrUnexpectedEOF
		}
		n := copy(p[pos-off:end-off], data[start:])
		done += n
		pos += int64(n)
	}
	return done, nil
}

// keep adds a chunk, dropping the least recently used ones over capacity.
func (c *chunkCache) keep(key blockKey, data []byte) {
	if c.capacity <= 0 || int64(len(data)) > c.capacity {
		return
	}
	// A chunk of its own, not a slice of the fetch's buffer: a kept chunk
	// must not hold the whole range's memory.
	data = append([]byte(nil), data...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.chunks[key]; ok {
		c.lru.MoveToFront(e)
		return
	}
	c.chunks[key] = c.lru.PushFront(&chunk{key: key, data: data})
	c.used += int64(len(data))
	for c.used > c.capacity {
		e := c.lru.Back()
		ch := e.Value.(*chunk)
		c.lru.Remove(e)
		delete(c.chunks, ch.key)
		c.used -= int64(len(ch.data))
	}
}

// dropVersion forgets every chunk of one version of a blob.
func (c *chunkCache) dropVersion(name, etag string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.chunks {
		if key.name == name && key.etag == etag {
			c.lru.Remove(e)
			delete(c.chunks, key)
			c.used -= int64(len(e.Value.(*chunk).data))
		}
	}
}

// usage is the memory the chunks take.
func (c *chunkCache) usage() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}
