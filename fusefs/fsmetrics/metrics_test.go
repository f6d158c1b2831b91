package fsmetrics

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
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
	sess, err := fusefs.Mount(mnt, m.InstrumentFS(fsys), fusefs.MountOptions{})
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
