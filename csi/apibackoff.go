package csi

import (
	"sync"
	"time"
)

// apiBackoff spaces out the API lookups that get an unhealthy volume's
// credentials again (its PersistentVolume, the Secret it names). The
// health check retries a volume it could not repair every interval; what
// failed at one interval (no nodeStageSecretRef, a Secret without the
// keys, an API server that refuses) mostly fails at the next, and each
// try costs the API server a PersistentVolume lookup. So after a failure
// a volume's next lookup waits first, then twice as long after each
// failure after it, up to limit; until then the health check gets the last error
// back. A volume that is healthy again, or whose credentials kubelet
// gives, starts over (reset). Bounded by the volumes of the node: an
// entry lives only while its volume is unhealthy. Safe for concurrent
// use.
type apiBackoff struct {
	first, limit time.Duration
	now          func() time.Time // time.Now; tests step it

	mu    sync.Mutex
	state map[string]backoffState // volume id -> its last failed lookup
}

type backoffState struct {
	next  time.Time     // no lookup before
	delay time.Duration // the wait after the next failure: twice this
	err   error         // what the last lookup returned
}

func newAPIBackoff(first, limit time.Duration) *apiBackoff {
	return &apiBackoff{first: first, limit: max(first, limit), now: time.Now, state: map[string]backoffState{}}
}

// wait returns the error of the volume's last lookup while its next one
// must wait, or nil when a lookup may go ahead.
func (b *apiBackoff) wait(volumeID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.state[volumeID]
	if !ok || !b.now().Before(s.next) {
		return nil
	}
	return s.err
}

// failed records a failed lookup and when the next may be.
func (b *apiBackoff) failed(volumeID string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.state[volumeID]
	delay := b.first
	if ok {
		delay = min(2*s.delay, b.limit)
	}
	b.state[volumeID] = backoffState{next: b.now().Add(delay), delay: delay, err: err}
}

// reset forgets the volume's failures.
func (b *apiBackoff) reset(volumeID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.state, volumeID)
}
