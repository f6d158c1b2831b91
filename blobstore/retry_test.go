package blobstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// scripted is a Store whose Stat answers with the errors of a script, in
// turn, then succeeds (nil entries succeed too); it counts the calls.
type scripted struct {
	Store
	mu     sync.Mutex
	script []error
	calls  int
}

func (s *scripted) Stat(ctx context.Context, name string) (Attrs, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if len(s.script) == 0 {
		return Attrs{Name: name}, nil
	}
	err := s.script[0]
	s.script = s.script[1:]
	return Attrs{Name: name}, err
}

func (s *scripted) fail(errs ...error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = append(s.script, errs...)
}

func (s *scripted) takeCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.calls
	s.calls = 0
	return n
}

// newTestRetrying returns a retrying store over a scripted one that
// records its sleeps instead of sleeping, with no jitter.
func newTestRetrying(p RetryPolicy) (*retrying, *scripted, *sleepRecorder) {
	inner := &scripted{Store: NewMemory()}
	r := NewRetrying(inner, p).(*retrying)
	rec := &sleepRecorder{}
	r.sleep = rec.sleep
	r.jitter = func(time.Duration) time.Duration { return 0 }
	return r, inner, rec
}

func repeat(err error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

type retryAfterErr struct{ d time.Duration }

func (e retryAfterErr) Error() string                 { return "busy" }
func (e retryAfterErr) Unwrap() error                 { return ErrThrottled }
func (e retryAfterErr) RetryAfter() (d time.Duration) { return e.d }

func TestRetrying(t *testing.T) {
	ms := time.Millisecond
	policy := RetryPolicy{MaxAttempts: 4, BaseDelay: 100 * ms, MaxDelay: 300 * ms}
	cases := []struct {
		name      string
		script    []error
		wantErr   error // nil: success
		wantCalls int
		wantSleep []time.Duration
	}{
		{"success", nil, nil, 1, nil},
		{"transient then success", []error{ErrTransient, ErrTransient}, nil, 3, []time.Duration{50 * ms, 100 * ms}},
		{"throttled then success", []error{fmt.Errorf("503: %w", ErrThrottled)}, nil, 2, []time.Duration{50 * ms}},
		{"gives up after MaxAttempts", repeat(ErrTransient, 10), ErrTransient, 4, []time.Duration{50 * ms, 100 * ms, 150 * ms}},
		{"not found is final", []error{ErrNotFound}, ErrNotFound, 1, nil},
		{"precondition is final", []error{ErrPreconditionFailed}, ErrPreconditionFailed, 1, nil},
		{"unauthorized is final", []error{ErrTransient, ErrUnauthorized}, ErrUnauthorized, 2, []time.Duration{50 * ms}},
		{"retry-after is honoured", []error{retryAfterErr{250 * ms}}, nil, 2, []time.Duration{250 * ms}},
		{"retry-after is capped", []error{retryAfterErr{time.Hour}}, nil, 2, []time.Duration{300 * ms}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, inner, rec := newTestRetrying(policy)
			inner.fail(c.script...)
			_, err := r.Stat(t.Context(), "f")
			if (c.wantErr == nil) != (err == nil) || (c.wantErr != nil && !errors.Is(err, c.wantErr)) {
				t.Errorf("err = %v, want %v", err, c.wantErr)
			}
			if n := inner.takeCalls(); n != c.wantCalls {
				t.Errorf("%d calls, want %d", n, c.wantCalls)
			}
			if got := rec.take(); !slices.Equal(got, c.wantSleep) {
				t.Errorf("slept %v, want %v", got, c.wantSleep)
			}
		})
	}
}

func TestRetryingBackoff(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name   string
		jitter func(time.Duration) time.Duration
		want   []time.Duration
	}{
		// Nominal 100, 200, 400, 800, 1000 (capped), 1000: the wait is
		// between half of it and all of it.
		{"least jitter", func(time.Duration) time.Duration { return 0 },
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}},
		{"most jitter", func(n time.Duration) time.Duration { return n - 1 },
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1000 * ms, 1000 * ms}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, inner, rec := newTestRetrying(RetryPolicy{MaxAttempts: 7, BaseDelay: 100 * ms, MaxDelay: time.Second})
			r.jitter = c.jitter
			inner.fail(repeat(ErrTransient, 6)...)
			if _, err := r.Stat(t.Context(), "f"); err != nil {
				t.Fatal(err)
			}
			if got := rec.take(); !slices.Equal(got, c.want) {
				t.Errorf("slept %v, want %v", got, c.want)
			}
		})
	}
	// The real jitter stays within [nominal/2, nominal] and varies.
	r := NewRetrying(&scripted{}, RetryPolicy{BaseDelay: 100 * ms}).(*retrying)
	seen := map[time.Duration]bool{}
	for range 100 {
		d := r.backoff(1, ErrTransient)
		if d < 50*ms || d > 100*ms {
			t.Fatalf("first backoff %v outside [50ms, 100ms]", d)
		}
		seen[d] = true
	}
	if len(seen) < 20 {
		t.Errorf("%d distinct backoffs in 100: no jitter", len(seen))
	}
}

// TestRetryingBudget: retries spend a shared budget; once it is gone, calls
// get one try until successes refill it.
func TestRetryingBudget(t *testing.T) {
	r, inner, _ := newTestRetrying(RetryPolicy{MaxAttempts: 10, Budget: 3, RefillPerSuccess: 0.5})
	ctx := t.Context()
	steps := []struct {
		name      string
		script    []error
		wantErr   bool
		wantCalls int
	}{
		{"a dead backend: three retries, then the budget is spent", repeat(ErrTransient, 10), true, 4},
		{"no budget: one try", repeat(ErrTransient, 10), true, 1},
		{"successes still go through", nil, false, 1},
		{"one success refilled half a token: still one try", repeat(ErrTransient, 10), true, 1},
		{"another success", nil, false, 1},
		{"now one retry", repeat(ErrTransient, 10), true, 2},
	}
	for _, st := range steps {
		inner.mu.Lock()
		inner.script = st.script
		inner.mu.Unlock()
		_, err := r.Stat(ctx, "f")
		if (err != nil) != st.wantErr {
			t.Fatalf("%s: err = %v", st.name, err)
		}
		if n := inner.takeCalls(); n != st.wantCalls {
			t.Fatalf("%s: %d calls, want %d", st.name, n, st.wantCalls)
		}
		if st.wantErr && st.wantCalls < 10 && !strings.Contains(err.Error(), "budget") {
			t.Errorf("%s: error %q does not say the budget is spent", st.name, err)
		}
	}
}

func TestRetryingHonoursContext(t *testing.T) {
	inner := &scripted{Store: NewMemory()}
	inner.fail(repeat(ErrTransient, 100)...)
	r := NewRetrying(inner, RetryPolicy{BaseDelay: time.Hour, MaxDelay: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Stat(ctx, "f")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Errorf("Stat with a 20 ms deadline and hour-long backoff: %v after %v", err, time.Since(start))
	}
	if !strings.Contains(err.Error(), ErrTransient.Error()) {
		t.Errorf("error %q does not say what failed", err)
	}
	if inner.takeCalls() != 1 {
		t.Error("retried after the context ended")
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	got := RetryPolicy{}.withDefaults()
	want := RetryPolicy{MaxAttempts: 5, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Budget: 50, RefillPerSuccess: 0.1}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	if p := (RetryPolicy{MaxAttempts: 1}).withDefaults(); p.MaxAttempts != 1 {
		t.Errorf("MaxAttempts 1 became %d", p.MaxAttempts)
	}
}

// TestRetryingAllOperations runs every operation through a store whose
// first call of each fails transiently: each must be retried and succeed.
func TestRetryingAllOperations(t *testing.T) {
	m := NewMemory()
	f := NewFaulty(m, FaultOptions{})
	r := NewRetrying(f, RetryPolicy{BaseDelay: time.Microsecond})
	ctx := t.Context()
	if _, err := m.Put(ctx, "src", []byte("x"), PutOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, op := range AllOps() {
		f.FailNext(op, 1, ErrTransient)
	}
	id := BlockID("n", 0)
	ops := []func() error{
		func() error { _, err := r.Stat(ctx, "src"); return err },
		func() error { _, err := r.ReadAt(ctx, "src", make([]byte, 1), 0, ""); return err },
		func() error { _, err := r.List(ctx, ListOptions{}); return err },
		func() error { _, err := r.Put(ctx, "p", nil, PutOptions{}); return err },
		func() error { return r.StageBlock(ctx, "b", id, []byte("x")) },
		func() error { _, err := r.CommitBlocks(ctx, "b", []string{id}, PutOptions{}); return err },
		func() error { return r.Delete(ctx, "p", Conditions{}) },
		func() error { _, err := r.Copy(ctx, "c", "src"); return err },
		func() error { _, err := r.SetMetadata(ctx, "c", nil, Conditions{}); return err },
		func() error { return r.Check(ctx) },
	}
	for i, op := range ops {
		if err := op(); err != nil {
			t.Errorf("%s: %v", AllOps()[i], err)
		}
	}
	for _, op := range AllOps() {
		if n := m.Requests()[op]; n < 1 {
			t.Errorf("%s never reached the store", op)
		}
	}
}

// TestRetryingConcurrent shares one budget among many goroutines (for
// -race) and checks that the budget bounds the retries of all of them.
func TestRetryingConcurrent(t *testing.T) {
	r, inner, _ := newTestRetrying(RetryPolicy{MaxAttempts: 3, Budget: 20})
	inner.fail(repeat(ErrTransient, 1000)...)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				r.Stat(t.Context(), "f")
			}
		})
	}
	wg.Wait()
	// 160 calls, 20 retries allowed in total (no successes refill).
	if n := inner.takeCalls(); n != 180 {
		t.Errorf("%d calls, want 160 first tries + 20 retries", n)
	}
}

// TestRetryingBudgetMessage: a call that finds the budget spent says what
// happened and what follows: since when, the bound, that each request now
// gets one try until requests succeed, and how many failed so.
func TestRetryingBudgetMessage(t *testing.T) {
	r, inner, _ := newTestRetrying(RetryPolicy{MaxAttempts: 10, Budget: 3, RefillPerSuccess: 0.5})
	ctx := t.Context()
	var err error
	for range 2 {
		inner.fail(repeat(ErrTransient, 10)...)
		_, err = r.Stat(ctx, "f")
		inner.mu.Lock()
		inner.script = nil
		inner.mu.Unlock()
	}
	for _, want := range []string{
		ErrTransient.Error(),
		"not retried: retry budget exhausted 0s ago",
		"(3 at most, one back per 2 answers)",
		"until requests succeed again each is tried once: 2 failed so",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Two successes refill a token: the next failure is retried again.
	for range 2 {
		if _, err := r.Stat(ctx, "f"); err != nil {
			t.Fatal(err)
		}
	}
	inner.takeCalls()
	inner.fail(ErrTransient)
	if _, err := r.Stat(ctx, "f"); err != nil || inner.takeCalls() != 2 {
		t.Fatalf("after the budget refilled: %v", err)
	}
}
