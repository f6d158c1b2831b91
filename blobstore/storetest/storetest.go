// Package storetest runs one test body against every blobstore backend, so
// that tests of blobstore and of the packages above it (the filesystem)
// check behaviour, not one implementation:
//
//	func TestRename(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, s blobstore.Store) {
//			// ... same assertions for every backend
//		})
//	}
//
// The backends are "memory" (blobstore.NewMemory), "local" (blobstore.NewLocal
// over t.TempDir()), "faulty" (memory behind fault injection that delays
// every request and fails some with transient errors, behind the retrying
// wrapper: what callers see of a flaky network), and "azurite" (the real
// Azure SDK against the Azurite emulator; skipped unless BLOBFS_TEST_AZURITE
// is set, see Azurite). Every backend gives each test a fresh, empty store.
package storetest

import (
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// Backend is one kind of store for tests.
type Backend struct {
	Name string
	// New returns a fresh, empty store, cleaned up when t ends. It skips
	// t when the backend is not available.
	New func(t testing.TB) blobstore.Store
}

// Backends returns every backend, in the order Run runs them.
func Backends() []Backend {
	return []Backend{
		{Name: "memory", New: Memory},
		{Name: "local", New: Local},
		{Name: "faulty", New: Faulty},
		{Name: "azurite", New: Azurite},
	}
}

// Run runs body as one subtest per backend, each with a fresh store. body
// may call t.Parallel.
func Run(t *testing.T, body func(t *testing.T, s blobstore.Store)) {
	t.Helper()
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) {
			body(t, b.New(t))
		})
	}
}

// Memory returns a fresh in-memory store.
func Memory(t testing.TB) blobstore.Store {
	return blobstore.NewMemory()
}

// Local returns a local store over a fresh t.TempDir().
func Local(t testing.TB) blobstore.Store {
	t.Helper()
	s, err := blobstore.NewLocal(t.TempDir())
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	return s
}

// faultyOptions are the faults of the "faulty" backend: a little latency
// on every request and a transient failure on about one request in fifty,
// before it reaches the store (so that retrying it is always correct).
// The seed is fixed so that a sequential test sees the same faults on
// every run.
var faultyOptions = blobstore.FaultOptions{
	Seed:      20240601,
	ErrorRate: 0.02,
	Latency:   20 * time.Microsecond,
	Jitter:    200 * time.Microsecond,
}

// faultyRetries retry quickly and often enough that a test never sees an
// injected failure (0.02^8 per call), with a budget that two percent of
// failures cannot exhaust.
var faultyRetries = blobstore.RetryPolicy{
	MaxAttempts: 8,
	BaseDelay:   100 * time.Microsecond,
	MaxDelay:    time.Millisecond,
}

// Faulty returns a fresh in-memory store behind fault injection and
// retries; see the package documentation.
func Faulty(t testing.TB) blobstore.Store {
	return blobstore.NewRetrying(blobstore.NewFaulty(blobstore.NewMemory(), faultyOptions), faultyRetries)
}
