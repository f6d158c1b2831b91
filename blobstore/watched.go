package blobstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"
)

// The store-request watchdog: a hung store must show in the log and in the
// metrics, not only as applications that wait.
//
// Every call through a Watched store is in a set of calls in flight, with
// its start time, operation and blob, from its start to its return. A call
// still running after WatchOptions.Threshold is logged at WARN, again every
// Interval while it lasts, and at INFO with its total time when it ends;
// Oldest reports the age of the oldest call in flight, for a gauge. No
// goroutine runs: each call arms one runtime timer, stopped when it
// returns, so a fast call costs a map insert and a timer. mu guards calls
// and every call's warned count.

// DefaultSlowThreshold is WatchOptions.Threshold's default.
const DefaultSlowThreshold = 30 * time.Second

// WatchOptions configure NewWatched. The zero value means the defaults.
type WatchOptions struct {
	// Log receives the lines about slow calls; nil logs nothing (Oldest
	// still works).
	Log *slog.Logger
	// Threshold is how long a call may run before it is logged at WARN;
	// 0 means DefaultSlowThreshold.
	Threshold time.Duration
	// Interval is how often a call that goes on is logged again after
	// that; 0 means Threshold.
	Interval time.Duration
}

// Watched is a Store that watches its calls in flight (see NewWatched).
type Watched struct {
	inner Store
	opts  WatchOptions

	mu    sync.Mutex
	calls map[*watchedCall]struct{}
}

// watchedCall is one call in flight.
type watchedCall struct {
	op     Op
	name   string
	start  time.Time
	timer  *time.Timer
	warned int  // WARN lines logged for it; guarded by Watched.mu
	done   bool // it returned; guarded by Watched.mu
}

var _ Store = (*Watched)(nil)

// NewWatched wraps inner so that calls running longer than
// opts.Threshold are logged, and the age of the oldest call in flight is
// known (Oldest). Put it under the retry layer: each try is one call, and
// a try is what hangs.
func NewWatched(inner Store, opts WatchOptions) *Watched {
	if opts.Threshold <= 0 {
		opts.Threshold = DefaultSlowThreshold
	}
	if opts.Interval <= 0 {
		opts.Interval = opts.Threshold
	}
	return &Watched{inner: inner, opts: opts, calls: map[*watchedCall]struct{}{}}
}

// Unwrap returns the store w watches.
func (w *Watched) Unwrap() Store { return w.inner }

// Oldest returns how long the oldest call in flight has been running, 0
// when none is.
func (w *Watched) Oldest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var oldest time.Time
	for c := range w.calls {
		if oldest.IsZero() || c.start.Before(oldest) {
			oldest = c.start
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

func (w *Watched) begin(op Op, name string) *watchedCall {
	c := &watchedCall{op: op, name: name, start: time.Now()}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls[c] = struct{}{}
	if w.opts.Log != nil {
		c.timer = time.AfterFunc(w.opts.Threshold, func() { w.warn(c) })
	}
	return c
}

// warn logs c as still running and arms its next warning.
func (w *Watched) warn(c *watchedCall) {
	w.mu.Lock()
	if c.done {
		w.mu.Unlock()
		return
	}
	c.warned++
	c.timer.Reset(w.opts.Interval)
	w.mu.Unlock()
	w.opts.Log.Warn("store request still running: the store is slow or does not answer",
		"op", string(c.op), "name", c.name, "elapsed", time.Since(c.start).Round(time.Millisecond))
}

func (w *Watched) end(c *watchedCall, err error) {
	w.mu.Lock()
	c.done = true
	delete(w.calls, c)
	warned := c.warned
	w.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	if warned == 0 {
		return
	}
	a := []any{"op", string(c.op), "name", c.name, "took", time.Since(c.start).Round(time.Millisecond)}
	if err != nil && !errors.Is(err, io.EOF) {
		a = append(a, "err", err)
	}
	w.opts.Log.Info("slow store request ended", a...)
}

func (w *Watched) Stat(ctx context.Context, name string) (a Attrs, err error) {
	c := w.begin(OpStat, name)
	defer func() { w.end(c, err) }()
	return w.inner.Stat(ctx, name)
}

func (w *Watched) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (n int, err error) {
	c := w.begin(OpReadAt, name)
	defer func() { w.end(c, err) }()
	return w.inner.ReadAt(ctx, name, p, off, etag)
}

func (w *Watched) List(ctx context.Context, opts ListOptions) (page ListPage, err error) {
	c := w.begin(OpList, opts.Prefix)
	defer func() { w.end(c, err) }()
	return w.inner.List(ctx, opts)
}

func (w *Watched) Put(ctx context.Context, name string, data []byte, opts PutOptions) (a Attrs, err error) {
	c := w.begin(OpPut, name)
	defer func() { w.end(c, err) }()
	return w.inner.Put(ctx, name, data, opts)
}

func (w *Watched) StageBlock(ctx context.Context, name, blockID string, data []byte) (err error) {
	c := w.begin(OpStageBlock, name)
	defer func() { w.end(c, err) }()
	return w.inner.StageBlock(ctx, name, blockID, data)
}

func (w *Watched) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (a Attrs, err error) {
	c := w.begin(OpCommitBlocks, name)
	defer func() { w.end(c, err) }()
	return w.inner.CommitBlocks(ctx, name, blockIDs, opts)
}

func (w *Watched) Delete(ctx context.Context, name string, cond Conditions) (err error) {
	c := w.begin(OpDelete, name)
	defer func() { w.end(c, err) }()
	return w.inner.Delete(ctx, name, cond)
}

func (w *Watched) Copy(ctx context.Context, dst, src string) (a Attrs, err error) {
	c := w.begin(OpCopy, src+" -> "+dst)
	defer func() { w.end(c, err) }()
	return w.inner.Copy(ctx, dst, src)
}

func (w *Watched) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (a Attrs, err error) {
	c := w.begin(OpSetMetadata, name)
	defer func() { w.end(c, err) }()
	return w.inner.SetMetadata(ctx, name, md, cond)
}

func (w *Watched) Check(ctx context.Context) (err error) {
	c := w.begin(OpCheck, "")
	defer func() { w.end(c, err) }()
	return w.inner.Check(ctx)
}
