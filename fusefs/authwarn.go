package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// authWarnEvery is how often a mount warns of the store refusing its
// credentials.
const authWarnEvery = 10 * time.Second

// authWarnLimiter is the slog.Handler of a mount's log. Credentials the
// store refuses (an expired SAS token, a revoked key) fail every request,
// and each failed lookup, read or listing would log its own WARN, several
// a second: the same news, drowning everything else. It lets one such
// WARN (a record whose error is ErrUnauthorized) through every
// authWarnEvery, with the count of those held back since, and passes the
// others on at DEBUG. Other records pass unchanged. The state is shared by
// the handlers derived from it (WithAttrs, WithGroup); mu guards it.
type authWarnLimiter struct {
	inner slog.Handler
	st    *authWarnState
}

type authWarnState struct {
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	last   time.Time // of the last WARN let through
	held   int       // WARNs held back since
	warned bool      // one was let through
}

func newAuthWarnLimiter(inner slog.Handler) *authWarnLimiter {
	return &authWarnLimiter{inner: inner, st: &authWarnState{every: authWarnEvery, now: time.Now}}
}

func (h *authWarnLimiter) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *authWarnLimiter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level != slog.LevelWarn || !refusedCredentials(r) {
		return h.inner.Handle(ctx, r)
	}
	st := h.st
	st.mu.Lock()
	now := st.now()
	if st.warned && now.Sub(st.last) < st.every {
		st.held++
		st.mu.Unlock()
		if !h.inner.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
		return h.inner.Handle(ctx, r)
	}
	held := st.held
	st.last, st.held, st.warned = now, 0, true
	st.mu.Unlock()
	if held > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("refused_since_last_warning", held))
	}
	return h.inner.Handle(ctx, r)
}

func (h *authWarnLimiter) WithAttrs(as []slog.Attr) slog.Handler {
	return &authWarnLimiter{inner: h.inner.WithAttrs(as), st: h.st}
}

func (h *authWarnLimiter) WithGroup(name string) slog.Handler {
	return &authWarnLimiter{inner: h.inner.WithGroup(name), st: h.st}
}

// refusedCredentials tells whether r carries an error of the store
// refusing the credentials.
func refusedCredentials(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, blobstore.ErrUnauthorized) {
			found = true
		}
		return !found
	})
	return found
}
