// Package contentsum checks that what a mount reads of a blob is what the
// blob's Content-MD5 says: whole reads are hashed in order of offset as
// their ranges arrive, from whichever cache fetched them, and a version
// whose bytes do not match is failed for every later read, never served
// silently. It owns the Sum type every listed entry carries, and imports
// no other package of the project.
package contentsum

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

// Sum is a blob's Content-MD5 (blobstore.Attrs.ContentMD5); the
// zero value means the blob has none. An array, not a slice: it sits in
// every listed entry, where a slice would cost a pointer and an allocation.
type Sum [16]byte

// Of returns the contentSum of a Content-MD5 as the store gave it.
func Of(b []byte) (s Sum) {
	if len(b) == len(s) {
		copy(s[:], b)
	}
	return s
}

func (s Sum) Known() bool { return s != Sum{} }

// ErrMismatch fails the read that completes a whole read of a blob
// whose bytes do not hash to its Content-MD5, and every later read of that
// version through this mount: a mismatch is an error, never silent.
var ErrMismatch = errors.New("the content read does not match the blob's Content-MD5")

// Checks verifies whole reads of blobs against their Content-MD5.
//
// Where: every fetch from the store or the disk cache goes through
// readThrough, for the block cache, the chunk cache and disk-cache fills
// alike; a version being read (expect, at each READ) is hashed there, in
// order of offset, as its ranges arrive. The fetch that lands last gets
// the verdict: on a mismatch it fails, so a reader of every byte gets EIO,
// not the end of the file.
//
// Order: fetches run in parallel and land out of order, and MD5 takes its
// bytes in order. A range that lands is held (sorted by offset) until the
// hashed prefix reaches it; one goroutine per pass at a time, the hasher
// (hashHeld), hashes the held ranges the prefix reaches, outside the lock,
// so that neither a fetch nor its readers wait for the hashing of other
// blocks. A block of the block cache goes to its readers as soon as it
// lands: it stays pinned in the cache (where read-ahead keeps it anyway, so
// no copy) until hashed. The range that lands last, the one whose bytes
// complete the landed prefix to the end, waits for the verdict before its
// readers get it: a reader of every byte reads it, so cannot miss the
// verdict. A range whose buffer is its fetch's (a fill's, a random read's
// chunks) waits until it is hashed, and only while the bytes before it are
// coming: a fetch in flight covers the prefix's end, or the hasher runs.
// Fetch goroutines of the block cache never wait for other fetches (a
// block the cache cannot pin waits for the hasher, and only once the
// prefix reaches it): read-ahead's workers are few, and blocks are queued
// for them in the order asked for, not by offset. A second fetch of bytes
// that landed before (a fill's and a reader's) waits for the verdict too
// when every byte has landed. When nothing will fill the gap (the
// reader skipped bytes, or they came from a cache), or held blocks wait
// longer than holdTimeout, the pass is given up until a fetch of the
// blob's first bytes starts a new one (a new sumPass, with its own hash:
// a hasher still busy with the old one never touches it). Bytes already
// cached are not fetched again, so a whole read is verified when its pass
// fetched every byte: the first read of a file, or a later one once its
// blocks were evicted.
//
// Cost: one MD5 pass (about 670 MB/s on one core of these machines) over
// the bytes fetched for readers that start at offset 0, and nothing for
// blobs without a Content-MD5 or with --verify-md5=false (a nil Checks).
// The hash trails the fetches by what lands at once: read-ahead's window
// (128 MiB at the defaults) lands together, so a whole read ends about
// 0.2 s after its last byte is fetched (docs/benchmarks.md, faulty-read).
type Checks struct {
	log        *slog.Logger
	onMismatch func(name, etag string) // drops the version from the caches

	mu      sync.Mutex
	files   map[Version]*sumCheck
	corrupt versionSet // versions found not to match
	good    versionSet // versions read whole that matched

	verified   atomic.Int64 // whole reads that matched (Stats.ContentVerified)
	mismatches atomic.Int64 // whole reads that did not (Stats.ContentMismatches)
}

type Version struct{ Name, ETag string }

// Bounds of sumChecks: versions being hashed at once (the least recently
// read goes first), and versions remembered as corrupt.
const (
	maxSumChecks  = 256
	maxCorruptSum = 1024
	maxGoodSum    = 4096
	// maxHeld is the most blocks a pass keeps pinned, and holdTimeout how
	// long held ranges may wait for the prefix to move.
	maxHeld     = 64
	holdTimeout = 5 * time.Second
)

// sumCheck is what sumChecks knows of one version: its Content-MD5 and
// the pass over it now, if any. pass, and everything in it, is guarded by
// mu; cond wakes the ranges waiting on the pass.
type sumCheck struct {
	key  Version
	want Sum
	size int64
	used time.Time // guarded by sumChecks.mu

	mu    sync.Mutex
	cond  *sync.Cond
	pass  *sumPass    // nil until a reader at the first byte starts one
	timer *time.Timer // gives held ranges up after holdTimeout
}

// newPassHash makes a pass's hash; a test slows it down.
var newPassHash = md5.New

// sumPass is one pass over a version, from offset 0. A new pass is a new
// sumPass, so a hasher still busy with an old one never touches it.
type sumPass struct {
	h       hash.Hash // hashes [0, next); written by the hasher alone
	next    int64
	running bool         // a hasher (hashHeld) works for this pass
	taken   *heldRange   // the range the hasher hashes outside the lock
	held    []*heldRange // landed, not hashed yet, by offset
	pinned  int          // ranges in held and taken with a release
	flights map[*Flight]bool
	moved   time.Time // when next last moved, or a range was held

	broken   bool  // given up (bytes skipped, or held too long): no verdict
	complete bool  // every byte hashed; the verdict is being given
	decided  bool  // the verdict is in verdict
	verdict  error // nil or errContentMismatch
}

// over tells whether the pass takes no more ranges.
func (p *sumPass) over() bool { return p.broken || p.complete }

// heldRange is a range that landed and waits for the prefix to reach it.
// release, if not nil, unpins the block of the block cache it lies in;
// without one, data is its fetch's buffer, and the fetch waits for done.
type heldRange struct {
	off     int64
	data    []byte
	release func()
	done    bool // hashed, or dropped with the pass
}

func (r *heldRange) end() int64 { return r.off + int64(len(r.data)) }

// Flight is one fetch of a range of a version being checked.
type Flight struct {
	c        *sumCheck
	p        *sumPass
	off, end int64
}

func NewChecks(log *slog.Logger, onMismatch func(name, etag string)) *Checks {
	return &Checks{log: log, onMismatch: onMismatch, files: map[Version]*sumCheck{},
		corrupt: newVersionSet(maxCorruptSum), good: newVersionSet(maxGoodSum)}
}

// versionSet is a set of versions that forgets its oldest beyond max.
type versionSet struct {
	max   int
	has   map[Version]bool
	order []Version // oldest first
}

func newVersionSet(max int) versionSet {
	return versionSet{max: max, has: map[Version]bool{}}
}

// remove takes key out (a scan: for the rare case).
func (v *versionSet) remove(key Version) {
	if !v.has[key] {
		return
	}
	delete(v.has, key)
	v.order = slices.DeleteFunc(v.order, func(k Version) bool { return k == key })
}

func (v *versionSet) add(key Version) {
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

// Expect says a reader reads version etag of blob name, size bytes whose
// MD5 is want. It fails for a version already found not to match.
//
// start says the reader is at the first byte and the first block is not
// cached or being fetched: a pass begins (unless one runs). A pass begun
// by a fetch would start too late (read-ahead's fetches of later blocks
// begin before it), and one whose first bytes come from a cache would
// only hold blocks until the timer.
func (s *Checks) Expect(name, etag string, size int64, want Sum, start bool) error {
	if s == nil || !want.Known() || size == 0 {
		return nil
	}
	key := Version{name, etag}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.corrupt.has[key] {
		return ErrMismatch
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
	c := &sumCheck{key: key, want: want, size: size, used: now}
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
	if c.pass == nil || c.pass.over() {
		c.pass = &sumPass{h: newPassHash(), flights: map[*Flight]bool{}}
	}
}

// Trusted tells whether the kernel may read a version without blobfs
// seeing the bytes (FUSE passthrough from the disk cache): it was read
// whole and matched its Content-MD5 want, and no read since found it not
// to, or it has none, or checks are off. Reads blobfs serves are checked
// as they go; passthrough reads never reach it, so they get only versions
// checked before.
func (s *Checks) Trusted(name, etag string, want Sum) bool {
	if s == nil || !want.Known() {
		return true
	}
	key := Version{name, etag}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.good.has[key] && !s.corrupt.has[key]
}

func (s *Checks) markGood(key Version) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.good.add(key)
}

// corrupt tells whether a version was found not to match: a read that
// got its bytes from a fetch whose verdict went to another reader fails
// too.
func (s *Checks) IsCorrupt(name, etag string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.corrupt.has[Version{name, etag}]
}

// Begin registers a fetch of [off, off+n) of a version; the fetch must end
// it (sumFlight.end), whatever happens. nil: the range is not checked.
func (s *Checks) Begin(name, etag string, off, n int64) *Flight {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	c := s.files[Version{name, etag}]
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pass
	if p == nil || p.broken || p.decided {
		return nil
	}
	if off+n <= p.next && p.frontLocked() < c.size {
		// Hashed already. (With every byte landed, a second fetch of
		// them waits for the verdict as the last one does.)
		return nil
	}
	f := &Flight{c: c, p: p, off: off, end: off + n}
	p.flights[f] = true
	return f
}

// End hands the range's data, got by its fetch, to the pass and waits
// until it is hashed, while the bytes before it are coming (a fetch in
// flight covers the prefix's End, or the hasher runs); err is the fetch's
// failure (the data is then not used). It returns errContentMismatch when
// this range was the last of a version to land and the version's MD5 does
// not match.
func (s *Checks) End(f *Flight, data []byte, err error) error {
	return s.finish(f, data, err, nil)
}

// EndHeld is end for a block of the block cache: hold pins the block and
// returns its release, and EndHeld returns at once, the block hashed later
// (the hasher unpins it then), unless it is the last of the version to
// land: then it waits for the verdict. hold returns nil when the cache
// cannot spare the block: the block then waits to be hashed if the prefix
// reaches it, and the pass is given up if not.
func (s *Checks) EndHeld(f *Flight, data []byte, err error, hold func() (release func())) error {
	return s.finish(f, data, err, hold)
}

func (s *Checks) finish(f *Flight, data []byte, err error, hold func() func()) error {
	if f == nil {
		return nil
	}
	c, p := f.c, f.p
	c.mu.Lock()
	var r *heldRange
	if err == nil && !p.over() && f.end > p.next {
		front := p.frontLocked()
		if hold != nil && p.pinned < maxHeld {
			if release := hold(); release != nil {
				r = &heldRange{off: f.off, data: data, release: release}
				p.pinned++
			}
		}
		switch {
		case r != nil:
		case f.off <= front:
			// Not pinned: its buffer is its caller's, so it waits to be
			// hashed, and the prefix reaches it.
			r = &heldRange{off: f.off, data: data}
		case hold == nil && p.coveredLocked(front):
			// A fetch in flight fills the gap before it. (A block of
			// the block cache does not wait for another fetch.)
			r = &heldRange{off: f.off, data: data}
		default:
			c.breakLocked(p)
		}
	}
	// In flight until here: it covered its bytes for the ranges after it;
	// from here on, held does.
	delete(p.flights, f)
	if r != nil {
		c.holdLocked(p, r)
		s.startHasherLocked(c, p)
	}
	// Every byte landed and no verdict yet: this range's readers wait for
	// it. It is the last to land, or a second fetch of bytes that landed
	// before (a fill's and a reader's), whose reader might otherwise get
	// every byte before the verdict is in.
	last := err == nil && !p.broken && !p.decided && p.frontLocked() >= c.size
	c.cond.Broadcast()
	for {
		if r != nil && r.release == nil && !r.done {
			// The prefix stopped short of it: nothing will fill the gap.
			if !p.running && !p.over() && !p.coveredLocked(p.next) {
				c.breakLocked(p)
				c.cond.Broadcast()
				continue
			}
		} else if !last || p.decided || p.broken {
			break
		}
		c.cond.Wait()
	}
	decided, verdict := last && p.decided, p.verdict
	c.mu.Unlock()
	if decided {
		return verdict
	}
	if err == nil && s.IsCorrupt(c.key.Name, c.key.ETag) {
		return ErrMismatch
	}
	return nil
}

// startHasherLocked starts a hasher for pass p when the prefix reaches its
// first held range and none runs.
func (s *Checks) startHasherLocked(c *sumCheck, p *sumPass) {
	if !p.running && !p.over() && len(p.held) > 0 && p.held[0].off <= p.next {
		p.running = true
		go s.hashHeld(c, p)
	}
}

// hashHeld is pass p's hasher: it hashes the held ranges the prefix
// reaches, one at a time and outside the lock (so the fetches of the
// version land, and their blocks go to readers, while it hashes), and
// gives the verdict when the prefix reaches the end. One runs per pass at
// a time: the hash takes its bytes in order.
func (s *Checks) hashHeld(c *sumCheck, p *sumPass) {
	c.mu.Lock()
	for !p.over() && len(p.held) > 0 && p.held[0].off <= p.next {
		r := p.held[0]
		p.held = p.held[1:]
		p.taken = r
		next := p.next
		c.mu.Unlock()
		if end := r.end(); end > next {
			p.h.Write(r.data[next-r.off:])
			next = end
		}
		c.mu.Lock()
		p.taken = nil
		p.next, p.moved = next, time.Now()
		r.done = true
		if r.release != nil {
			r.release()
			p.pinned--
		}
		c.cond.Broadcast()
	}
	p.running = false
	if p.over() || p.next < c.size {
		c.mu.Unlock()
		return
	}
	p.complete = true // a new pass may start: it starts at 0
	sum := p.h.Sum(nil)
	c.mu.Unlock()
	// Done with the version, unless a new pass began on it meanwhile
	// (its reader's fetches find it through files). expect starts passes
	// under s.mu, so the check holds both.
	s.mu.Lock()
	c.mu.Lock()
	if s.files[c.key] == c && c.pass == p {
		delete(s.files, c.key)
	}
	c.mu.Unlock()
	s.mu.Unlock()
	verdict := s.Verdict(c.key, c.size, c.want, sum)
	c.mu.Lock()
	p.decided, p.verdict = true, verdict
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Verdict counts a whole read of version key, size bytes that hashed to
// got against its Content-MD5 want. A mismatch is logged, remembered (every
// later read of the version fails) and dropped from the caches, and it
// returns errContentMismatch.
func (s *Checks) Verdict(key Version, size int64, want Sum, got []byte) error {
	if Sum(got) == want {
		s.verified.Add(1)
		s.markGood(key)
		return nil
	}
	s.markCorrupt(key)
	if s.onMismatch != nil {
		s.onMismatch(key.Name, key.ETag)
	}
	// Counted once its copies are gone, so that whoever sees the count
	// sees them gone.
	s.mismatches.Add(1)
	s.log.Error("content does not match the blob's Content-MD5: reads of it fail with EIO (--verify-md5=false reads it anyway)",
		"path", key.Name, "etag", key.ETag, "size", size,
		"content_md5", hex.EncodeToString(want[:]), "read_md5", hex.EncodeToString(got))
	return ErrMismatch
}

// holdLocked keeps r in p's held ranges, in order of offset, and makes
// sure a timer gives the pass up if its prefix stops moving.
func (c *sumCheck) holdLocked(p *sumPass, r *heldRange) {
	i := len(p.held)
	for i > 0 && p.held[i-1].off > r.off {
		i--
	}
	p.held = slices.Insert(p.held, i, r)
	if len(p.held) == 1 {
		p.moved = time.Now()
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(holdTimeout, c.checkHeld)
	}
}

// frontLocked is where the bytes landed from offset 0 end: hashed, being
// hashed, or held.
func (p *sumPass) frontLocked() int64 {
	front := p.next
	if p.taken != nil {
		front = max(front, p.taken.end())
	}
	for _, r := range p.held {
		if r.off > front {
			break
		}
		front = max(front, r.end())
	}
	return front
}

// checkHeld gives the pass up when its held blocks have waited
// holdTimeout for the prefix (the reader stopped, or read bytes some cache
// had), so that the cache gets them back.
func (c *sumCheck) checkHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	p := c.pass
	if p == nil || len(p.held) == 0 || p.over() {
		return
	}
	if wait := holdTimeout - time.Since(p.moved); wait > 0 || p.running {
		c.timer = time.AfterFunc(max(wait, holdTimeout/10), c.checkHeld)
		return
	}
	c.breakLocked(p)
	c.cond.Broadcast()
}

// breakLocked gives pass p up: no verdict, held ranges released. The
// range the hasher has is its own to release.
func (c *sumCheck) breakLocked(p *sumPass) {
	p.broken = true
	for _, r := range p.held {
		r.done = true
		if r.release != nil {
			r.release()
			p.pinned--
		}
	}
	p.held = nil
}

// coveredLocked tells whether a fetch in flight holds the byte at off.
func (p *sumPass) coveredLocked(off int64) bool {
	for f := range p.flights {
		if f.off <= off && off < f.end {
			return true
		}
	}
	return false
}

func (s *Checks) markCorrupt(key Version) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.corrupt.add(key)
	// Not trusted again once corrupt drops it, however long good keeps
	// what it has.
	s.good.remove(key)
}

// Stats returns the whole reads verified and those that did not match.
func (s *Checks) Stats() (verified, mismatches int64) {
	if s == nil {
		return 0, 0
	}
	return s.verified.Load(), s.mismatches.Load()
}
