package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLogFileReopen: after the file is renamed away, Reopen writes to a
// new file at the path; when the path cannot be opened, writing goes on to
// the old file.
func TestLogFileReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "blobfs.log")
	l, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fmt.Fprintln(l, "one")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(l, "two")
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(l, "three")
	if err := os.Rename(dir, dir+".gone"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err == nil {
		t.Error("Reopen in a directory that is gone succeeded")
	}
	fmt.Fprintln(l, "four")
	for file, want := range map[string]string{
		dir + ".gone/blobfs.log.1": "one\ntwo\n",
		dir + ".gone/blobfs.log":   "three\nfour\n",
	} {
		if got, err := os.ReadFile(file); err != nil || string(got) != want {
			t.Errorf("%s has %q, %v; want %q", file, got, err, want)
		}
	}
}

// TestLoggerRedactsInEveryFormat: the redaction wrapper stays around the
// handler of either format, and JSON writes durations as text does.
func TestLoggerRedactsInEveryFormat(t *testing.T) {
	const sig = "hSECRETsig0123456789"
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		logger, file, err := newLogger(logFlags{level: "info", format: format}, &buf)
		if err != nil || file != nil {
			t.Fatalf("%s: newLogger: %v, file %v", format, err, file)
		}
		logger.Info("GET https://a.blob.core.windows.net/c/b?sv=2022-11-02&sig="+sig,
			"url", "https://a/c?sig="+sig, "err", errors.New("Authorization: Bearer "+sig), "took", 1500*time.Millisecond)
		out := buf.String()
		if strings.Contains(out, sig) {
			t.Errorf("%s: a secret in the log: %s", format, out)
		}
		rec, err := parseLogLine(format, strings.TrimSuffix(out, "\n"))
		if err != nil {
			t.Fatalf("%s: %v: %s", format, err, out)
		}
		if rec["took"] != "1.5s" {
			t.Errorf("%s: took=%q; want 1.5s", format, rec["took"])
		}
	}
}

// TestLogFileReopenOnSIGHUP: logrotate renames the log file away and sends
// SIGHUP; what is logged from then on goes to a new file at the path, and
// the mount goes on as before. In the background, SIGHUP to the supervisor
// reaches the worker too, and the worker's stderr (where a panic's trace
// goes) follows the file.
func TestLogFileReopenOnSIGHUP(t *testing.T) {
	bin := blobfsBin(t)
	t.Run("Foreground", func(t *testing.T) {
		store, mp, log := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "blobfs.log")
		cmd := exec.Command(bin, "mount", "--foreground", "--log-level", "debug", "--log-file", log,
			"--local-dir", store, "--cache-dir", t.TempDir(), mp)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); syscall.Unmount(mp, syscall.MNT_DETACH) })
		waitMounted(t, mp, true)
		waitLog(t, log, "msg=mounted", 1)

		if err := os.Rename(log, log+".1"); err != nil {
			t.Fatal(err)
		}
		cmd.Process.Signal(syscall.SIGHUP)
		waitLog(t, log, `msg="log file reopened" signal=hangup`, 1)
		if err := os.WriteFile(filepath.Join(mp, "after-rotation"), []byte("x"), 0o644); err != nil {
			t.Fatalf("the mount after SIGHUP: %v", err)
		}
		waitLog(t, log, "name=after-rotation", 1)
		cmd.Process.Signal(syscall.SIGTERM)
		if err := waitExit(cmd, 60*time.Second); err != nil {
			t.Fatalf("blobfs exited with %v", err)
		}
		checkRotated(t, log, []string{"msg=mounted"},
			[]string{"log file reopened", "name=after-rotation", "signal received: "})
	})

	t.Run("Background", func(t *testing.T) {
		store, mp := t.TempDir(), t.TempDir()
		log := backgroundMount(t, bin, store, mp, "--log-level", "debug")
		w := waitWorker(t, mp, 0)
		waitLog(t, log, "worker serves the mount", 1)

		if err := os.Rename(log, log+".1"); err != nil {
			t.Fatal(err)
		}
		syscall.Kill(w.ppid, syscall.SIGHUP)
		waitLog(t, log, `msg="log file reopened" process=supervisor signal=hangup`, 1)
		waitLog(t, log, `msg="log file reopened" process=worker pid=`+fmt.Sprint(w.pid)+` signal=hangup`, 1)
		if cur, _ := findWorker(mp); cur == nil || cur.pid != w.pid {
			t.Fatalf("SIGHUP replaced the worker %d with %v", w.pid, cur)
		}
		checkStderr(t, w.pid, log)
		if err := os.WriteFile(filepath.Join(mp, "after-rotation"), []byte("x"), 0o644); err != nil {
			t.Fatalf("the mount after SIGHUP: %v", err)
		}
		waitLog(t, log, "name=after-rotation", 1)

		// A worker started after the rotation writes to the new file.
		syscall.Kill(w.pid, syscall.SIGKILL)
		w2 := waitWorker(t, mp, w.pid)
		waitLog(t, log, "worker restarted", 1)
		checkStderr(t, w2.pid, log)

		// SIGHUP straight to the worker (systemctl kill signals every
		// process of the unit) reopens its log, and nothing more.
		syscall.Kill(w2.pid, syscall.SIGHUP)
		waitLog(t, log, `msg="log file reopened" process=worker pid=`+fmt.Sprint(w2.pid), 1)
		if cur, _ := findWorker(mp); cur == nil || cur.pid != w2.pid {
			t.Fatalf("SIGHUP to the worker %d replaced it with %v", w2.pid, cur)
		}

		if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
			t.Fatalf("unmount: %v\n%s", err, out)
		}
		waitExited(t, w.ppid, "supervisor")
		checkRotated(t, log, []string{"worker serves the mount"},
			[]string{"log file reopened", "name=after-rotation", "worker restarted", "worker finished"})
	})
}

// checkStderr: the process's stderr is the file at path, not the one
// renamed away.
func checkStderr(t *testing.T, pid int, path string) {
	t.Helper()
	got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", pid))
	if err != nil {
		t.Fatal(err)
	}
	if got != path {
		t.Errorf("stderr of pid %d is %s; want the log file %s", pid, got, path)
	}
}

// checkRotated: the file renamed away (path.1) has the lines logged before
// the rotation (before) and none of those after; the file at path has
// every line after.
func checkRotated(t *testing.T, path string, before, after []string) {
	t.Helper()
	old, err := os.ReadFile(path + ".1")
	if err != nil {
		t.Fatal(err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range before {
		if !bytes.Contains(old, []byte(s)) {
			t.Errorf("the rotated file has no %q:\n%s", s, old)
		}
	}
	for _, s := range after {
		if bytes.Contains(old, []byte(s)) {
			t.Errorf("%q went to the rotated file:\n%s", s, old)
		}
		if !bytes.Contains(cur, []byte(s)) {
			t.Errorf("the new file has no %q:\n%s", s, cur)
		}
	}
}
