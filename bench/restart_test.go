package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// The restart benchmark's applications, and memory-mounts' serving
	// process, are this test binary, started again.
	RestartAppMain()
	spinOffMainChild()
	if child, err := ServeMountsChild(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "serving mounts:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRestartQuickAzurite runs the restart benchmark in quick mode (1 and
// 10 mounts, 2 repetitions) with real keeper and driver processes on the
// Azurite named by $BLOBFS_TEST_AZURITE. It checks what any run must show,
// whatever the machine: every mount adopted after every SIGKILL and every
// handoff, reads through every mount after each (the probe checks their
// content), the streaming reader unharmed, and finite times.
func TestRestartQuickAzurite(t *testing.T) {
	if testing.Short() {
		t.Skip("the restart benchmark runs real driver processes: not in -short")
	}
	endpoint, key := azuriteForHarness(t, "the restart benchmark")
	cfg := QuickRestartConfig()
	cfg.Endpoint = endpoint
	if key != "" {
		cfg.Key = key
	}
	cfg.StreamSize = 4 * MiB
	cfg.BlobfsBin = buildBlobfs(t)
	cfg.WorkDir = t.TempDir()
	if testing.Verbose() {
		cfg.Log = testLog{t}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep, err := RunRestart(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := logReport(t, rep)
	if len(rep.Rows) != len(cfg.Mounts) {
		t.Fatalf("%d rows for mount counts %v", len(rep.Rows), cfg.Mounts)
	}
	for i, row := range rep.Rows {
		if row.Mounts != cfg.Mounts[i] {
			t.Errorf("row %d is for %d mounts, want %d", i, row.Mounts, cfg.Mounts[i])
		}
		for _, series := range []struct {
			name    string
			adopted []int
		}{{"after SIGKILL", row.KillAdopted}, {"after handoff", row.HandoffAdopted}} {
			if len(series.adopted) != cfg.Reps {
				t.Errorf("%d mounts: %d measurements %s, want %d", row.Mounts, len(series.adopted), series.name, cfg.Reps)
			}
			for rep, n := range series.adopted {
				if n != row.Mounts {
					t.Errorf("%d mounts, repetition %d: %d mounts adopted %s", row.Mounts, rep+1, n, series.name)
				}
			}
		}
		for _, series := range []struct {
			name string
			ds   []time.Duration
		}{
			{"fresh driver to every mount read", row.FreshRead},
			{"restarted driver to ready", row.KillReady},
			{"restarted driver to every mount read", row.KillRead},
			{"reader stall per SIGKILL", row.KillStall},
			{"new driver to ready in a handoff", row.HandoffReady},
			{"reader stall per handoff", row.HandoffStall},
		} {
			if len(series.ds) != cfg.Reps {
				t.Errorf("%d mounts, %s: %d measurements, want %d", row.Mounts, series.name, len(series.ds), cfg.Reps)
			}
			for _, d := range series.ds {
				if d <= 0 || d > driverReadyTimeout {
					t.Errorf("%d mounts, %s: %v, want a time between 0 and %v", row.Mounts, series.name, d, driverReadyTimeout)
				}
			}
		}
		if !strings.Contains(table, fmt.Sprintf("\n| %d | ", row.Mounts)) {
			t.Errorf("%d mounts: no line in the table", row.Mounts)
		}
	}
}

func TestStreamerStall(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	s := &streamer{ops: []readOp{
		{at(0), at(2)},
		{at(4), at(300)}, // in progress across [100, 200]
		{at(301), at(303)},
		{at(500), at(900)},
	}}
	for _, tc := range []struct {
		from, to int
		want     time.Duration
		ok       bool
	}{
		{100, 200, 296 * time.Millisecond, true},
		{0, 1000, 400 * time.Millisecond, true},
		{301, 302, 2 * time.Millisecond, true},
		{400, 450, 0, false},
	} {
		got, ok := s.stall(at(tc.from), at(tc.to))
		if got != tc.want || ok != tc.ok {
			t.Errorf("stall over [%d ms, %d ms] = %v, %v; want %v, %v", tc.from, tc.to, got, ok, tc.want, tc.ok)
		}
	}
}
