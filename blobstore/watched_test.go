package blobstore_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWatchedWarnsWhileCallHangs: a call that hangs in the store is logged
// at WARN while it hangs (op, blob, elapsed), again after each interval,
// and at INFO with its total time when it ends; Oldest is its age meanwhile
// and 0 after. A fast call logs nothing.
func TestWatchedWarnsWhileCallHangs(t *testing.T) {
	mem := blobstore.NewMemory()
	if _, err := mem.Put(t.Context(), "dir/stuck", []byte("data"), blobstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	faulty := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	var out storetest.LogBuffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	w := blobstore.NewWatched(faulty, blobstore.WatchOptions{Log: log, Threshold: 50 * time.Millisecond, Interval: 50 * time.Millisecond})

	if _, err := w.Stat(t.Context(), "dir/stuck"); err != nil {
		t.Fatal(err)
	}
	if w.Oldest() != 0 || out.String() != "" {
		t.Fatalf("a fast call: oldest %v, log %q", w.Oldest(), out.String())
	}

	faulty.SetOptions(blobstore.FaultOptions{Latency: time.Hour}) // the store freezes
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := w.ReadAt(ctx, "dir/stuck", make([]byte, 4), 0, "")
		done <- err
	}()
	waitFor(t, "a second WARN about the hung read", func() bool {
		return strings.Count(out.String(), "level=WARN") >= 2
	})
	if got := out.String(); !strings.Contains(got, `msg="store request still running: the store is slow or does not answer" op=ReadAt name=dir/stuck elapsed=`) {
		t.Fatalf("the WARN does not name the call:\n%s", got)
	}
	if d := w.Oldest(); d < 100*time.Millisecond {
		t.Fatalf("Oldest during the hang: %v, want at least two thresholds", d)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the hung read ended with %v", err)
	}
	if d := w.Oldest(); d != 0 {
		t.Fatalf("Oldest after the call ended: %v", d)
	}
	if got := out.String(); !strings.Contains(got, `level=INFO msg="slow store request ended" op=ReadAt name=dir/stuck took=`) {
		t.Fatalf("no INFO line when the slow call ended:\n%s", got)
	}
}
