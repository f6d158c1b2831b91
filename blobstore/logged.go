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
	return NewObserved(inner, func(ctx context.Context, c *Call) {
		log.DebugContext(ctx, "store "+string(c.Op), callAttrs(c)...)
	})
}

// callAttrs are the log attributes of c: those of its operation, then the
// time taken and any error but end of file.
func callAttrs(c *Call) []any {
	var a []any
	switch c.Op {
	case OpStat:
		a = []any{"name", c.Name, "size", c.Size}
	case OpReadAt:
		a = []any{"name", c.Name, "off", c.Off, "len", c.Len, "read", c.Read}
	case OpList:
		a = []any{"prefix", c.List.Prefix, "delimiter", c.List.Delimiter, "max", c.List.MaxResults,
			"continued", c.List.Marker != "", "blobs", len(c.Page.Blobs), "prefixes", len(c.Page.Prefixes), "more", c.Page.NextMarker != ""}
	case OpPut:
		a = []any{"name", c.Name, "len", c.Len, "if_match", c.Conditions.IfMatch != "", "if_none_match", c.Conditions.IfNoneMatch}
	case OpStageBlock:
		a = []any{"name", c.Name, "len", c.Len}
	case OpCommitBlocks:
		a = []any{"name", c.Name, "blocks", c.Blocks, "if_match", c.Conditions.IfMatch != "", "if_none_match", c.Conditions.IfNoneMatch}
	case OpDelete:
		a = []any{"name", c.Name, "if_match", c.Conditions.IfMatch != ""}
	case OpCopy:
		a = []any{"dst", c.Name, "src", c.Src}
	case OpSetMetadata:
		a = []any{"name", c.Name, "keys", c.Keys}
	}
	a = append(a, "took", c.Took.Round(time.Microsecond))
	if c.Err != nil && !errors.Is(c.Err, io.EOF) {
		a = append(a, "err", c.Err)
	}
	return a
}
