package blobstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"
)

// sleepRecorder replaces the sleep of Faulty or retrying: it records the
// durations asked for and returns at once (or ctx's error).
type sleepRecorder struct {
	mu     sync.Mutex
	sleeps []time.Duration
}

func (r *sleepRecorder) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	if d > 0 {
		r.sleeps = append(r.sleeps, d)
	}
	r.mu.Unlock()
	return ctx.Err()
}

func (r *sleepRecorder) take() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sleeps
	r.sleeps = nil
	return s
}

func TestFaultyProgrammedFaults(t *testing.T) {
	ctx := t.Context()
	cases := []struct {
		name      string
		program   func(f *Faulty)
		wantErrs  []error // of consecutive Puts of "f"; nil = success
		wantPuts  int64   // Puts that reached the inner store
		wantFinal string  // content of "f" afterwards ("" = missing)
	}{
		{"next two fail before the store", func(f *Faulty) { f.FailNext(OpPut, 2, ErrThrottled) },
			[]error{ErrThrottled, ErrThrottled, nil}, 1, "2"},
		{"queued faults apply in order", func(f *Faulty) {
			f.FailNext(OpPut, 1, ErrUnauthorized)
			f.FailNext(OpPut, 1, ErrTransient)
		}, []error{ErrUnauthorized, ErrTransient, nil}, 1, "2"},
		{"after: the store acts, the caller hears an error", func(f *Faulty) { f.FailNextAfter(OpPut, 1, ErrTransient) },
			[]error{ErrTransient, nil}, 2, "1"},
		{"nil error means ErrTransient", func(f *Faulty) { f.FailNext(OpPut, 1, nil) },
			[]error{ErrTransient}, 0, ""},
		{"other operations are unaffected", func(f *Faulty) { f.FailNext(OpStat, 5, ErrThrottled) },
			[]error{nil}, 1, "0"},
		{"cleared faults do not fire", func(f *Faulty) {
			f.FailNext(OpPut, 3, ErrThrottled)
			f.ClearFaults()
		}, []error{nil}, 1, "0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := NewMemory()
			f := NewFaulty(m, FaultOptions{})
			c.program(f)
			for i, want := range c.wantErrs {
				_, err := f.Put(ctx, "f", []byte{'0' + byte(i)}, PutOptions{})
				if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
					t.Errorf("Put %d: %v, want %v", i, err, want)
				}
			}
			if n := m.Requests()[OpPut]; n != c.wantPuts {
				t.Errorf("%d Puts reached the store, want %d", n, c.wantPuts)
			}
			got := ""
			if a, err := m.Stat(ctx, "f"); err == nil {
				b := make([]byte, a.Size)
				m.ReadAt(ctx, "f", b, 0, "")
				got = string(b)
			}
			if got != c.wantFinal {
				t.Errorf("blob holds %q, want %q", got, c.wantFinal)
			}
		})
	}
}

// failurePattern returns which of n Stat calls fail.
func failurePattern(t *testing.T, f *Faulty, n int) []bool {
	var out []bool
	for range n {
		_, err := f.Stat(t.Context(), "missing")
		out = append(out, errors.Is(err, ErrTransient))
	}
	return out
}

func TestFaultyErrorRate(t *testing.T) {
	const n = 400
	opts := FaultOptions{Seed: 42, ErrorRate: 0.25}
	a := failurePattern(t, NewFaulty(NewMemory(), opts), n)
	b := failurePattern(t, NewFaulty(NewMemory(), opts), n)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave different faults")
	}
	opts.Seed = 43
	if c := failurePattern(t, NewFaulty(NewMemory(), opts), n); slices.Equal(a, c) {
		t.Error("different seeds gave the same faults")
	}
	fails := 0
	for _, x := range a {
		if x {
			fails++
		}
	}
	if fails < n/8 || fails > n*3/8 {
		t.Errorf("%d of %d calls failed at rate 0.25", fails, n)
	}

	// Per-operation rates override the general one; Err replaces the
	// default error.
	f := NewFaulty(NewMemory(), FaultOptions{ErrorRate: 0, OpErrorRate: map[Op]float64{OpStat: 1}, Err: ErrThrottled})
	if _, err := f.Stat(t.Context(), "x"); !errors.Is(err, ErrThrottled) {
		t.Errorf("Stat at rate 1: %v, want ErrThrottled", err)
	}
	if _, err := f.Put(t.Context(), "x", nil, PutOptions{}); err != nil {
		t.Errorf("Put at rate 0: %v", err)
	}
}

func TestFaultyDelays(t *testing.T) {
	ctx := t.Context()
	rec := &sleepRecorder{}
	f := NewFaulty(NewMemory(), FaultOptions{Latency: 10 * time.Millisecond, Bandwidth: 1000})
	f.sleep = rec.sleep
	ms := time.Millisecond
	cases := []struct {
		name string
		do   func() error
		want []time.Duration
	}{
		{"stat: latency only", func() error { _, err := f.Stat(ctx, "missing"); return err }, []time.Duration{10 * ms}},
		{"put 500 bytes: latency plus upload", func() error {
			_, err := f.Put(ctx, "f", make([]byte, 500), PutOptions{})
			return err
		}, []time.Duration{510 * ms}},
		{"stage 2000 bytes", func() error { return f.StageBlock(ctx, "g", BlockID("n", 0), make([]byte, 2000)) },
			[]time.Duration{2010 * ms}},
		{"read 300 of 500 bytes: latency, then the download", func() error {
			_, err := f.ReadAt(ctx, "f", make([]byte, 1000), 200, "")
			return err
		}, []time.Duration{10 * ms, 300 * ms}},
		{"commit moves no data", func() error {
			_, err := f.CommitBlocks(ctx, "g", []string{BlockID("n", 0)}, PutOptions{})
			return err
		}, []time.Duration{10 * ms}},
	}
	for _, c := range cases {
		err := c.do()
		if err != nil && !errors.Is(err, ErrNotFound) && err != io.EOF {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := rec.take(); !slices.Equal(got, c.want) {
			t.Errorf("%s: slept %v, want %v", c.name, got, c.want)
		}
	}

	// Jitter stays in [Latency, Latency+Jitter) and varies.
	f.SetOptions(FaultOptions{Seed: 1, Latency: ms, Jitter: ms})
	seen := map[time.Duration]bool{}
	for range 50 {
		f.Stat(ctx, "missing")
		for _, d := range rec.take() {
			if d < ms || d >= 2*ms {
				t.Fatalf("delay %v outside [1ms, 2ms)", d)
			}
			seen[d] = true
		}
	}
	if len(seen) < 10 {
		t.Errorf("only %d distinct delays in 50 calls: no jitter", len(seen))
	}
}

// TestFaultyStreamsAreIndependent: the bandwidth cap applies to each call,
// so parallel transfers wait at the same time instead of queueing. The
// sleep hook lets every transfer wait until all four are waiting: a Faulty
// that serialized them would never get there.
func TestFaultyStreamsAreIndependent(t *testing.T) {
	m := NewMemory()
	if _, err := m.Put(t.Context(), "f", make([]byte, 10_000), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	f := NewFaulty(m, FaultOptions{Bandwidth: 100_000})
	const streams = 4
	var (
		wg      sync.WaitGroup
		arrived sync.WaitGroup
		all     = make(chan struct{})
	)
	arrived.Add(streams)
	go func() { arrived.Wait(); close(all) }()
	f.sleep = func(ctx context.Context, d time.Duration) error {
		if d != 100*time.Millisecond {
			return nil
		}
		arrived.Done()
		select {
		case <-all:
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("the other transfers never started waiting: streams are serialized")
		}
	}
	for range streams {
		wg.Go(func() {
			if _, err := f.ReadAt(t.Context(), "f", make([]byte, 10_000), 0, ""); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestFaultyHonoursContext(t *testing.T) {
	f := NewFaulty(NewMemory(), FaultOptions{Latency: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.Stat(ctx, "x")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Errorf("Stat with an hour of latency and a 20 ms deadline: %v after %v", err, time.Since(start))
	}
}

// TestFaultyRuntimeChanges flips faults while calls run (for -race), then
// checks that the last setting wins.
func TestFaultyRuntimeChanges(t *testing.T) {
	f := NewFaulty(NewMemory(), FaultOptions{Seed: 7})
	ctx := t.Context()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				f.Put(ctx, "f", []byte("x"), PutOptions{})
				f.Stat(ctx, "f")
			}
		})
	}
	for i := range 100 {
		rate := float64(i % 2)
		f.SetOptions(FaultOptions{ErrorRate: rate, Jitter: time.Microsecond})
		f.FailNext(OpStat, 1, ErrThrottled)
		_ = f.Options()
	}
	close(stop)
	wg.Wait()
	f.ClearFaults()
	f.SetOptions(FaultOptions{ErrorRate: 1})
	if _, err := f.Stat(ctx, "f"); !errors.Is(err, ErrTransient) {
		t.Errorf("after switching faults on: %v", err)
	}
	f.SetOptions(FaultOptions{})
	if _, err := f.Put(ctx, "f", nil, PutOptions{}); err != nil {
		t.Errorf("after switching faults off: %v", err)
	}
	if _, err := f.Stat(ctx, "f"); err != nil {
		t.Errorf("after switching faults off: %v", err)
	}
	if f.Unwrap() == nil {
		t.Error("Unwrap returned nil")
	}
}

// TestFaultyLostAnswers: at LostAnswerRate a call reaches the store and
// then fails, about as often as the rate says; ErrorRate 0 alone injects
// nothing.
func TestFaultyLostAnswers(t *testing.T) {
	const n = 400
	mem := NewMemory()
	f := NewFaulty(mem, FaultOptions{Seed: 7, LostAnswerRate: 0.25})
	lost := 0
	for i := range n {
		name := fmt.Sprintf("b%d", i)
		_, err := f.Put(t.Context(), name, []byte("x"), PutOptions{})
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrTransient) {
			t.Fatalf("Put %s: %v, want ErrTransient", name, err)
		}
		lost++
		if _, err := mem.Stat(t.Context(), name); err != nil {
			t.Fatalf("Put %s failed after the store acted, but the blob is not there: %v", name, err)
		}
	}
	if lost < n/8 || lost > n*3/8 {
		t.Errorf("%d of %d answers lost at rate 0.25", lost, n)
	}
	clean := NewFaulty(NewMemory(), FaultOptions{Seed: 7})
	for i := range 100 {
		if _, err := clean.Put(t.Context(), fmt.Sprintf("c%d", i), nil, PutOptions{}); err != nil {
			t.Fatalf("a call failed with no fault configured: %v", err)
		}
	}
}
