package fsmetrics

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// value gathers m and returns the value of the series name{volume=vol}.
func value(t *testing.T, m *Metrics, name, vol string) (float64, bool) {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if label(s, "volume") != vol {
				continue
			}
			if s.GetGauge() != nil {
				return s.GetGauge().GetValue(), true
			}
			return s.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestVolumeGauges: through a real mount on a slow store, the volume's
// series show a file's unsaved bytes while it is written, its bytes as
// uploading while close waits for the store, the requests in flight, and
// nothing left once the close returned; untracking ends the series.
func TestVolumeGauges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	slow := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{Bandwidth: 4 << 20})
	m := New()
	vol := m.NewVolume("vol-1")
	fsys, err := fusefs.New(vol.InstrumentStore(slow), fusefs.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	vol.Track(fsys)
	mnt := t.TempDir()
	sess, err := kernel.Mount(mnt, m.InstrumentFS(fsys), kernel.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sess.Unmount(true); sess.Wait() }()

	const size = 6 << 20 // 1.5 s at 4 MiB/s
	f, err := os.Create(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if v, _ := value(t, m, "blobfs_volume_dirty_bytes", "vol-1"); v != size {
		t.Errorf("dirty bytes while written: %v, want %d", v, size)
	}
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	var sawUploading, sawInFlight bool
	deadline := time.Now().Add(30 * time.Second)
	for !sawUploading || !sawInFlight {
		if v, _ := value(t, m, "blobfs_volume_uploading_bytes", "vol-1"); v == size {
			sawUploading = true
		}
		if v, _ := value(t, m, "blobfs_volume_store_requests_in_flight", "vol-1"); v > 0 {
			sawInFlight = true
		}
		select {
		case err := <-closed:
			t.Fatalf("close returned (%v) before the gauges showed the upload (uploading %v, in flight %v)", err, sawUploading, sawInFlight)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the upload never showed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"blobfs_volume_dirty_bytes", "blobfs_volume_uploading_bytes", "blobfs_volume_store_requests_in_flight"} {
		if v, ok := value(t, m, name, "vol-1"); !ok || v != 0 {
			t.Errorf("%s after close: %v (present %v), want 0", name, v, ok)
		}
	}
	m.Untrack(fsys)
	if _, ok := value(t, m, "blobfs_volume_dirty_bytes", "vol-1"); ok {
		t.Error("the volume's series outlive Untrack")
	}
}

// opCounts gathers blobfs_fuse_operations_total by op.
func opCounts(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "blobfs_fuse_operations_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			out[label(s, "op")] += s.GetCounter().GetValue()
		}
	}
	return out
}

// TestLsLongCostPerEntry: what `ls -l` of a directory costs, in FUSE
// round trips and store requests, on a fresh mount (nothing cached): the
// entries come with their attributes (READDIRPLUS), so no entry costs a
// LOOKUP or GETATTR of its own, the kernel stops asking for extended
// attributes after the first ENOSYS, and the store sees a listing, not a
// request per entry.
func TestLsLongCostPerEntry(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls")
	}
	const n = 2000
	mem := blobstore.NewMemory()
	for i := range n {
		if _, err := mem.Put(t.Context(), fmt.Sprintf("d/f%05d", i), []byte("x"), blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := New()
	fsys, err := fusefs.New(mem, fusefs.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	mnt := t.TempDir()
	sess, err := kernel.Mount(mnt, m.InstrumentFS(fsys), kernel.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sess.Unmount(true); sess.Wait() }()

	ops, reqs := opCounts(t, m), mem.Requests()
	out, err := exec.Command(ls, "-l", filepath.Join(mnt, "d")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(out), "\n"); lines != n+1 { // "total" first
		t.Fatalf("ls -l printed %d lines, want %d", lines, n+1)
	}
	after, afterReqs := opCounts(t, m), mem.Requests()
	var store int64
	for op, c := range afterReqs {
		store += c - reqs[op]
	}
	per := map[string]float64{}
	for op, c := range after {
		if d := c - ops[op]; d > 0 {
			per[op] = d
		}
	}
	t.Logf("ls -l of %d entries: FUSE %v; store requests %d", n, per, store)
	if perEntry := (per["lookup"] + per["getattr"]) / n; perEntry > 0.05 {
		t.Errorf("%.2f LOOKUP+GETATTR per entry; the listing carries the attributes", perEntry)
	}
	if x := per["getxattr"] + per["listxattr"]; x > 4 {
		t.Errorf("%v xattr requests; ENOSYS should stop them after the first", x)
	}
	if store > 3 {
		t.Errorf("%d store requests; one listing should do", store)
	}
}

// TestVolumeOldestRequest: while a store request hangs, the volume's
// blobfs_volume_store_oldest_request_seconds grows above 0 and the hang is
// logged at WARN; once it ends the gauge is 0 again.
func TestVolumeOldestRequest(t *testing.T) {
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	var logged storetest.LogBuffer
	m := New()
	vol := m.NewVolume("vol-1")
	watched := blobstore.NewWatched(vol.InstrumentStore(faulty), blobstore.WatchOptions{
		Log: slog.New(slog.NewTextHandler(&logged, nil)), Threshold: 20 * time.Millisecond,
	})
	vol.WatchStore(watched)
	fsys, err := fusefs.New(watched, fusefs.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	vol.Track(fsys)
	defer m.Untrack(fsys)
	const name = "blobfs_volume_store_oldest_request_seconds"
	if v, ok := value(t, m, name, "vol-1"); !ok || v != 0 {
		t.Fatalf("%s with nothing in flight: %v (present %v), want 0", name, v, ok)
	}

	faulty.SetOptions(blobstore.FaultOptions{Latency: time.Hour}) // the store freezes
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watched.Stat(ctx, "frozen")
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logged.String(), "level=WARN") {
		if time.Now().After(deadline) {
			t.Fatal("no WARN about the hung request")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v, _ := value(t, m, name, "vol-1"); v < 0.02 {
		t.Fatalf("%s during a hang logged as such: %v, want at least the 20ms threshold", name, v)
	}
	cancel()
	<-done
	if v, _ := value(t, m, name, "vol-1"); v != 0 {
		t.Fatalf("%s after the request ended: %v, want 0", name, v)
	}
}
