package storetest

import (
	"context"
	"sync"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// ConcurrencyStore is a store whose reads each take Delay, and which
// records how many ran at once at most (MaxConcurrent): for tests of how
// many fetches a reader keeps in flight.
type ConcurrencyStore struct {
	blobstore.Store
	Delay time.Duration

	mu          sync.Mutex
	inFlight    int
	maxInFlight int
}

func (s *ConcurrencyStore) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	s.mu.Lock()
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	time.Sleep(s.Delay) // the store's latency, not a wait for an event
	n, err := s.Store.ReadAt(ctx, name, p, off, etag)
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	return n, err
}

// MaxConcurrent is the most reads that ran at once.
func (s *ConcurrencyStore) MaxConcurrent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxInFlight
}
