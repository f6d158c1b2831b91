package fusefs

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"hash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// contentSum is a blob's Content-MD5 (blobstore.Attrs.ContentMD5); the
// zero value means the blob has none. An array, not a slice: it sits in
// every listed entry, where a slice would cost a pointer and an allocation.
type contentSum [16]byte

// sumOf returns the contentSum of a Content-MD5 as the store gave it.
func sumOf(b []byte) (s contentSum) {
	if len(b) == len(s) {
		copy(s[:], b)
	}
	return s
}

func (s contentSum) known() bool { return s != contentSum{} }

// errContentMismatch fails the read that completes a whole read of a blob
// whose bytes do not hash to its Content-MD5, and every later read of that
// version through this mount: a mismatch is an error, never silent.
var errContentMismatch = errors.New("the content read does not match the blob's Content-MD5")

// sumChecks verifies whole reads of blobs against their Content-MD5.
//
// Where: every fetch from the store or the disk cache goes through
// readThrough, for the block cache, the chunk cache and disk-cache fills
// alike; a version being read (expect, at each READ) is hashed there, in
// order of offset, as its ranges arrive. The fetch that completes the hash
// gets the verdict: on a mismatch it fails, so the reader of the blob's
// last bytes gets EIO, not the end of the file.
//
// Order: fetches run in parallel and land out of order. A block of the
// block cache that lands beyond the hashed prefix is held (pinned in the
// cache, where read-ahead keeps it anyway, so no copy) and hashed when the
// prefix reaches it, by the fetch that gets it there (endHeld); so the
// fetch that completes the hash may be of any block, and its readers get
// the verdict: a reader of every byte cannot miss it. Fetch goroutines
// never wait for each other there: read-ahead's workers are few, and
// blocks are queued for them in the order asked for, not by offset. Other
// ranges (a fill's, a random read's chunks) wait instead while a fetch in
// flight covers the prefix's end (end). When nothing will fill the gap
// (the reader skipped bytes, or they came from a cache), or held blocks
// wait longer than holdTimeout, the pass is given up until a fetch of the
// blob's first bytes starts a new one. Bytes already cached are not
// fetched again, so a whole read is verified when its pass fetched every
// byte: the first read of a file, or a later one once its blocks were
// evicted.
//
// Cost: one MD5 pass (about 700 MB/s on one core of these machines) over
// the bytes fetched for readers that start at offset 0, and nothing for
// blobs without a Content-MD5 or with --verify-md5=false (a nil sumChecks).
type sumChecks struct {
	log        *slog.Logger
	onMismatch func(name, etag string) // drops the version from the caches

	mu      sync.Mutex
	files   map[verKey]*sumCheck
	corrupt versionSet // versions found not to match
	good    versionSet // versions read whole that matched

	verified   atomic.Int64 // whole reads that matched (Stats.ContentVerified)
	mismatches atomic.Int64 // whole reads that did not (Stats.ContentMismatches)
}

type verKey struct{ name, etag string }

// Bounds of sumChecks: versions being hashed at once (the least recently
// read goes first), and versions remembered as corrupt.
const (
	maxSumChecks  = 256
	maxCorruptSum = 1024
	maxGoodSum    = 4096
	// maxHeld is the most blocks a pass holds ahead of its prefix, and
	// holdTimeout how long they may wait for it to move.
	maxHeld     = 64
	holdTimeout = 5 * time.Second
)

// sumCheck is one pass over a version. Its hash, next and flights are
// guarded by mu; cond wakes the ranges waiting for their turn.
type sumCheck struct {
	key  verKey
	want contentSum
	size int64
	used time.Time // guarded by sumChecks.mu

	mu      sync.Mutex
	cond    *sync.Cond
	h       hash.Hash
	next    int64 // bytes hashed, from offset 0
	broken  bool  // bytes were skipped: no verdict until a new pass
	flights map[*sumFlight]bool
	held    []heldRange // landed beyond next, by offset
	moved   time.Time   // when next last moved, or a range was held
	timer   *time.Timer // gives held ranges up after holdTimeout
}

// heldRange is a block that landed beyond the hashed prefix, kept until
// the prefix reaches it; release unpins it.
type heldRange struct {
	off     int64
	data    []byte
	release func()
}

// sumFlight is one fetch of a range of a version being checked.
type sumFlight struct {
	c        *sumCheck
	off, end int64
}

func newSumChecks(log *slog.Logger, onMismatch func(name, etag string)) *sumChecks {
	return &sumChecks{log: log, onMismatch: onMismatch, files: map[verKey]*sumCheck{},
		corrupt: newVersionSet(maxCorruptSum), good: newVersionSet(maxGoodSum)}
}

// versionSet is a set of versions that forgets its oldest beyond max.
type versionSet struct {
	max   int
	has   map[verKey]bool
	order []verKey // oldest first
}

func newVersionSet(max int) versionSet {
	return versionSet{max: max, has: map[verKey]bool{}}
}

// remove takes key out (a scan: for the rare case).
func (v *versionSet) remove(key verKey) {
	if !v.has[key] {
		return
	}
	delete(v.has, key)
	v.order = slices.DeleteFunc(v.order, func(k verKey) bool { return k == key })
}

func (v *versionSet) add(key verKey) {
	if v.has[key] {
		return
	}
	if len(v.order) >= v.max {
		delete(v.has, v.order[0])
		v.order = v.order[1:]
	}
	v.has[key] = true
	v.order = append(v.order, key)
}

// expect says a reader reads version etag of blob name, size bytes whose
// MD5 is want. It fails for a version already found not to match.
//
// start says the reader is at the first byte and the first block is not
// cached or being fetched: a pass begins (unless one runs). A pass begun
// by a fetch would start too late (read-ahead's fetches of later blocks
// begin before it), and one whose first bytes come from a cache would
// only hold blocks until the timer.
func (s *sumChecks) expect(name, etag string, size int64, want contentSum, start bool) error {
	if s == nil || !want.known() || size == 0 {
		return nil
	}
	key := verKey{name, etag}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.corrupt.has[key] {
		return errContentMismatch
	}
	if c := s.files[key]; c != nil {
		c.used = now
		if start {
			c.startPass()
		}
		return nil
	}
	if len(s.files) >= maxSumChecks {
		var oldest *sumCheck
		for _, c := range s.files {
			if oldest == nil || c.used.Before(oldest.used) {
				oldest = c
			}
		}
		// Its fetches in flight still end against it; it is just no
		// longer found.
		delete(s.files, oldest.key)
	}
	// No pass until a reader at the first byte begins one (start).
	c := &sumCheck{key: key, want: want, size: size, used: now, h: md5.New(), flights: map[*sumFlight]bool{}, broken: true}
	c.cond = sync.NewCond(&c.mu)
	s.files[key] = c
	if start {
		c.startPass()
	}
	return nil
}

// startPass begins a pass from the first byte unless one runs.
func (c *sumCheck) startPass() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken {
		c.broken, c.next = false, 0
		c.h.Reset()
	}
}

// trusted tells whether the kernel may read a version without blobfs
// seeing the bytes (FUSE passthrough from the disk cache): it was read
// whole and matched its Content-MD5 want, and no read since found it not
// to, or it has none, or checks are off. Reads blobfs serves are checked
// as they go; passthrough reads never reach it, so they get only versions
// checked before.
func (s *sumChecks) trusted(name, etag string, want contentSum) bool {
	if s == nil || !want.known() {
		return true
	}
	key := verKey{name, etag}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.good.has[key] && !s.corrupt.has[key]
}

func (s *sumChecks) markGood(key verKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.good.add(key)
}

// corrupt tells whether a version was found not to match: a read that
// got its bytes from a fetch whose verdict went to another reader fails
// too.
func (s *sumChecks) isCorrupt(name, etag string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.corrupt.has[verKey{name, etag}]
}

// begin registers a fetch of [off, off+n) of a version; the fetch must end
// it (sumFlight.end), whatever happens. nil: the range is not checked.
func (s *sumChecks) begin(name, etag string, off, n int64) *sumFlight {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	c := s.files[verKey{name, etag}]
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken {
		return nil
	}
	if off+n <= c.next {
		return nil // hashed already
	}
	f := &sumFlight{c: c, off: off, end: off + n}
	c.flights[f] = true
	return f
}

// end hashes the range's data, got by its fetch, once the bytes before it
// are hashed, waiting while a fetch in flight covers them; err is the
// fetch's failure (the data is then not used). It returns
// errContentMismatch when this range completed a version whose MD5 does
// not match.
func (s *sumChecks) end(f *sumFlight, data []byte, err error) error {
	return s.finish(f, data, err, nil)
}

// endHeld is end for a block of the block cache: when it lands beyond the
// hashed prefix it does not wait; hold pins it and returns its release,
// and it is hashed when the prefix reaches it. hold returns nil when the
// cache cannot spare the block: the pass is then given up.
func (s *sumChecks) endHeld(f *sumFlight, data []byte, err error, hold func() (release func())) error {
	return s.finish(f, data, err, hold)
}

func (s *sumChecks) finish(f *sumFlight, data []byte, err error, hold func() func()) error {
	if f == nil {
		return nil
	}
	c := f.c
	c.mu.Lock()
	for err == nil && !c.broken {
		if f.off <= c.next {
			c.hashLocked(f.off, data)
			// The blocks held for this one.
			for len(c.held) > 0 && c.held[0].off <= c.next {
				r := c.held[0]
				c.held = c.held[1:]
				c.hashLocked(r.off, r.data)
				r.release()
			}
			break
		}
		if hold != nil && len(c.held) < maxHeld {
			if release := hold(); release != nil {
				c.holdLocked(heldRange{off: f.off, data: data, release: release})
				break
			}
		}
		if hold != nil || !c.coveredLocked(c.next) {
			c.breakLocked()
			break
		}
		c.cond.Wait()
	}
	c.cond.Broadcast()
	var sum []byte
	if !c.broken && c.next >= c.size {
		sum = c.h.Sum(nil)
		c.breakLocked() // this pass is over; a new one starts at 0
	}
	// In flight until here: while it waited, it still covered its bytes
	// for the ranges after it.
	delete(c.flights, f)
	c.mu.Unlock()
	if sum == nil {
		if err == nil && s.isCorrupt(c.key.name, c.key.etag) {
			return errContentMismatch
		}
		return nil
	}
	s.mu.Lock()
	if s.files[c.key] == c {
		delete(s.files, c.key)
	}
	s.mu.Unlock()
	return s.verdict(c.key, c.size, c.want, sum)
}

// verdict counts a whole read of version key, size bytes that hashed to
// got against its Content-MD5 want. A mismatch is logged, remembered (every
// later read of the version fails) and dropped from the caches, and it
// returns errContentMismatch.
func (s *sumChecks) verdict(key verKey, size int64, want contentSum, got []byte) error {
	if contentSum(got) == want {
		s.verified.Add(1)
		s.markGood(key)
		return nil
	}
	s.markCorrupt(key)
	if s.onMismatch != nil {
		s.onMismatch(key.name, key.etag)
	}
	// Counted once its copies are gone, so that whoever sees the count
	// sees them gone.
	s.mismatches.Add(1)
	s.log.Error("content does not match the blob's Content-MD5: reads of it fail with EIO (--verify-md5=false reads it anyway)",
		"path", key.name, "etag", key.etag, "size", size,
		"content_md5", hex.EncodeToString(want[:]), "read_md5", hex.EncodeToString(got))
	return errContentMismatch
}

// hashLocked hashes what data, at off, adds beyond the prefix.
func (c *sumCheck) hashLocked(off int64, data []byte) {
	if end := off + int64(len(data)); end > c.next {
		c.h.Write(data[c.next-off:])
		c.next = end
		c.moved = time.Now()
	}
}

// holdLocked keeps r, in order of offset, and makes sure a timer gives it
// up if the prefix stops moving.
func (c *sumCheck) holdLocked(r heldRange) {
	i := len(c.held)
	for i > 0 && c.held[i-1].off > r.off {
		i--
	}
	c.held = append(c.held, heldRange{})
	copy(c.held[i+1:], c.held[i:])
	c.held[i] = r
	if len(c.held) == 1 {
		c.moved = time.Now()
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(holdTimeout, c.checkHeld)
	}
}

// checkHeld gives the pass up when its held blocks have waited
// holdTimeout for the prefix (the reader stopped, or read bytes some cache
// had), so that the cache gets them back.
func (c *sumCheck) checkHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	if len(c.held) == 0 {
		return
	}
	if wait := holdTimeout - time.Since(c.moved); wait > 0 {
		c.timer = time.AfterFunc(wait, c.checkHeld)
		return
	}
	c.breakLocked()
	c.cond.Broadcast()
}

// breakLocked ends the pass: no verdict, held blocks released.
func (c *sumCheck) breakLocked() {
	c.broken = true
	for _, r := range c.held {
		r.release()
	}
	c.held = nil
}

// coveredLocked tells whether a fetch in flight holds the byte at off.
func (c *sumCheck) coveredLocked(off int64) bool {
	for f := range c.flights {
		if f.off <= off && off < f.end {
			return true
		}
	}
	return false
}

func (s *sumChecks) markCorrupt(key verKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.corrupt.add(key)
	// Not trusted again once corrupt drops it, however long good keeps
	// what it has.
	s.good.remove(key)
}

// stats returns the whole reads verified and those that did not match.
func (s *sumChecks) stats() (verified, mismatches int64) {
	if s == nil {
		return 0, 0
	}
	return s.verified.Load(), s.mismatches.Load()
}
