package cache

import (
	"container/list"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
)

// DiskCache keeps blob content that reads fetched in files on a local disk,
// so that a block evicted from memory, or read again by another handle or
// another mount of the process, comes from disk instead of the store; a
// file wholly on disk is opened with FUSE passthrough (passthrough.go), and
// the kernel then reads it without asking blobfs at all.
//
// One cache file holds one version of one blob: it is keyed by the
// mount's namespace (which store), the blob's name and its ETag, so a
// rewritten blob is never served from the old version's file (that file
// ages out). Cache files are sparse; which diskUnit-sized pieces of the
// blob they hold is kept in memory, a piece being marked only once its
// bytes are written. The cache does not outlive its process: OpenDiskCache
// empties the directory (an exclusive flock keeps two processes from
// sharing it), because the record of what a file holds is in memory only.
//
// Size is bounded by capacity, counting every piece held; whole files are
// evicted, least recently used first. A file that a reader is using (a
// pread in progress, a passthrough handle) is pinned and is not evicted.
type DiskCache struct {
	dir      string
	lock     *os.File
	capacity int64

	mu      sync.Mutex
	entries map[diskKey]*DiskEntry
	lru     *list.List // unpinned entries; front is the most recently used
	used    int64
	seq     uint64
	closed  bool
	// dropped are files forgotten under mu and not removed yet: unlinking
	// (a large file takes long) happens after mu is let go (removeDropped).
	dropped []*DiskEntry

	// hitBytes counts bytes read from cache files, storedBytes bytes
	// written into them.
	hitBytes, storedBytes atomic.Int64
	// writeErr is the last failed write, reported once (Err).
	writeErr atomic.Pointer[error]
	// fills bounds the files being fetched whole (Sources.FillDisk) over every
	// mount of the process: each holds fillWorkers read blocks of memory.
	fills chan struct{}
}

// diskUnit is the granularity of what a cache file is known to hold: a
// random read's chunk (chunkcache.go), so that chunks and blocks both land
// on whole units.
const diskUnit = RandomChunk

type diskKey struct {
	ns, name, etag string
}

type DiskEntry struct {
	key     diskKey
	path    string
	f       *os.File
	size    int64    // the blob's size
	present []uint64 // bitmap of units held
	held    int64    // units held
	bytes   int64    // bytes the held units count for (the last may be short)
	pins    int
	elem    *list.Element // in lru while unpinned
	gone    bool          // evicted: closed and removed once unpinned
}

// ErrDiskCacheInUse: another process has the disk cache directory open.
var ErrDiskCacheInUse = errors.New("in use by another blobfs process: give each its own directory")

// OpenDiskCache opens (creating it if needed) dir as a disk cache of at
// most capacity bytes. Files a previous process left there are removed.
func OpenDiskCache(dir string, capacity int64) (*DiskCache, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("disk cache: capacity %d: must be positive", capacity)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk cache: %w", err)
	}
	lock, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("disk cache: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("disk cache %s: %w", dir, ErrDiskCacheInUse)
		}
		return nil, fmt.Errorf("disk cache %s: lock: %w", dir, err)
	}
	names, err := lock.Readdirnames(-1)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("disk cache %s: %w", dir, err)
	}
	for _, name := range names {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			lock.Close()
			return nil, fmt.Errorf("disk cache %s: emptying it: %w", dir, err)
		}
	}
	return &DiskCache{
		dir:      dir,
		lock:     lock,
		capacity: capacity,
		entries:  map[diskKey]*DiskEntry{},
		lru:      list.New(),
		fills:    make(chan struct{}, maxFills),
	}, nil
}

// Close removes every cache file and releases the directory. Files pinned
// by passthrough handles are unlinked; the kernel keeps what it has open.
func (c *DiskCache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for _, e := range c.entries {
		c.dropLocked(e)
	}
	c.mu.Unlock()
	c.removeDropped()
	return c.lock.Close()
}

// Dir is the cache's directory.
func (c *DiskCache) Dir() string { return c.dir }

// Usage returns the bytes held and the capacity.
func (c *DiskCache) Usage() (used, capacity int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used, c.capacity
}

// HitBytes is how many bytes reads took from the cache's files.
func (c *DiskCache) HitBytes() int64 { return c.hitBytes.Load() }

// unitsOf returns the units a range [off, end) of a blob of the given size
// wholly covers, as [first, last): a unit is covered when its bytes, up to
// the end of the blob, all lie in the range.
func unitsOf(off, end, size int64) (first, last int64) {
	first = (off + diskUnit - 1) / diskUnit
	if end >= size {
		last = (size + diskUnit - 1) / diskUnit
	} else {
		last = end / diskUnit
	}
	return first, max(last, first)
}

func (e *DiskEntry) has(i int64) bool { return e.present[i/64]&(1<<(i%64)) != 0 }

// read copies the bytes [off, off+len(p)) of the blob (clamped to its size)
// from its cache file when the file holds all of them. ok is false when it
// does not; the caller then asks the store.
func (c *DiskCache) read(ns, name, etag string, size int64, p []byte, off int64) (n int, ok bool) {
	end := min(off+int64(len(p)), size)
	if etag == "" || off >= end {
		return 0, false
	}
	c.mu.Lock()
	e := c.holdingLocked(diskKey{ns, name, etag}, size, off, end)
	if e == nil {
		c.mu.Unlock()
		return 0, false
	}
	c.pinLocked(e)
	c.mu.Unlock()
	defer c.unpin(e)
	got, err := e.f.ReadAt(p[:end-off], off)
	if err != nil || int64(got) != end-off {
		return 0, false
	}
	c.hitBytes.Add(int64(got))
	return got, true
}

// holds tells whether the cache file of a blob holds [off, end).
func (c *DiskCache) holds(ns, name, etag string, size, off, end int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holdingLocked(diskKey{ns, name, etag}, size, off, min(end, size)) != nil
}

// holdingLocked returns the cache file of key (a blob of size bytes) if it
// holds every unit under [off, end), else nil.
func (c *DiskCache) holdingLocked(key diskKey, size, off, end int64) *DiskEntry {
	e := c.entries[key]
	if e == nil || e.size != size || off >= end {
		return nil
	}
	for i := off / diskUnit; i <= (end-1)/diskUnit; i++ {
		if !e.has(i) {
			return nil
		}
	}
	return e
}

// store writes data, the blob's bytes at off, into its cache file, making
// the file (and room for it) if needed. It keeps only the units data
// wholly covers. Failures are not the reader's: the bytes were fetched;
// the cache only misses them later (Err reports the last failure).
func (c *DiskCache) store(ns, name, etag string, size int64, data []byte, off int64) {
	if etag == "" || len(data) == 0 || size > c.capacity {
		return
	}
	first, last := unitsOf(off, off+int64(len(data)), size)
	if first >= last {
		return
	}
	defer c.removeDropped() // after every unlock below
	key := diskKey{ns, name, etag}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	e := c.entries[key]
	if e != nil && e.size != size {
		c.dropLocked(e) // the same ETag with another size: not to be trusted
		e = nil
	}
	var need int64
	for i := first; i < last; i++ {
		if e == nil || !e.has(i) {
			need += unitBytes(i, size)
		}
	}
	if need == 0 {
		if e.elem != nil {
			c.lru.MoveToFront(e.elem)
		}
		c.mu.Unlock()
		return
	}
	if !c.makeRoomLocked(need, e) {
		c.mu.Unlock()
		return
	}
	if e == nil {
		c.seq++
		e = &DiskEntry{
			key:     key,
			path:    filepath.Join(c.dir, fmt.Sprintf("%016x", c.seq)),
			size:    size,
			present: make([]uint64, ((size+diskUnit-1)/diskUnit+63)/64),
		}
		f, err := os.OpenFile(e.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			c.mu.Unlock()
			c.failed(err)
			return
		}
		e.f = f
		c.entries[key] = e
	}
	// The room is taken now, so that writers of other files do not
	// overcommit it while this one writes.
	c.used += need
	e.bytes += need
	c.pinLocked(e)
	c.mu.Unlock()

	from, to := first*diskUnit, min(last*diskUnit, size)
	_, err := e.f.WriteAt(data[from-off:to-off], from)

	c.mu.Lock()
	defer c.mu.Unlock()
	if e.gone { // dropped meanwhile, its bytes with it
		c.unpinLocked(e)
		return
	}
	if err != nil {
		c.unpinLocked(e)
		c.dropLocked(e)
		c.failed(err)
		return
	}
	for i := first; i < last; i++ {
		if !e.has(i) {
			e.present[i/64] |= 1 << (i % 64)
			e.held++
		} else {
			// Marked by a concurrent write of the same bytes, which
			// counted it too.
			c.used -= unitBytes(i, size)
			e.bytes -= unitBytes(i, size)
		}
	}
	c.storedBytes.Add(to - from)
	c.unpinLocked(e)
}

func unitBytes(i, size int64) int64 { return min(diskUnit, size-i*diskUnit) }

func (c *DiskCache) failed(err error) {
	err = fmt.Errorf("disk cache %s: %w", c.dir, err)
	c.writeErr.Store(&err)
}

// Err returns the last failure to write a cache file (a full disk, say),
// and forgets it.
func (c *DiskCache) Err() error {
	if p := c.writeErr.Swap(nil); p != nil {
		return *p
	}
	return nil
}

// Complete returns the cache file of a blob held whole, pinned (the caller
// unpins it), or nil.
func (c *DiskCache) complete(ns, name, etag string, size int64) *DiskEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[diskKey{ns, name, etag}]
	if e == nil || e.size != size || e.held != (size+diskUnit-1)/diskUnit || size == 0 {
		return nil
	}
	c.pinLocked(e)
	return e
}

// makeRoomLocked evicts unpinned files, least recently used first, until
// need more bytes fit; keep is never evicted. It reports whether they fit.
func (c *DiskCache) makeRoomLocked(need int64, keep *DiskEntry) bool {
	for c.used+need > c.capacity {
		el := c.lru.Back()
		for el != nil && el.Value.(*DiskEntry) == keep {
			el = el.Prev()
		}
		if el == nil {
			return false
		}
		c.dropLocked(el.Value.(*DiskEntry))
	}
	return true
}

func (c *DiskCache) pinLocked(e *DiskEntry) {
	e.pins++
	if e.elem != nil {
		c.lru.Remove(e.elem)
		e.elem = nil
	}
}

func (c *DiskCache) unpin(e *DiskEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unpinLocked(e)
}

func (c *DiskCache) unpinLocked(e *DiskEntry) {
	e.pins--
	switch {
	case e.pins > 0:
	case e.gone:
		e.f.Close()
	default:
		e.elem = c.lru.PushFront(e)
	}
}

// dropLocked forgets e and removes its file; its descriptor is closed
// now, or by the last unpin if a reader still uses it.
func (c *DiskCache) dropLocked(e *DiskEntry) {
	if e.gone {
		return
	}
	e.gone = true
	if c.entries[e.key] == e {
		delete(c.entries, e.key)
	}
	if e.elem != nil {
		c.lru.Remove(e.elem)
		e.elem = nil
	}
	c.used -= e.bytes
	c.dropped = append(c.dropped, e)
}

// removeDropped removes the files dropped since the last call, and closes
// those no reader has pinned (the last unpin closes the others). Call it
// without mu.
func (c *DiskCache) removeDropped() {
	c.mu.Lock()
	dropped := c.dropped
	c.dropped = nil
	var unpinned []*os.File
	for _, e := range dropped {
		if e.pins == 0 && e.f != nil {
			unpinned = append(unpinned, e.f)
		}
	}
	c.mu.Unlock()
	for _, e := range dropped {
		os.Remove(e.path)
	}
	for _, f := range unpinned {
		f.Close()
	}
}

// Sources is where a mount's caches get the bytes they hold: its disk
// cache, then the store; whole reads checked against Content-MD5. The
// mount's block and chunk caches share one.
type Sources struct {
	Store blobstore.Store
	// Disk is asked before the store and keeps what the store sent; nil:
	// no disk cache.
	Disk *DiskTier
	// Sums checks whole reads against Content-MD5; nil: no checks.
	Sums *contentsum.Checks
	// Fetched counts the bytes the store sent for reads.
	Fetched atomic.Int64
	Log     *slog.Logger
}

// readThrough reads p, the bytes of blob name (of size bytes, version
// etag) at off, for a cache of the blob's content: from the disk cache when
// it holds them, else from the store, counting what the store sent in
// Fetched and keeping it in the disk cache. It returns what it read; fewer
// bytes than len(p) only at the end of the blob, without error.
//
// The caller must not let p be reused before readThrough returns: the disk
// cache is written from it.
//
// A blob being read whole is hashed here against its Content-MD5 (Sums),
// unless check is false (the block cache checks its blocks itself, to keep
// them pinned while they are hashed): the read that completes a
// mismatching blob fails with contentsum.ErrMismatch.
func (s *Sources) readThrough(ctx context.Context, check bool, name, etag string, size int64, p []byte, off int64) (int, error) {
	sums := s.Sums
	if !check {
		sums = nil
	}
	flight := sums.Begin(name, etag, off, int64(len(p)))
	if got, ok := s.Disk.read(name, etag, size, p, off); ok {
		return got, sums.End(flight, p[:got], nil)
	}
	got, err := s.Store.ReadAt(ctx, name, p, off, etag)
	s.Fetched.Add(int64(got))
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		sums.End(flight, nil, err)
		return got, err
	}
	s.Disk.keep(name, etag, size, p[:got], off)
	return got, sums.End(flight, p[:got], nil)
}

// Forget drops the cache file of a version, if any.
func (t *DiskTier) Forget(name, etag string) {
	if t == nil {
		return
	}
	c := t.cache
	c.mu.Lock()
	if e := c.entries[diskKey{t.ns, name, etag}]; e != nil {
		c.dropLocked(e)
	}
	c.mu.Unlock()
	c.removeDropped()
}

// DiskTier is the disk cache as one mount's block and chunk caches see it:
// below them, above the store. Its methods do nothing on a nil tier (no
// disk cache).
type DiskTier struct {
	cache *DiskCache
	ns    string
	hits  atomic.Int64 // bytes read from the cache (Stats.DiskReadBytes)

	mu sync.Mutex
	// filling: the file versions being fetched whole (Sources.FillDisk).
	filling map[BlockKey]bool
}

// NewDiskTier is cache as one mount sees it: its files, in a namespace
// ns of the cache's own (the mount's store).
func NewDiskTier(cache *DiskCache, ns string) *DiskTier {
	return &DiskTier{cache: cache, ns: ns}
}

// Hits is the bytes read from the cache.
func (t *DiskTier) Hits() int64 { return t.hits.Load() }

// Complete pins and returns the cache file of a version the cache holds
// whole (nil if it does not): it stays while pinned. Unpin it after.
func (t *DiskTier) Complete(name, etag string, size int64) *DiskEntry {
	return t.cache.complete(t.ns, name, etag, size)
}

// Unpin lets the cache drop a file Complete returned.
func (t *DiskTier) Unpin(e *DiskEntry) { t.cache.unpin(e) }

// File is the cache file (for FUSE passthrough, which reads it in the
// kernel).
func (e *DiskEntry) File() *os.File { return e.f }

// read answers a fetch from disk when the cache file holds the range.
func (t *DiskTier) read(name, etag string, size int64, p []byte, off int64) (int, bool) {
	if t == nil {
		return 0, false
	}
	n, ok := t.cache.read(t.ns, name, etag, size, p, off)
	if ok {
		t.hits.Add(int64(n))
	}
	return n, ok
}

// keep writes what a fetch got from the store into the cache file.
func (t *DiskTier) keep(name, etag string, size int64, data []byte, off int64) {
	if t != nil {
		t.cache.store(t.ns, name, etag, size, data, off)
	}
}

// fillWorkers is how many GETs a fill (Sources.FillDisk) keeps in flight, and
// maxFills how many fills run at once in a process.
const (
	fillWorkers = 4
	maxFills    = 2
	// fillChunk is the size of a fill's GETs (and of each worker's
	// buffer, whatever --read-block-mb is).
	fillChunk = 8 << 20
)

// DiskFillBytes is the most memory the fills of a process hold at once
// (their workers' buffers).
const DiskFillBytes = maxFills * fillWorkers * fillChunk

// fillDisk fetches a file that a handle reads at random into the disk
// cache, whole, in the background, as blobfuse2's file cache does at open:
// random reads then come from disk as soon as their part is there, and on
// a read-only mount the next open of the file is passthrough. Only files of
// at most a quarter of the cache, one fill per file version at a time, and
// maxFills at once (others wait their turn); the bytes count as fetched for
// reads (Fetched). A file the fill completes is then checked against its
// Content-MD5 want (verifyFilled). The fill runs in bg, and stops when ctx
// (the mount's) ends.
func (s *Sources) FillDisk(ctx context.Context, bg *sync.WaitGroup, path, etag string, size int64, want contentsum.Sum) {
	t := s.Disk
	if t == nil || etag == "" || size > t.cache.capacity/4 {
		return
	}
	key := BlockKey{Name: path, ETag: etag}
	t.mu.Lock()
	if t.filling[key] {
		t.mu.Unlock()
		return
	}
	if t.filling == nil {
		t.filling = map[BlockKey]bool{}
	}
	t.filling[key] = true
	t.mu.Unlock()
	bg.Add(1)
	go func() {
		defer bg.Done()
		select {
		case t.cache.fills <- struct{}{}:
			defer func() { <-t.cache.fills }()
			if s.fillDiskNow(ctx, path, etag, size) {
				s.verifyFilled(ctx, path, etag, size, want)
			}
		case <-ctx.Done():
		}
		t.mu.Lock()
		delete(t.filling, key)
		t.mu.Unlock()
	}()
}

// fillDiskNow is FillDisk's work; it reports whether every chunk was read.
func (s *Sources) fillDiskNow(ctx context.Context, path, etag string, size int64) bool {
	bs := int64(fillChunk)
	offs := make(chan int64)
	var failed atomic.Pointer[error]
	var workers sync.WaitGroup
	for range fillWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			buf := make([]byte, bs)
			for off := range offs {
				n := min(bs, size-off)
				if _, err := s.readThrough(ctx, true, path, etag, size, buf[:n], off); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	for off := int64(0); off < size && failed.Load() == nil && ctx.Err() == nil; off += bs {
		if !s.Disk.cache.holds(s.Disk.ns, path, etag, size, off, off+bs) {
			offs <- off
		}
	}
	close(offs)
	workers.Wait()
	if p := failed.Load(); p != nil && ctx.Err() == nil {
		s.Log.Debug("disk cache: fetching a file whole stopped", "path", path, "err", *p)
	}
	return failed.Load() == nil && ctx.Err() == nil
}

// verifyFilled hashes a version that a fill left whole in the disk cache,
// from the cache file, and gives the verdict against its Content-MD5 want
// (contentsum.Checks.Verdict): a match lets the next open be passthrough, a
// mismatch drops the cache file and fails reads of the version with EIO.
//
// Why a pass of its own: a fill skips the parts that random reads put on
// disk before it, and fetches out of order, so the in-order hashing of
// reads (contentsum.Checks) does not cover it; and making random reads wait for a
// fill's hash to reach their offset would cost them seconds. The file was
// just written, so this reads the page cache, in the background.
func (s *Sources) verifyFilled(ctx context.Context, path, etag string, size int64, want contentsum.Sum) {
	if s.Sums == nil || !want.Known() || s.Sums.Trusted(path, etag, want) || s.Sums.IsCorrupt(path, etag) {
		return
	}
	e := s.Disk.Complete(path, etag, size)
	if e == nil {
		return // evicted meanwhile, or not all there
	}
	h := md5.New()
	buf := make([]byte, 1<<20)
	var err error
	for off := int64(0); off < size && err == nil; off += int64(len(buf)) {
		if err = ctx.Err(); err == nil { // a large file: stop with the mount
			p := buf[:min(int64(len(buf)), size-off)]
			if _, err = e.f.ReadAt(p, off); err == nil {
				h.Write(p)
			}
		}
	}
	s.Disk.Unpin(e)
	if err != nil {
		s.Log.Debug("disk cache: cannot read back a filled file to check it", "path", path, "err", err)
		return
	}
	s.Sums.Verdict(contentsum.Version{Name: path, ETag: etag}, size, want, h.Sum(nil))
}
