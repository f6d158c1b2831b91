package blobstore

import (
	"context"
	"time"
)

// A Call describes one store request that has returned, for an observer
// (NewObserved): what was asked, what came back, how long it took.
type Call struct {
	Op   Op
	Name string // the blob; Copy's destination; "" for List and Check
	Src  string // Copy's source

	Off    int64 // ReadAt's offset
	Len    int   // bytes asked for (ReadAt) or sent (Put, StageBlock)
	Read   int   // bytes ReadAt returned
	Blocks int   // blocks committed (CommitBlocks)
	Keys   int   // metadata keys set (SetMetadata)
	Size   int64 // the blob's size, as Stat returned it

	Conditions Conditions  // Put, CommitBlocks, Delete, SetMetadata
	List       ListOptions // List's options
	Page       ListPage    // List's page

	Took time.Duration
	Err  error
}

// NewObserved wraps inner so that observe sees every call once it returns,
// in the caller's goroutine. The request's data and metadata values are
// not in the Call.
func NewObserved(inner Store, observe func(context.Context, *Call)) Store {
	return &observed{inner: inner, observe: observe}
}

// NewObservedFrom is NewObserved with a start hook too: start runs as each
// call begins (before it reaches inner), so that an observer can count the
// requests in flight.
func NewObservedFrom(inner Store, start func(context.Context, Op), observe func(context.Context, *Call)) Store {
	return &observed{inner: inner, start: start, observe: observe}
}

type observed struct {
	inner   Store
	start   func(context.Context, Op)
	observe func(context.Context, *Call)
}

var _ Store = (*observed)(nil)

// Unwrap returns the store o observes.
func (o *observed) Unwrap() Store { return o.inner }

// begin runs the start hook, if any, and returns the call's start time.
func (o *observed) begin(ctx context.Context, op Op) time.Time {
	if o.start != nil {
		o.start(ctx, op)
	}
	return time.Now()
}

func (o *observed) done(ctx context.Context, c *Call, start time.Time, err error) {
	c.Took, c.Err = time.Since(start), err
	o.observe(ctx, c)
}

func (o *observed) Stat(ctx context.Context, name string) (Attrs, error) {
	t := o.begin(ctx, OpStat)
	a, err := o.inner.Stat(ctx, name)
	o.done(ctx, &Call{Op: OpStat, Name: name, Size: a.Size}, t, err)
	return a, err
}

func (o *observed) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	t := o.begin(ctx, OpReadAt)
	n, err := o.inner.ReadAt(ctx, name, p, off, etag)
	o.done(ctx, &Call{Op: OpReadAt, Name: name, Off: off, Len: len(p), Read: n}, t, err)
	return n, err
}

func (o *observed) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	t := o.begin(ctx, OpList)
	page, err := o.inner.List(ctx, opts)
	o.done(ctx, &Call{Op: OpList, List: opts, Page: page}, t, err)
	return page, err
}

func (o *observed) Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error) {
	t := o.begin(ctx, OpPut)
	a, err := o.inner.Put(ctx, name, data, opts)
	o.done(ctx, &Call{Op: OpPut, Name: name, Len: len(data), Conditions: opts.Conditions}, t, err)
	return a, err
}

func (o *observed) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	t := o.begin(ctx, OpStageBlock)
	err := o.inner.StageBlock(ctx, name, blockID, data)
	o.done(ctx, &Call{Op: OpStageBlock, Name: name, Len: len(data)}, t, err)
	return err
}

func (o *observed) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error) {
	t := o.begin(ctx, OpCommitBlocks)
	a, err := o.inner.CommitBlocks(ctx, name, blockIDs, opts)
	o.done(ctx, &Call{Op: OpCommitBlocks, Name: name, Blocks: len(blockIDs), Conditions: opts.Conditions}, t, err)
	return a, err
}

func (o *observed) Delete(ctx context.Context, name string, cond Conditions) error {
	t := o.begin(ctx, OpDelete)
	err := o.inner.Delete(ctx, name, cond)
	o.done(ctx, &Call{Op: OpDelete, Name: name, Conditions: cond}, t, err)
	return err
}

func (o *observed) Copy(ctx context.Context, dst, src string) (Attrs, error) {
	t := o.begin(ctx, OpCopy)
	a, err := o.inner.Copy(ctx, dst, src)
	o.done(ctx, &Call{Op: OpCopy, Name: dst, Src: src}, t, err)
	return a, err
}

func (o *observed) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error) {
	t := o.begin(ctx, OpSetMetadata)
	a, err := o.inner.SetMetadata(ctx, name, md, cond)
	o.done(ctx, &Call{Op: OpSetMetadata, Name: name, Keys: len(md), Conditions: cond}, t, err)
	return a, err
}

func (o *observed) Check(ctx context.Context) error {
	t := o.begin(ctx, OpCheck)
	err := o.inner.Check(ctx)
	o.done(ctx, &Call{Op: OpCheck}, t, err)
	return err
}
