package bench

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCompareSideHooks: a side's prepare runs before each repetition and
// its check after each one that succeeded; a failed prepare or run of an
// optional side drops that side and skips its check, and blobfs's failed
// check fails the comparison.
func TestCompareSideHooks(t *testing.T) {
	newRunner := func() *runner {
		return &runner{cfg: Config{Reps: 3, Log: io.Discard}, report: &Report{}}
	}
	value := func(time.Duration) string { return "" }
	baseline := []strategy{{name: "base", run: func(context.Context) error { return nil }}}
	var events []string
	record := func(e string) { events = append(events, e) }
	hooked := func(name string, optional bool, prepareErr, runErr error) side {
		return side{
			name: name, optional: optional,
			prepare: func() error { record(name + " prepare"); return prepareErr },
			run: func(context.Context) (time.Duration, error) {
				record(name + " run")
				return time.Millisecond, runErr
			},
			check: func(context.Context) error { record(name + " check"); return nil },
		}
	}
	out, err := newRunner().compare(context.Background(), "test", "base", value, baseline, []side{
		hooked("blobfs", false, nil, nil),
		hooked("no-prepare", true, errors.New("cannot prepare"), nil),
		hooked("no-run", true, nil, errors.New("cannot run")),
	})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(events, ", ")
	want := "blobfs prepare, blobfs run, blobfs check, no-prepare prepare, no-run prepare, no-run run, " +
		"blobfs prepare, blobfs run, blobfs check, " +
		"blobfs prepare, blobfs run, blobfs check"
	if got != want {
		t.Errorf("hooks ran as\n\t%s\nwant\n\t%s", got, want)
	}
	if _, ok := out.times["blobfs"]; !ok || len(out.times) != 1 {
		t.Errorf("times %v: want blobfs's alone", out.times)
	}

	failing := hooked("blobfs", false, nil, nil)
	failing.check = func(context.Context) error { return errors.New("read back: differs") }
	if _, err := newRunner().compare(context.Background(), "test", "base", value, baseline, []side{failing}); err == nil || !strings.Contains(err.Error(), "read back: differs") {
		t.Errorf("blobfs's failed check: %v; want the comparison to fail with it", err)
	}
}
