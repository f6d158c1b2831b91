package blobstore

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"
)

// NewLogged wraps inner so that every call is logged at debug level once it
// returns: the operation, the blob (or the listing's prefix), what it moved,
// how long it took and its error. It answers "which requests did that cost,
// and which one was slow" for a mount run with --log-level debug. Below
// debug level it returns inner itself, so that it costs nothing.
//
// Put it under the retry layer (NewRetrying(NewLogged(s, log), ...)) to see
// every attempt. Nothing logged carries data, metadata values or
// credentials.
func NewLogged(inner Store, log *slog.Logger) Store {
	if log == nil || !log.Enabled(context.Background(), slog.LevelDebug) {
		return inner
	}
	return &logged{inner: inner, log: log}
}

type logged struct {
	inner Store
	log   *slog.Logger
}

var _ Store = (*logged)(nil)

func (l *logged) done(ctx context.Context, op Op, start time.Time, err error, attrs ...any) {
	attrs = append(attrs, "took", time.Since(start).Round(time.Microsecond))
	if err != nil && !errors.Is(err, io.EOF) {
		attrs = append(attrs, "err", err)
	}
	l.log.DebugContext(ctx, "store "+string(op), attrs...)
}

func (l *logged) Stat(ctx context.Context, name string) (Attrs, error) {
	t := time.Now()
	a, err := l.inner.Stat(ctx, name)
	l.done(ctx, OpStat, t, err, "name", name, "size", a.Size)
	return a, err
}

func (l *logged) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	t := time.Now()
	n, err := l.inner.ReadAt(ctx, name, p, off, etag)
	l.done(ctx, OpReadAt, t, err, "name", name, "off", off, "len", len(p), "read", n)
	return n, err
}

func (l *logged) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	t := time.Now()
	page, err := l.inner.List(ctx, opts)
	l.done(ctx, OpList, t, err, "prefix", opts.Prefix, "delimiter", opts.Delimiter, "max", opts.MaxResults,
		"continued", opts.Marker != "", "blobs", len(page.Blobs), "prefixes", len(page.Prefixes), "more", page.NextMarker != "")
	return page, err
}

func (l *logged) Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error) {
	t := time.Now()
	a, err := l.inner.Put(ctx, name, data, opts)
	l.done(ctx, OpPut, t, err, "name", name, "len", len(data), "if_match", opts.IfMatch != "", "if_none_match", opts.IfNoneMatch)
	return a, err
}

func (l *logged) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	t := time.Now()
	err := l.inner.StageBlock(ctx, name, blockID, data)
	l.done(ctx, OpStageBlock, t, err, "name", name, "len", len(data))
	return err
}

func (l *logged) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error) {
	t := time.Now()
	a, err := l.inner.CommitBlocks(ctx, name, blockIDs, opts)
	l.done(ctx, OpCommitBlocks, t, err, "name", name, "blocks", len(blockIDs), "if_match", opts.IfMatch != "", "if_none_match", opts.IfNoneMatch)
	return a, err
}

func (l *logged) Delete(ctx context.Context, name string, cond Conditions) error {
	t := time.Now()
	err := l.inner.Delete(ctx, name, cond)
	l.done(ctx, OpDelete, t, err, "name", name, "if_match", cond.IfMatch != "")
	return err
}

func (l *logged) Copy(ctx context.Context, dst, src string) (Attrs, error) {
	t := time.Now()
	a, err := l.inner.Copy(ctx, dst, src)
	l.done(ctx, OpCopy, t, err, "dst", dst, "src", src)
	return a, err
}

func (l *logged) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error) {
	t := time.Now()
	a, err := l.inner.SetMetadata(ctx, name, md, cond)
	l.done(ctx, OpSetMetadata, t, err, "name", name, "keys", len(md))
	return a, err
}

func (l *logged) Check(ctx context.Context) error {
	t := time.Now()
	err := l.inner.Check(ctx)
	l.done(ctx, OpCheck, t, err)
	return err
}
