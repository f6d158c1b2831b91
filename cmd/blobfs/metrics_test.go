package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// freeAddr is a loopback address nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns the metrics page at addr, retrying while nothing listens
// (a worker that is starting).
func scrape(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics at %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricValue is the value of the series whose name and labels are series
// exactly (as the text format writes them), and whether there is one.
func metricValue(body, series string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// TestMountMetrics: `blobfs mount --metrics-address` serves the mount's
// metrics from its worker: FUSE and store counts, the volume's gauges
// (a file open with data not uploaded yet, the block cache after reads),
// and, after the worker is killed and its successor adopts the mount, the
// pause the restart cost.
func TestMountMetrics(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	addr := freeAddr(t)
	if err := os.WriteFile(filepath.Join(store, "read.bin"), make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	mountInBackground(t, bin, mp, "--local-dir", store, "--metrics-address", addr)
	if b, err := os.ReadFile(filepath.Join(mp, "read.bin")); err != nil || len(b) != 3<<20 {
		t.Fatalf("read through the mount: %d bytes, %v", len(b), err)
	}
	open, err := os.Create(filepath.Join(mp, "open.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Write(make([]byte, 123456)); err != nil {
		t.Fatal(err)
	}

	body := scrape(t, addr)
	vol := `{volume="` + mp + `"}`
	for series, want := range map[string]float64{
		"blobfs_volume_dirty_files" + vol:                  1,
		"blobfs_volume_dirty_bytes" + vol:                  123456,
		"blobfs_volume_uploading_bytes" + vol:              0,
		"blobfs_volume_store_requests_in_flight" + vol:     0,
		"blobfs_volume_store_oldest_request_seconds" + vol: 0,
	} {
		if got, ok := metricValue(body, series); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	for _, series := range []string{
		"blobfs_volume_spill_bytes" + vol, "blobfs_volume_cache_bytes" + vol,
		"blobfs_volume_cache_misses_total" + vol, "blobfs_volume_cache_hits_total" + vol,
		`blobfs_fuse_operations_total{op="write",result="ok"}`,
		`blobfs_store_requests_total{op="ReadAt",result="ok"}`,
	} {
		if got, _ := metricValue(body, series); got <= 0 {
			t.Errorf("%s = %v after reads and a write; want more than 0", series, got)
		}
	}

	// The worker dies; its successor adopts the mount and says how long
	// the mount went unserved.
	w := waitWorker(t, mp, 0)
	syscall.Kill(w.pid, syscall.SIGKILL)
	waitWorker(t, mp, w.pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		body = scrape(t, addr)
		if n, _ := metricValue(body, "blobfs_restart_pause_seconds_count"); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no restart pause recorded after the worker was killed:\n%s", linesContaining(body, "blobfs_restart_pause"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sum, _ := metricValue(body, "blobfs_restart_pause_seconds_sum"); sum <= 0 || sum > 30 {
		t.Errorf("restart pause %vs; want a positive pause under the supervisor's restart time", sum)
	}
	// The file open across the restart still holds its data, and goes up.
	if got, _ := metricValue(body, "blobfs_volume_dirty_bytes"+vol); got != 123456 {
		t.Errorf("dirty bytes after the restart = %v, want 123456", got)
	}
	if err := open.Close(); err != nil {
		t.Fatalf("close after the restart: %v", err)
	}
	if got, _ := metricValue(scrape(t, addr), "blobfs_volume_dirty_bytes"+vol); got != 0 {
		t.Errorf("dirty bytes after close = %v, want 0", got)
	}
}

// TestMountMetricsAddressInUse: an address in use fails the mount, naming
// the flag, and mounts nothing.
func TestMountMetricsAddressInUse(t *testing.T) {
	bin := blobfsBin(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mp := t.TempDir()
	out, err := exec.Command(bin, "mount", "--local-dir", t.TempDir(), "--foreground", "--metrics-address", l.Addr().String(), mp).CombinedOutput()
	if err == nil {
		syscall.Unmount(mp, syscall.MNT_DETACH)
		t.Fatalf("mount succeeded with its metrics address in use:\n%s", out)
	}
	if !strings.Contains(string(out), "--metrics-address "+l.Addr().String()) || !strings.Contains(string(out), "address already in use") {
		t.Errorf("the error does not say what is wrong:\n%s", out)
	}
	if mounted(t, mp) {
		t.Error("mounted anyway")
	}
}

// TestMountDiskCache: `blobfs mount --read-only --disk-cache-mb` keeps what
// it read in --disk-cache-dir, and opens a file held whole there with FUSE
// passthrough (counted in its metrics); after the worker is killed, its
// successor takes the directory over and serves on.
func TestMountDiskCache(t *testing.T) {
	bin := blobfsBin(t)
	store, mp, disk := t.TempDir(), t.TempDir(), t.TempDir()
	addr := freeAddr(t)
	data := make([]byte, 20<<20)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	if err := os.WriteFile(filepath.Join(store, "data.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "mount", "--local-dir", store, "--read-only", "--disk-cache-mb", "-1", mp).CombinedOutput(); err == nil || !strings.Contains(string(out), "--disk-cache-mb -1: must be between 0") {
		t.Fatalf("--disk-cache-mb -1: %v\n%s", err, out)
	}
	mountInBackground(t, bin, mp, "--local-dir", store, "--read-only", "--disk-cache-mb", "256", "--disk-cache-dir", disk, "--metrics-address", addr)
	read := func() {
		t.Helper()
		f, err := os.Open(filepath.Join(mp, "data.bin"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through the mount: %d bytes, %v", len(got), err)
		}
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	vol := `{volume="` + mp + `"}`
	// The kernel sends RELEASE after close returns; until the mount has
	// it, the handle counts against passthrough. Hence the pauses, and
	// reads until a passthrough open, for as long as the machine takes
	// to deliver a RELEASE.
	readUntilPassthrough := func(who string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for i := 2; ; i++ {
			time.Sleep(300 * time.Millisecond)
			read()
			if got, _ := metricValue(scrape(t, addr), "blobfs_volume_passthrough_opens_total"+vol); got >= 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no passthrough open after %d reads of a file held whole, in 30 s", who, i)
			}
		}
	}
	read()
	if files, _ := os.ReadDir(disk); len(files) != 1 {
		t.Errorf("%d files in --disk-cache-dir after reading one file, want 1", len(files))
	}
	readUntilPassthrough("first worker")

	w := waitWorker(t, mp, 0)
	syscall.Kill(w.pid, syscall.SIGKILL)
	waitWorker(t, mp, w.pid)
	read() // the successor: cold cache, from the store
	readUntilPassthrough("its successor")
}

// mountInBackground runs `blobfs mount ARGS... --log-file LOG MP` (which
// detaches once mounted), and unmounts at the test's end, showing the log
// if the test failed.
func mountInBackground(t *testing.T, bin, mp string, args ...string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "log")
	argv := append(append([]string{"mount"}, args...), "--log-file", log, mp)
	out, err := exec.Command(bin, argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		exec.Command(bin, "unmount", mp).Run()
		syscall.Unmount(mp, syscall.MNT_DETACH)
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("log:\n%s", b)
		}
	})
}
