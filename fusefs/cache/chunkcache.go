package cache

import (
	"container/list"
	"context"
	"io"
	"sync"
)

// ChunkCache serves random reads: small pieces of blobs, fetched with a
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
// A chunk is RandomChunk bytes (the last of a blob shorter), keyed like
// a block by blob name, ETag and index, so a changed blob is never served
// stale. The chunks a read lacks are fetched in one GET from the first
// missing one to the last. Memory is bounded by capacity, taken out of
// Options.BlockCacheBytes (see newChunkCache), least recently used first
// out. Two readers missing the same chunk at once both fetch it: random
// readers rarely do, and the waste is one chunk.
type ChunkCache struct {
	src      *Sources // shared with the block cache
	capacity int64

	mu     sync.Mutex
	chunks map[BlockKey]*list.Element // of *chunk
	lru    *list.List                 // front is most recent
	used   int64
}

type chunk struct {
	key  BlockKey
	data []byte
}

// RandomChunk is the size of the pieces random reads fetch: a 4 KiB read
// costs a 64 KiB GET, whose time on Azure and Azurite is that of its round
// trip, not of its bytes.
const RandomChunk = 64 << 10

// NewChunkCache returns a chunk cache of capacity bytes (0: chunks are
// fetched for each read and not kept).
func NewChunkCache(src *Sources, capacity int64) *ChunkCache {
	return &ChunkCache{src: src, capacity: capacity, chunks: map[BlockKey]*list.Element{}, lru: list.New()}
}

// ChunkCapacity splits Options.BlockCacheBytes between the block cache
// and the chunk cache: a sixteenth for chunks, as long as the blocks keep
// room for two read blocks (the smallest block cache there is), else none.
func ChunkCapacity(cacheBytes, blockSize int64) int64 {
	c := cacheBytes / 16
	if cacheBytes-c < 2*blockSize {
		return 0
	}
	return c
}

// Read copies the bytes of blob name (of the given size and ETag) at off
// into p, from chunks kept or fetched now. It returns how many it copied.
func (c *ChunkCache) Read(ctx context.Context, name, etag string, size int64, p []byte, off int64) (int, error) {
	end := min(off+int64(len(p)), size)
	if end <= off {
		return 0, nil
	}
	first, last := off/RandomChunk, (end-1)/RandomChunk
	have := make([][]byte, last-first+1)
	c.mu.Lock()
	missFrom, missTo := int64(-1), int64(-1)
	for i := first; i <= last; i++ {
		if e, ok := c.chunks[BlockKey{name, etag, i}]; ok {
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
		from, to := missFrom*RandomChunk, min((missTo+1)*RandomChunk, size)
		buf := make([]byte, to-from)
		got, err := c.src.readThrough(ctx, true, name, etag, size, buf, from)
		if err != nil {
			return 0, err
		}
		buf = buf[:got]
		for i := missFrom; i <= missTo; i++ {
			lo := (i - missFrom) * RandomChunk
			if lo >= int64(len(buf)) {
				break // the blob is shorter than its attributes said
			}
			data := buf[lo:min(lo+RandomChunk, int64(len(buf)))]
			have[i-first] = data
			c.keep(BlockKey{name, etag, i}, data)
		}
	}
	done := 0
	for pos := off; pos < end; {
		i := pos / RandomChunk
		data := have[i-first]
		start := pos - i*RandomChunk
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
func (c *ChunkCache) keep(key BlockKey, data []byte) {
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

// DropVersion forgets every chunk of one version of a blob.
func (c *ChunkCache) DropVersion(name, etag string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.chunks {
		if key.Name == name && key.ETag == etag {
			c.lru.Remove(e)
			delete(c.chunks, key)
			c.used -= int64(len(e.Value.(*chunk).data))
		}
	}
}

// Usage is the memory the chunks take.
func (c *ChunkCache) Usage() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}
