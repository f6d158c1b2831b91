package blobstore

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"
)

// FaultOptions configure a Faulty store. The zero value injects nothing.
type FaultOptions struct {
	// Seed makes the random choices (which call fails, how much jitter)
	// repeatable: the same seed and the same sequence of calls give the
	// same faults. 0 picks a random seed.
	Seed uint64
	// ErrorRate is the probability, for every call, that it fails with
	// Err before reaching the inner store. OpErrorRate overrides it per
	// operation.
	ErrorRate   float64
	OpErrorRate map[Op]float64
	// LostAnswerRate is the probability, for every call that ErrorRate
	// spared, that it reaches the inner store and then fails with Err:
	// the store acted, and the answer was lost (a connection reset after
	// the request was served). Retrying such a call is what conditional
	// and non-idempotent requests must survive.
	LostAnswerRate float64
	// Err is the error that ErrorRate injects; nil means ErrTransient.
	Err error
	// Latency is added to every call, plus a uniformly random extra in
	// [0, Jitter).
	Latency time.Duration
	Jitter  time.Duration
	// Bandwidth caps each transfer (ReadAt, Put, StageBlock), in bytes
	// per second, one call at a time: a call moving n bytes takes an
	// extra n/Bandwidth seconds, however many run at once. That is how a
	// single HTTP stream to Azure behaves, and why parallel streams pay
	// off. 0 means unlimited.
	Bandwidth int64
}

// Faulty wraps a Store and injects errors, latency and a per-stream
// bandwidth cap, for tests and benchmarks. Faults come from two sources:
// random ones at the rates of FaultOptions, and programmed ones (FailNext,
// FailNextAfter) that hit the next calls of one operation and take
// precedence. Everything can be changed while calls are running.
//
// mu guards opts, rng and queue; sleeping and the inner call happen
// outside it.
type Faulty struct {
	inner Store

	mu    sync.Mutex
	opts  FaultOptions
	rng   *rand.Rand
	queue map[Op][]programmedFault

	// sleep waits for d or until ctx is done; tests replace it to observe
	// delays without waiting.
	sleep func(ctx context.Context, d time.Duration) error
}

// programmedFault fails the next n calls of an operation with err; after
// means the call reaches the inner store first and only its answer is
// lost, like a timeout after the service acted.
type programmedFault struct {
	n     int
	err   error
	after bool
}

var _ Store = (*Faulty)(nil)

// NewFaulty wraps inner.
func NewFaulty(inner Store, opts FaultOptions) *Faulty {
	f := &Faulty{inner: inner, queue: make(map[Op][]programmedFault), sleep: sleepContext}
	f.SetOptions(opts)
	return f
}

// Unwrap returns the inner store.
func (f *Faulty) Unwrap() Store { return f.inner }

// SetOptions replaces the options. A non-zero Seed restarts the random
// sequence from it. Programmed faults are kept.
func (f *Faulty) SetOptions(opts FaultOptions) {
	opts.OpErrorRate = maps.Clone(opts.OpErrorRate)
	f.mu.Lock()
	defer f.mu.Unlock()
	if opts.Seed != 0 || f.rng == nil {
		seed := opts.Seed
		if seed == 0 {
			seed = rand.Uint64()
		}
		f.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	}
	f.opts = opts
}

// Options returns the current options.
func (f *Faulty) Options() FaultOptions {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.opts
	o.OpErrorRate = maps.Clone(o.OpErrorRate)
	return o
}

// FailNext makes the next n calls of op fail with err without reaching the
// inner store. Calls queue up: FailNext(OpPut, 1, a) then FailNext(OpPut,
// 1, b) fails the next Put with a and the one after with b.
func (f *Faulty) FailNext(op Op, n int, err error) { f.program(op, n, err, false) }

// FailNextAfter makes the next n calls of op reach the inner store and then
// fail with err: the operation happened, but the caller is told it failed.
// This is the case that retries of non-idempotent requests must survive.
func (f *Faulty) FailNextAfter(op Op, n int, err error) { f.program(op, n, err, true) }

func (f *Faulty) program(op Op, n int, err error, after bool) {
	if n <= 0 {
		return
	}
	if err == nil {
		err = ErrTransient
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queue[op] = append(f.queue[op], programmedFault{n: n, err: err, after: after})
}

// ClearFaults drops the programmed faults not yet used.
func (f *Faulty) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.queue)
}

// plan decides the fate of one call: the fault to inject (if any, and
// whether after the inner call) and the delay before it.
func (f *Faulty) plan(op Op) (fault error, after bool, delay time.Duration, bandwidth int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if q := f.queue[op]; len(q) > 0 {
		fault, after = q[0].err, q[0].after
		if q[0].n--; q[0].n == 0 {
			f.queue[op] = q[1:]
		}
	} else {
		rate := f.opts.ErrorRate
		if r, ok := f.opts.OpErrorRate[op]; ok {
			rate = r
		}
		hit := false
		switch {
		case rate > 0 && f.rng.Float64() < rate:
			hit = true
		case f.opts.LostAnswerRate > 0 && f.rng.Float64() < f.opts.LostAnswerRate:
			hit, after = true, true
		}
		if hit {
			fault = f.opts.Err
			if fault == nil {
				fault = ErrTransient
			}
		}
	}
	delay = f.opts.Latency
	if f.opts.Jitter > 0 {
		delay += time.Duration(f.rng.Int64N(int64(f.opts.Jitter)))
	}
	return fault, after, delay, f.opts.Bandwidth
}

// transferTime is how long n bytes take at bandwidth bytes per second.
func transferTime(n int, bandwidth int64) time.Duration {
	if bandwidth <= 0 || n <= 0 {
		return 0
	}
	return time.Duration(float64(n) / float64(bandwidth) * float64(time.Second))
}

// call runs one operation through the fault plan. sent is the number of
// bytes the request uploads; do returns the number it downloaded.
func (f *Faulty) call(ctx context.Context, op Op, sent int, do func() (received int, err error)) error {
	fault, after, delay, bw := f.plan(op)
	if err := f.sleep(ctx, delay+transferTime(sent, bw)); err != nil {
		return err
	}
	if fault != nil && !after {
		return fmt.Errorf("faulty store: injected %s failure: %w", op, fault)
	}
	received, err := do()
	if err == nil || received > 0 {
		if serr := f.sleep(ctx, transferTime(received, bw)); serr != nil {
			return serr
		}
	}
	if fault != nil {
		return fmt.Errorf("faulty store: injected %s failure after the store acted: %w", op, fault)
	}
	return err
}

// Stat implements Store.
func (f *Faulty) Stat(ctx context.Context, name string) (a Attrs, err error) {
	err = f.call(ctx, OpStat, 0, func() (int, error) {
		a, err = f.inner.Stat(ctx, name)
		return 0, err
	})
	return a, err
}

// ReadAt implements Store.
func (f *Faulty) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (n int, err error) {
	var inner error
	err = f.call(ctx, OpReadAt, 0, func() (int, error) {
		n, inner = f.inner.ReadAt(ctx, name, p, off, etag)
		return n, inner
	})
	if err != nil && err != inner {
		return 0, err // an injected fault or cancellation: nothing read
	}
	return n, err
}

// List implements Store.
func (f *Faulty) List(ctx context.Context, opts ListOptions) (page ListPage, err error) {
	err = f.call(ctx, OpList, 0, func() (int, error) {
		page, err = f.inner.List(ctx, opts)
		return 0, err
	})
	return page, err
}

// Put implements Store.
func (f *Faulty) Put(ctx context.Context, name string, data []byte, opts PutOptions) (a Attrs, err error) {
	err = f.call(ctx, OpPut, len(data), func() (int, error) {
		a, err = f.inner.Put(ctx, name, data, opts)
		return 0, err
	})
	return a, err
}

// StageBlock implements Store.
func (f *Faulty) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	return f.call(ctx, OpStageBlock, len(data), func() (int, error) {
		return 0, f.inner.StageBlock(ctx, name, blockID, data)
	})
}

// CommitBlocks implements Store.
func (f *Faulty) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (a Attrs, err error) {
	err = f.call(ctx, OpCommitBlocks, 0, func() (int, error) {
		a, err = f.inner.CommitBlocks(ctx, name, blockIDs, opts)
		return 0, err
	})
	return a, err
}

// Delete implements Store.
func (f *Faulty) Delete(ctx context.Context, name string, cond Conditions) error {
	return f.call(ctx, OpDelete, 0, func() (int, error) {
		return 0, f.inner.Delete(ctx, name, cond)
	})
}

// Copy implements Store.
func (f *Faulty) Copy(ctx context.Context, dst, src string) (a Attrs, err error) {
	err = f.call(ctx, OpCopy, 0, func() (int, error) {
		a, err = f.inner.Copy(ctx, dst, src)
		return 0, err
	})
	return a, err
}

// SetMetadata implements Store.
func (f *Faulty) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (a Attrs, err error) {
	err = f.call(ctx, OpSetMetadata, 0, func() (int, error) {
		a, err = f.inner.SetMetadata(ctx, name, md, cond)
		return 0, err
	})
	return a, err
}

// Check implements Store.
func (f *Faulty) Check(ctx context.Context) error {
	return f.call(ctx, OpCheck, 0, func() (int, error) {
		return 0, f.inner.Check(ctx)
	})
}

// sleepContext waits for d, or until ctx is done and returns its error.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
