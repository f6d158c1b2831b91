package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childPIDs lists the children of a process. /proc lists a child under
// the thread that forked it, and a Go program forks from whichever thread
// runs the goroutine: every thread's list counts (the main thread's alone
// read empty now and then).
func childPIDs(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// TestRestartInPlace: with --restart-in-place, kill -9 of the driver
// (the supervisor's child) three times in a row: each time a new driver
// serves the published target again (a new file is created there) within
// a second (kubelet's back-off
// would have been 10 s, then 20 s), the supervisor stays, and the new
// driver counts the restarts. kill -9 of the supervisor takes the driver
// with it, as a container's end does.
func TestRestartInPlace(t *testing.T) {
	r, target := newPublishedRig(t)
	r.stopDriver(syscall.SIGTERM)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	r.startDriver("--restart-in-place", "--metrics-address="+metricsAddr)
	sup := r.driver.Process.Pid
	for round := 1; round <= 3; round++ {
		children := childPIDs(sup)
		if len(children) != 1 {
			t.Fatalf("round %d: the supervisor has children %v, want one driver", round, children)
		}
		start := time.Now()
		syscall.Kill(children[0], syscall.SIGKILL)
		deadline := start.Add(30 * time.Second)
		for {
			now := childPIDs(sup)
			if len(now) == 1 && now[0] != children[0] {
				// A create needs the driver (a read could come from the
				// page cache).
				if err := os.WriteFile(filepath.Join(target, fmt.Sprintf("round-%d.txt", round)), []byte("x"), 0o644); err == nil {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no new driver served the target within 30 s; log:\n%s", round, linesContaining(readFile(r.driverLog.Name()), "level="))
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("round %d: kill -9 of the driver; the target answered again after %v", round, time.Since(start).Round(time.Millisecond))
	}
	if syscall.Kill(sup, 0) != nil {
		t.Fatal("the supervisor died")
	}
	if log := readFile(r.driverLog.Name()); strings.Count(log, "the driver died; starting it again in place") != 3 {
		t.Errorf("the supervisor logged %d restarts, want 3", strings.Count(log, "the driver died; starting it again in place"))
	}
	child := childPIDs(sup)[0]
	var metrics string
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(metrics, "\nblobfs_csi_driver_restarts_total 3\n") && time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + metricsAddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			metrics = string(b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(metrics, "\nblobfs_csi_driver_restarts_total 3\n") {
		t.Errorf("the driver after 3 restarts in place reports:\n%s", linesContaining(metrics, "restarts"))
	}
	r.stopDriver(syscall.SIGKILL)
	deadline = time.Now().Add(10 * time.Second)
	for syscall.Kill(child, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the driver outlived its supervisor")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.startDriver()
	r.teardown(target)
}

// TestRestartInPlaceNotAtStart: a driver that fails at start is not
// restarted in place; the supervisor exits with its status, for kubelet
// to show.
func TestRestartInPlaceNotAtStart(t *testing.T) {
	bin := blobfsBin(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "csi", "--mode=node", "--restart-in-place", "--endpoint=unix://"+filepath.Join(dir, "csi.sock"),
		"--kubelet-dir=relative/path", "--state-dir="+filepath.Join(dir, "state"), "--cache-dir="+filepath.Join(dir, "cache"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) {
		t.Fatalf("the supervisor of a driver that cannot start: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "starting it again in place") || !strings.Contains(string(out), "not restarting it in place") {
		t.Errorf("a driver that failed at start was restarted in place, or the supervisor did not say why it stops:\n%s", out)
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
