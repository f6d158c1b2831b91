package fusefs

import (
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// TestAuthFailuresWarnOnce: when the store refuses the credentials (an
// expired SAS), every lookup fails with EACCES, but the log says so at
// WARN once per interval, not once per request: the others go to DEBUG,
// and the next WARN counts them.
func TestAuthFailuresWarnOnce(t *testing.T) {
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	opts := conflictMountOptions // no caches: every stat asks the store
	log, logged := capturingLogger(t)
	opts.Logger = log
	mnt, fsys := mountStore(t, faulty, opts)
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	st := fsys.log.Handler().(*authWarnLimiter).st
	st.mu.Lock()
	st.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	st.mu.Unlock()

	faulty.SetOptions(blobstore.FaultOptions{ErrorRate: 1, Err: blobstore.ErrUnauthorized})
	defer faulty.SetOptions(blobstore.FaultOptions{})
	const n = 20
	for i := range n {
		_, err := os.Stat(join(mnt, "f"+string(rune('a'+i))))
		if !errors.Is(err, syscall.EACCES) {
			t.Fatalf("stat with refused credentials: %v, want EACCES", err)
		}
	}
	warns := func() []string {
		var w []string
		for _, l := range strings.Split(logged.String(), "\n") {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, blobstore.ErrUnauthorized.Error()) {
				w = append(w, l)
			}
		}
		return w
	}
	if w := warns(); len(w) != 1 {
		t.Fatalf("%d refused lookups logged %d WARN lines, want 1:\n%s", n, len(w), strings.Join(w, "\n"))
	}
	if d := strings.Count(logged.String(), "level=DEBUG msg=\"lookup failed\""); d < n-1 {
		t.Errorf("the refusals held back from WARN: %d at DEBUG, want %d", d, n-1)
	}

	mu.Lock()
	now = now.Add(authWarnEvery)
	mu.Unlock()
	if _, err := os.Stat(join(mnt, "later")); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("stat with refused credentials: %v, want EACCES", err)
	}
	w := warns()
	if len(w) != 2 || !strings.Contains(w[1], "refused_since_last_warning=") {
		t.Fatalf("after the interval: want a second WARN counting those held back:\n%s", strings.Join(w, "\n"))
	}
}
