package contentsum

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"hash"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// The order rule of sumChecks: a range beyond the hashed prefix waits for
// a fetch in flight that covers the prefix's end, and gives the pass up
// when none does; a fetch of the first bytes starts a new pass.
func TestSumChecksOrder(t *testing.T) {
	data := storetest.Pattern(300, 9)
	sum := Sum(md5.Sum(data))
	s := NewChecks(storetest.Logger(t), nil)
	if err := s.Expect("a", "e1", 300, sum, true); err != nil {
		t.Fatal(err)
	}
	f0 := s.Begin("a", "e1", 0, 100)
	f1 := s.Begin("a", "e1", 100, 100)
	f2 := s.Begin("a", "e1", 200, 100)
	done := make(chan error, 2)
	go func() { done <- s.End(f2, data[200:], nil) }()
	go func() { done <- s.End(f1, data[100:200], nil) }()
	select {
	case err := <-done:
		t.Fatalf("a range ended before the one before it was hashed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.End(f0, data[:100], nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if v, m := s.Stats(); v != 1 || m != 0 {
		t.Fatalf("verified %d, mismatches %d; want 1, 0", v, m)
	}

	// A gap with nothing in flight over it: no verdict, no wait. (A
	// version's first fetch not at 0 starts no pass at all: its first
	// bytes came from a cache, and blocks held for them would only sit
	// pinned.)
	if err := s.Expect("a", "e2", 300, sum, false); err != nil {
		t.Fatal(err)
	}
	if s.Begin("a", "e2", 100, 100) != nil || s.Begin("a", "e2", 0, 100) != nil {
		t.Fatal("a pass began without a reader at the first byte")
	}
	if err := s.Expect("a", "e2", 300, sum, true); err != nil {
		t.Fatal(err)
	}
	s.End(s.Begin("a", "e2", 0, 50), data[:50], nil)
	g := s.Begin("a", "e2", 100, 100)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	go func() { done <- s.End(g, data[100:200], nil) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("a range with a gap before it waited")
	}
	// A new pass from 0 with a wrong byte: a mismatch, then the version
	// is refused.
	bad := append([]byte(nil), data...)
	bad[250]++
	if err := s.Expect("a", "e2", 300, sum, true); err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < 300; off += 100 {
		err := s.End(s.Begin("a", "e2", off, 100), bad[off:off+100], nil)
		if (err != nil) != (off == 200) {
			t.Fatalf("range at %d: %v", off, err)
		}
	}
	if err := s.Expect("a", "e2", 300, sum, false); err != ErrMismatch {
		t.Fatalf("expect of a corrupt version: %v", err)
	}
	if _, m := s.Stats(); m != 1 {
		t.Fatalf("mismatches %d, want 1", m)
	}
}

// A version that matched once and was later found not to match (a read
// whose transfer went wrong, and was refilled) is no longer trusted for
// passthrough: the kernel would serve it without blobfs seeing a byte.
// (Found by review.)
func TestTrustedNotCorrupt(t *testing.T) {
	s := NewChecks(storetest.Logger(t), nil)
	good, bad := md5.Sum([]byte("good")), md5.Sum([]byte("bad"))
	want := Sum(good)
	key := Version{"a", "e1"}
	if err := s.Verdict(key, 4, want, good[:]); err != nil {
		t.Fatal(err)
	}
	if !s.Trusted("a", "e1", want) {
		t.Fatal("a version that matched is not trusted")
	}
	if err := s.Verdict(key, 4, want, bad[:]); err != ErrMismatch {
		t.Fatalf("verdict of a mismatch: %v", err)
	}
	if s.Trusted("a", "e1", want) {
		t.Fatal("a version found corrupt is still trusted for passthrough")
	}
}

// versionSet forgets its oldest beyond its bound; a version taken out
// leaves no place behind that would push a later one out early.
func TestVersionSet(t *testing.T) {
	v := newVersionSet(3)
	k := func(i int) Version { return Version{"b", fmt.Sprint(i)} }
	for i := range 3 {
		v.add(k(i))
	}
	v.remove(k(1))
	v.add(k(1)) // back, now the newest
	v.add(k(3)) // pushes out k(0), the oldest
	for i, want := range []bool{false, true, true, true} {
		if v.has[k(i)] != want {
			t.Errorf("has %d: %v, want %v (order %v)", i, v.has[k(i)], want, v.order)
		}
	}
	if len(v.order) != 3 {
		t.Errorf("order holds %d, want 3", len(v.order))
	}
}

// Blocks of the block cache (endHeld) go to their readers at once, pinned
// until hashed, and the one that lands last, whatever its offset, waits for
// the verdict and carries it. Every pin goes once the verdict is in.
func TestSumChecksHeld(t *testing.T) {
	data := storetest.Pattern(400, 9)
	bad := slices.Clone(data)
	bad[10]++
	sum := Sum(md5.Sum(data))
	for _, tc := range []struct {
		name    string
		content []byte
		order   []int64
		want    error
	}{
		{"in-order", data, []int64{0, 100, 200, 300}, nil},
		{"reverse", bad, []int64{300, 200, 100, 0}, ErrMismatch},
		{"middle-last", bad, []int64{0, 300, 200, 100}, ErrMismatch},
		{"first-last", data, []int64{200, 100, 300, 0}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewChecks(storetest.Logger(t), nil)
			if err := s.Expect("a", "e", 400, sum, true); err != nil {
				t.Fatal(err)
			}
			flights := map[int64]*Flight{}
			for off := int64(0); off < 400; off += 100 {
				flights[off] = s.Begin("a", "e", off, 100)
			}
			pins := &pinCount{}
			for i, off := range tc.order {
				err := within(t, func() error {
					return s.EndHeld(flights[off], tc.content[off:off+100], nil, pins.hold)
				})
				if i < len(tc.order)-1 && err != nil {
					t.Fatalf("range at %d, not the last to land: %v", off, err)
				}
				if i == len(tc.order)-1 && err != tc.want {
					t.Fatalf("range at %d, the last to land: %v, want %v", off, err, tc.want)
				}
			}
			if n := pins.held(); n != 0 {
				t.Errorf("%d blocks still pinned after the verdict", n)
			}
			v, m := s.Stats()
			if want := map[bool]int64{true: 1}[tc.want == nil]; v != want || m != 1-want {
				t.Errorf("verified %d, mismatches %d", v, m)
			}
		})
	}
}

// A block is not held back while other blocks are hashed: with the hash
// stopped, a block at the prefix and one beyond a gap go to their readers,
// while a range in its fetch's buffer waits to be hashed. A pass given up
// while the hasher has a block keeps that block pinned until the hasher is
// done with it, and a new pass started meanwhile gets its own hash.
func TestSumChecksHashOutsideLock(t *testing.T) {
	gate := gateHashes(t)
	data := storetest.Pattern(400, 3)
	sum := Sum(md5.Sum(data))
	s := NewChecks(storetest.Logger(t), nil)
	if err := s.Expect("a", "e", 400, sum, true); err != nil {
		t.Fatal(err)
	}
	var f [4]*Flight
	for i := range f {
		f[i] = s.Begin("a", "e", int64(i)*100, 100)
	}
	pins := &pinCount{}
	if err := within(t, func() error { return s.EndHeld(f[0], data[:100], nil, pins.hold) }); err != nil {
		t.Fatal(err)
	}
	<-gate.hashing // the hasher has block 0 and is stopped
	if err := within(t, func() error { return s.EndHeld(f[2], data[200:300], nil, pins.hold) }); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- s.End(f[1], data[100:200], nil) }()
	select {
	case err := <-ended:
		t.Fatalf("a range in its fetch's buffer returned before it was hashed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// The fetch of the last block fails, and a range beyond it with
	// nothing in flight before it gives the pass up: the ranges held
	// are let go (the buffer's range returns), and block 0 stays pinned
	// (the hasher reads it).
	s.End(f[3], nil, errors.New("injected"))
	if err := s.End(s.Begin("a", "e", 350, 50), data[350:], nil); err != nil {
		t.Fatal(err)
	}
	if err := within(t, func() error { return <-ended }); err != nil {
		t.Fatal(err)
	}
	if n := pins.held(); n != 1 {
		t.Fatalf("%d blocks pinned after the pass was given up, want 1 (the hasher's)", n)
	}
	// A new pass, its hash not gated, while the old hasher still waits.
	newPassHash = md5.New
	if err := s.Expect("a", "e", 400, sum, true); err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < 400; off += 100 {
		if err := within(t, func() error {
			return s.EndHeld(s.Begin("a", "e", off, 100), data[off:off+100], nil, pins.hold)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if v, m := s.Stats(); v != 1 || m != 0 {
		t.Fatalf("the new pass: verified %d, mismatches %d; want 1, 0", v, m)
	}
	gate.open()
	storetest.WaitFor(t, "the old hasher to unpin its block", func() bool { return pins.held() == 0 })
	if v, m := s.Stats(); v != 1 || m != 0 {
		t.Fatalf("after the old hasher: verified %d, mismatches %d; want 1, 0", v, m)
	}
}

// A second fetch of bytes that landed before, once every byte has landed,
// waits for the verdict: a reader's chunk fetched again beside a fill gets
// the mismatch, not its bytes before the verdict is in. (Found by review:
// the fill, the last to land, got the verdict, and the reader got every
// byte without an error.)
func TestSumChecksSecondFetchWaits(t *testing.T) {
	gate := gateHashes(t)
	data := storetest.Pattern(300, 5)
	bad := slices.Clone(data)
	bad[250]++
	sum := Sum(md5.Sum(data))
	s := NewChecks(storetest.Logger(t), nil)
	if err := s.Expect("a", "e", 300, sum, true); err != nil {
		t.Fatal(err)
	}
	fill := s.Begin("a", "e", 0, 100)
	f1, f2 := s.Begin("a", "e", 100, 100), s.Begin("a", "e", 200, 100)
	pins := &pinCount{}
	for _, f := range []*Flight{f1, f2} {
		if err := within(t, func() error { return s.EndHeld(f, bad[f.off:f.end], nil, pins.hold) }); err != nil {
			t.Fatal(err)
		}
	}
	filled := make(chan error, 1)
	go func() { filled <- s.End(fill, bad[:100], nil) }()
	<-gate.hashing
	gate.step() // [0, 100) hashed; the hasher stops at [100, 200)
	<-gate.hashing
	read := make(chan error, 1)
	go func() {
		// The reader's fetch of bytes the hasher is past.
		read <- s.End(s.Begin("a", "e", 0, 100), bad[:100], nil)
	}()
	select {
	case err := <-read:
		t.Fatalf("a second fetch returned before the verdict: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	gate.open()
	for name, ch := range map[string]chan error{"the fill": filled, "the reader": read} {
		if err := within(t, func() error { return <-ch }); err != ErrMismatch {
			t.Errorf("%s: %v, want the mismatch", name, err)
		}
	}
}

// Ranges of a version land in random orders, from goroutines at once:
// some pinned (blocks), some in their fetch's buffer, some whose pin the
// cache refuses, some failing first and fetched again. Whatever the order,
// nothing waits forever, every pin goes, no buffer is read after it went
// back to its owner (each is overwritten then: a late read would make good
// content mismatch), and a verdict, when the pass ran to the end, reaches
// a range's fetch: every mismatch fails one.
func TestSumChecksRandomOrder(t *testing.T) {
	const size, n = 1000, 10
	data := storetest.Pattern(size, 7)
	sum := Sum(md5.Sum(data))
	for iter := range 300 {
		rng := rand.New(rand.NewPCG(uint64(iter), 1))
		content := slices.Clone(data)
		bad := rng.IntN(2) == 0
		if bad {
			content[rng.IntN(size)]++
		}
		s := NewChecks(storetest.Logger(t), nil)
		if err := s.Expect("a", "e", size, sum, true); err != nil {
			t.Fatal(err)
		}
		flights := make([]*Flight, n)
		for i := range flights {
			flights[i] = s.Begin("a", "e", int64(i)*100, 100)
		}
		pins := &pinCount{}
		errs := make(chan error, 2*n)
		var wg sync.WaitGroup
		for _, i := range rng.Perm(n) {
			// Jitter without a clock: each goroutine yields a random
			// number of times before it lands its range.
			mode, yields := rng.IntN(4), rng.IntN(50)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range yields {
					runtime.Gosched()
				}
				buf := slices.Clone(content[i*100 : (i+1)*100])
				f := flights[i]
				var err error
				switch mode {
				case 0: // a block of the block cache
					err = s.EndHeld(f, buf, nil, func() func() {
						release := pins.hold()
						return func() { release(); clear(buf) }
					})
				case 1: // a block the cache cannot pin
					err = s.EndHeld(f, buf, nil, func() func() { return nil })
				case 2: // a chunk or a fill, in its fetch's buffer
					err = s.End(f, buf, nil)
				case 3: // a fetch that fails, fetched again
					s.End(f, nil, errors.New("injected"))
					err = s.End(s.Begin("a", "e", f.off, 100), buf, nil)
				}
				if mode != 0 {
					clear(buf)
				}
				errs <- err
			}()
		}
		waited := make(chan struct{})
		go func() { wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: ranges still waiting after 10 s", iter)
		}
		close(errs)
		failed := 0
		for err := range errs {
			if err != nil {
				failed++
			}
		}
		verified, mismatches := s.Stats()
		switch {
		case !bad && (mismatches != 0 || failed != 0):
			t.Fatalf("iteration %d: good content: %d mismatches, %d ranges failed", iter, mismatches, failed)
		case bad && verified != 0:
			t.Fatalf("iteration %d: bad content verified", iter)
		case bad && mismatches != 0 && failed == 0:
			t.Fatalf("iteration %d: a mismatch no range's fetch got", iter)
		}
		storetest.WaitFor(t, fmt.Sprintf("iteration %d: every pin released", iter), func() bool { return pins.held() == 0 })
	}
}

// within runs f and fails the test if it takes more than 5 s, rather than
// leaving a wait that never ends to go test's timeout.
func within(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after 5 s")
		return nil
	}
}

// hashGate stops the hashes of the passes started while it is set: each
// Write says on hashing that it began, and waits for a step or for open.
type hashGate struct {
	steps   chan struct{}
	hashing chan struct{}
	once    sync.Once
}

// gateHashes sets a hashGate for the test; it opens at the end of the
// test, so that no hasher is left waiting.
func gateHashes(t *testing.T) *hashGate {
	g := &hashGate{steps: make(chan struct{}), hashing: make(chan struct{}, 64)}
	newPassHash = func() hash.Hash { return gatedHash{md5.New(), g} }
	t.Cleanup(func() {
		newPassHash = md5.New
		g.open()
	})
	return g
}

func (g *hashGate) step() { g.steps <- struct{}{} }
func (g *hashGate) open() { g.once.Do(func() { close(g.steps) }) }

type gatedHash struct {
	hash.Hash
	g *hashGate
}

func (h gatedHash) Write(b []byte) (int, error) {
	h.g.hashing <- struct{}{}
	<-h.g.steps
	return h.Hash.Write(b)
}

// pinCount stands for the block cache's pins in sumChecks tests: it fails
// the test on a release of a block not pinned.
type pinCount struct {
	mu sync.Mutex
	n  int
}

func (p *pinCount) hold() func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	released := false
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if released {
			panic("a block released twice")
		}
		released = true
		p.n--
	}
}

func (p *pinCount) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
