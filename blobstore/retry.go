package blobstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// RetryPolicy configures NewRetrying. The zero value means the defaults
// documented on each field.
type RetryPolicy struct {
	// MaxAttempts bounds the tries of one call, the first included.
	// 0 means 5; 1 turns retrying off.
	MaxAttempts int
	// BaseDelay is the nominal wait before the first retry; it doubles
	// with every further retry, up to MaxDelay. The actual wait is
	// uniformly random between half the nominal one and all of it
	// ("equal jitter"): never so short that a throttled service sees
	// the same burst again, and spread so that clients that failed
	// together do not retry together. 0 means 200ms.
	BaseDelay time.Duration
	// MaxDelay caps one wait, including one that the error asks for (a
	// Retry-After). 0 means 5s.
	MaxDelay time.Duration
	// Budget is the retry budget shared by all calls through the store,
	// in retries: each retry spends one token, each call that ends
	// without a retryable error gives back RefillPerSuccess, up to
	// Budget. When the budget is spent, calls get one try only until
	// successes have refilled it, so a dead or overloaded backend sees
	// roughly the traffic it would without retries instead of a
	// multiple of it. 0 means 50.
	Budget float64
	// RefillPerSuccess is the tokens one successful call returns to the
	// budget; 0 means 0.1, so that retries stay below about 10% of the
	// traffic in the long run.
	RefillPerSuccess float64
}

// RetryAfterer is implemented by errors that know how long the service
// asked the client to wait (HTTP Retry-After). Backends may wrap such an
// error; NewRetrying waits at least that long, up to MaxDelay.
type RetryAfterer interface {
	RetryAfter() time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 5
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = 200 * time.Millisecond
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 5 * time.Second
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	if p.Budget <= 0 {
		p.Budget = 50
	}
	if p.RefillPerSuccess <= 0 {
		p.RefillPerSuccess = 0.1
	}
	return p
}

// retrying retries calls of an inner Store that fail with a Retryable
// error, with exponential backoff and jitter, bounded per call
// (MaxAttempts) and across calls (the token budget). mu guards tokens.
//
// Retrying a write is safe in this interface because every write replaces
// a whole blob or a whole block; the hazard is a conditional write whose
// first try succeeded but whose answer was lost: its retry fails with
// ErrAlreadyExists or ErrPreconditionFailed although the write happened;
// likewise a retried Delete can fail with ErrNotFound. Callers that use
// conditions must be ready for that (compare ETags or content before
// reporting a conflict). The Azure SDK's own retries have the same hazard.
type retrying struct {
	inner  Store
	policy RetryPolicy

	mu     sync.Mutex
	tokens float64
	// spentAt is when the budget last ran out, zero while it holds a
	// token; failedFast counts the calls that found it empty since.
	// Both guarded by mu, for the error that says so.
	spentAt    time.Time
	failedFast int

	// Replaced by tests: sleep waits or fails with ctx's error; jitter
	// returns a random duration in [0, n).
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(n time.Duration) time.Duration
}

// NewRetrying wraps inner so that calls failing with ErrThrottled or
// ErrTransient are retried according to policy. It honours ctx while
// waiting: a cancelled call returns at once with ctx's error.
func NewRetrying(inner Store, policy RetryPolicy) Store {
	p := policy.withDefaults()
	return &retrying{
		inner:  inner,
		policy: p,
		tokens: p.Budget,
		sleep:  sleepContext,
		jitter: func(n time.Duration) time.Duration { return rand.N(n) },
	}
}

// Unwrap returns the store r retries on.
func (r *retrying) Unwrap() Store { return r.inner }

// spend takes one retry token if there is one. When there is none, it
// says why in a sentence for the caller's error.
func (r *retrying) spend() (ok bool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tokens >= 1 {
		if r.tokens--; r.tokens < 1 {
			r.spentAt = time.Now()
		}
		return true, ""
	}
	r.failedFast++
	return false, fmt.Sprintf("not retried: retry budget exhausted %v ago, the store failing more retries than its answers pay for "+
		"(%g at most, one back per %g answers); until requests succeed again each is tried once: %d failed so",
		time.Since(r.spentAt).Round(time.Second), r.policy.Budget, 1/r.policy.RefillPerSuccess, r.failedFast)
}

func (r *retrying) refill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tokens = min(r.policy.Budget, r.tokens+r.policy.RefillPerSuccess)
	if r.tokens >= 1 {
		r.spentAt, r.failedFast = time.Time{}, 0
	}
}

// backoff returns the wait before retry number n (1 for the first retry).
func (r *retrying) backoff(n int, err error) time.Duration {
	nominal := r.policy.MaxDelay
	if n <= 30 {
		nominal = min(r.policy.MaxDelay, r.policy.BaseDelay<<(n-1))
	}
	d := nominal/2 + r.jitter(nominal/2+1)
	var ra RetryAfterer
	if errors.As(err, &ra) {
		d = max(d, ra.RetryAfter())
	}
	return min(d, r.policy.MaxDelay)
}

// do runs one call with retries.
func (r *retrying) do(ctx context.Context, call func() error) error {
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil || !Retryable(err) {
			r.refill()
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		if attempt >= r.policy.MaxAttempts {
			if attempt == 1 {
				return err
			}
			return fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		if ok, why := r.spend(); !ok {
			return fmt.Errorf("%w (%s)", err, why)
		}
		if serr := r.sleep(ctx, r.backoff(attempt, err)); serr != nil {
			return fmt.Errorf("%w (while waiting to retry after: %v)", serr, err)
		}
	}
}

func (r *retrying) Stat(ctx context.Context, name string) (a Attrs, err error) {
	err = r.do(ctx, func() error {
		a, err = r.inner.Stat(ctx, name)
		return err
	})
	return a, err
}

func (r *retrying) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (n int, err error) {
	err = r.do(ctx, func() error {
		n, err = r.inner.ReadAt(ctx, name, p, off, etag)
		return err
	})
	return n, err
}

func (r *retrying) List(ctx context.Context, opts ListOptions) (page ListPage, err error) {
	err = r.do(ctx, func() error {
		page, err = r.inner.List(ctx, opts)
		return err
	})
	return page, err
}

func (r *retrying) Put(ctx context.Context, name string, data []byte, opts PutOptions) (a Attrs, err error) {
	err = r.do(ctx, func() error {
		a, err = r.inner.Put(ctx, name, data, opts)
		return err
	})
	return a, err
}

func (r *retrying) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	return r.do(ctx, func() error {
		return r.inner.StageBlock(ctx, name, blockID, data)
	})
}

func (r *retrying) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (a Attrs, err error) {
	err = r.do(ctx, func() error {
		a, err = r.inner.CommitBlocks(ctx, name, blockIDs, opts)
		return err
	})
	return a, err
}

func (r *retrying) Delete(ctx context.Context, name string, cond Conditions) error {
	return r.do(ctx, func() error {
		return r.inner.Delete(ctx, name, cond)
	})
}

func (r *retrying) Copy(ctx context.Context, dst, src string) (a Attrs, err error) {
	err = r.do(ctx, func() error {
		a, err = r.inner.Copy(ctx, dst, src)
		return err
	})
	return a, err
}

func (r *retrying) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (a Attrs, err error) {
	err = r.do(ctx, func() error {
		a, err = r.inner.SetMetadata(ctx, name, md, cond)
		return err
	})
	return a, err
}

func (r *retrying) Check(ctx context.Context) error {
	return r.do(ctx, func() error {
		return r.inner.Check(ctx)
	})
}
