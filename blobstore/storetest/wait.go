package storetest

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails the test if it does not
// within 10 s: tests wait for the event they need, never for a fixed time.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !PollUntil(10*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// PollUntil polls cond every few milliseconds until it holds, or for at
// most limit; it tells whether cond held. For waits whose failure message
// says more than WaitFor's.
func PollUntil(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
