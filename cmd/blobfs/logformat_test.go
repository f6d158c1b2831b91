package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// parseLogfmt parses one line as logfmt: key=value pairs separated by one
// space; a value is bare (no space, '"' or '=') or double-quoted with Go's
// escapes. Keys must be snake_case and appear once.
func parseLogfmt(line string) (map[string]string, []string, error) {
	vals := map[string]string{}
	var keys []string
	rest := line
	for {
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return nil, nil, fmt.Errorf("no key=value at %q", rest)
		}
		key := rest[:eq]
		if !logKey.MatchString(key) {
			return nil, nil, fmt.Errorf("key %q is not snake_case ASCII", key)
		}
		if _, dup := vals[key]; dup {
			return nil, nil, fmt.Errorf("key %q twice", key)
		}
		rest = rest[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return nil, nil, fmt.Errorf("key %s: bad quoted value at %q", key, rest)
			}
			val, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			end := strings.IndexByte(rest, ' ')
			if end < 0 {
				end = len(rest)
			}
			val = rest[:end]
			if val == "" || strings.ContainsAny(val, "\"=") || strings.ContainsFunc(val, func(r rune) bool { return r < ' ' || r == 0x7f }) {
				return nil, nil, fmt.Errorf("key %s: bare value %q is empty or holds a quote, '=' or a control character", key, val)
			}
			rest = rest[end:]
		}
		vals[key] = val
		keys = append(keys, key)
		if rest == "" {
			return vals, keys, nil
		}
		if rest[0] != ' ' || len(rest) == 1 || rest[1] == ' ' {
			return nil, nil, fmt.Errorf("after %s: want one space before the next pair, got %q", key, rest)
		}
		rest = rest[1:]
	}
}

// checkJSONKeys walks one JSON value and checks every object's keys: snake
// case, and each once.
func checkJSONKeys(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			if !logKey.MatchString(key) {
				return fmt.Errorf("key %q (in %s) is not snake_case ASCII", key, path)
			}
			if seen[key] {
				return fmt.Errorf("key %q twice (in %s)", key, path)
			}
			seen[key] = true
			if err := checkJSONKeys(dec, path+"."+key); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		for dec.More() {
			if err := checkJSONKeys(dec, path+"[]"); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}

// parseLogLine parses one log line in format (text or json) and checks
// that it is a record: time, level and msg, in that order for text.
func parseLogLine(format, line string) (map[string]string, error) {
	var rec map[string]string
	switch format {
	case "text":
		vals, keys, err := parseLogfmt(line)
		if err != nil {
			return nil, err
		}
		if len(keys) < 3 || keys[0] != "time" || keys[1] != "level" || keys[2] != "msg" {
			return nil, fmt.Errorf("does not start with time, level, msg: %q", keys)
		}
		rec = vals
	case "json":
		dec := json.NewDecoder(strings.NewReader(line))
		if err := checkJSONKeys(dec, "$"); err != nil {
			return nil, err
		}
		if _, err := dec.Token(); err != io.EOF {
			return nil, errors.New("more than one JSON value")
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			return nil, fmt.Errorf("not a JSON object: %v", err)
		}
		rec = map[string]string{}
		for k, v := range obj {
			if s, ok := v.(string); ok {
				rec[k] = s
			} else {
				b, _ := json.Marshal(v)
				rec[k] = string(b)
			}
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := obj[k].(string); !ok {
				return nil, fmt.Errorf("no string %q", k)
			}
		}
	default:
		return nil, fmt.Errorf("unknown format %q", format)
	}
	if _, err := time.Parse(time.RFC3339Nano, rec["time"]); err != nil {
		return nil, fmt.Errorf("time %q: %v", rec["time"], err)
	}
	switch rec["level"] {
	case "DEBUG", "INFO", "WARN", "ERROR":
	default:
		return nil, fmt.Errorf("level %q", rec["level"])
	}
	return rec, nil
}

// parseLog parses every line of a log and fails the test at the first that
// does not parse; it returns the records.
func parseLog(t *testing.T, name, format string, log []byte) []map[string]string {
	t.Helper()
	var recs []map[string]string
	for i, line := range strings.Split(strings.TrimSuffix(string(log), "\n"), "\n") {
		rec, err := parseLogLine(format, line)
		if err != nil {
			t.Fatalf("%s, line %d, is not %s: %v\n%s", name, i+1, format, err, line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// hasRecord tells whether a record has msg (a prefix) and every key=value
// in kv.
func hasRecord(recs []map[string]string, msg string, kv ...string) bool {
	for _, r := range recs {
		if !strings.HasPrefix(r["msg"], msg) {
			continue
		}
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			if r[kv[i]] != kv[i+1] {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func TestLogLineParser(t *testing.T) {
	good := map[string]string{
		`time=2026-01-02T03:04:05.678+00:00 level=INFO msg=mounted store="local directory /x" mountpoint=/mnt/a`:         "text",
		`time=2026-01-02T03:04:05Z level=WARN msg="a \"quoted\" word" err="read: \\n" n=3 empty=""`:                      "text",
		`{"time":"2026-01-02T03:04:05.1Z","level":"ERROR","msg":"x","open_files":2,"grp":{"in_group":[1,{"k_2":null}]}}`: "json",
	}
	for line, format := range good {
		if _, err := parseLogLine(format, line); err != nil {
			t.Errorf("%s: %v", line, err)
		}
	}
	bad := map[string]string{
		`time=2026-01-02T03:04:05Z level=INFO msg=x crashes in a row=3`:             "text",
		`time=2026-01-02T03:04:05Z level=INFO msg=x nodeID=n`:                       "text",
		`time=2026-01-02T03:04:05Z level=INFO msg=x a=1 a=2`:                        "text",
		`time=2026-01-02T03:04:05Z level=INFO msg=x a="unterminated`:                "text",
		`time=2026-01-02T03:04:05Z level=INFO msg=x a=b"c`:                          "text",
		`time=2026-01-02T03:04:05Z level=INFO msg=x  a=1`:                           "text",
		`level=INFO time=2026-01-02T03:04:05Z msg=x`:                                "text",
		`time=2026-01-02T03:04:05Z level=LOUD msg=x`:                                "text",
		`time=yesterday level=INFO msg=x`:                                           "text",
		`blobfs: mounted local directory /x at /mnt/a`:                              "text",
		`goroutine 1 [running]:`:                                                    "text",
		`{"time":"2026-01-02T03:04:05Z","level":"INFO","msg":"x","open files":1}`:   "json",
		`{"time":"2026-01-02T03:04:05Z","level":"INFO","msg":"x","g":{"nodeID":1}}`: "json",
		`{"time":"2026-01-02T03:04:05Z","level":"INFO","msg":"x","a":1,"a":2}`:      "json",
		`{"time":"2026-01-02T03:04:05Z","level":"INFO"}`:                            "json",
		`{"time":"2026-01-02T03:04:05Z","level":"INFO","msg":"x"} {}`:               "json",
		`time=2026-01-02T03:04:05Z level=INFO msg=x`:                                "json",
	}
	for line, format := range bad {
		if _, err := parseLogLine(format, line); err == nil {
			t.Errorf("%s line accepted: %s", format, line)
		}
	}
}

// logWorkload does what an application does on a mount: enough to make
// the store, FUSE and cache paths log at debug level.
func logWorkload(t *testing.T, mp string) {
	t.Helper()
	dir := filepath.Join(mp, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("blobfs "), 200<<10) // 1.4 MiB: several reads
	if err := os.WriteFile(filepath.Join(dir, "a.dat"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "a.dat"), filepath.Join(dir, "b.dat")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "b.dat")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}
	if _, err := os.ReadDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if err := os.Chmod(filepath.Join(dir, "b.dat"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b.dat", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
}

// TestLogFormats runs real commands with --log-format text and json and
// parses every line they log: a foreground mount and a background one
// (through mount.blobfs -o) at debug level with a workload, a worker
// crash, SIGHUP and the ends by signal and by unmount; and, with Azurite,
// a keeper, a CSI node driver that stages, publishes, is killed and
// adopts, and a registrar.
func TestLogFormats(t *testing.T) {
	bin := blobfsBin(t)
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			t.Run("Foreground", func(t *testing.T) { logFormatForeground(t, bin, format) })
			t.Run("Background", func(t *testing.T) { logFormatBackground(t, bin, format) })
			t.Run("CSI", func(t *testing.T) { logFormatCSI(t, bin, format) })
		})
	}
}

func logFormatForeground(t *testing.T, bin, format string) {
	store, mp, log := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "blobfs.log")
	cmd := exec.Command(bin, "mount", "--foreground", "--log-format", format, "--log-level", "debug", "--debug-fuse",
		"--log-file", log, "--local-dir", store, "--cache-dir", t.TempDir(), mp)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); syscall.Unmount(mp, syscall.MNT_DETACH) })
	waitMounted(t, mp, true)
	logWorkload(t, mp)
	cmd.Process.Signal(syscall.SIGHUP) // with --log-file: reopens, and the mount stays
	waitLog(t, log, "log file reopened", 1)
	if !mounted(t, mp) {
		t.Fatal("SIGHUP ended the foreground mount")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := waitExit(cmd, 60*time.Second); err != nil {
		t.Fatalf("blobfs exited with %v; stderr:\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	recs := parseLog(t, "foreground log", format, b)
	for _, want := range [][]string{
		{"mounted", "mountpoint", mp},
		{"store Put", "name", "d/a.dat"},
		{"log file reopened", "signal", "hangup"},
		{"signal received: ", "signal", "terminated"},
	} {
		if !hasRecord(recs, want[0], want[1:]...) {
			t.Errorf("no record %q in the foreground log:\n%s", want, b)
		}
	}
	if strings.Contains(stderr.String(), "level=") || strings.Contains(stderr.String(), `"level"`) {
		t.Errorf("with --log-file, log lines went to stderr:\n%s", stderr.String())
	}
}

func logFormatBackground(t *testing.T, bin, format string) {
	store, mp, log := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "blobfs.log")
	helper := filepath.Join(filepath.Dir(bin), "mount.blobfs")
	out, err := exec.Command(helper, "local:"+store, mp, "-o",
		"log_format="+format+",log-level=debug,log-file="+log+",cache-dir="+t.TempDir()).CombinedOutput()
	if err != nil {
		t.Fatalf("mount.blobfs: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if w, _ := findWorker(mp); w != nil {
			syscall.Kill(w.ppid, syscall.SIGKILL)
			syscall.Kill(w.pid, syscall.SIGKILL)
		}
		syscall.Unmount(mp, syscall.MNT_DETACH)
	})
	logWorkload(t, mp)
	w := waitWorker(t, mp, 0)
	syscall.Kill(w.pid, syscall.SIGKILL)
	w2 := waitWorker(t, mp, w.pid)
	waitLog(t, log, "worker restarted", 1)
	if err := os.WriteFile(filepath.Join(mp, "after-restart"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(w2.ppid, syscall.SIGHUP)
	waitLog(t, log, "log file reopened", 2) // the supervisor and the worker
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	waitExited(t, w2.ppid, "supervisor")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	recs := parseLog(t, "background log", format, b)
	for _, want := range [][]string{
		{"worker serves the mount", "process", "supervisor"},
		{"store Put", "process", "worker", "name", "d/a.dat"},
		{"worker died", "process", "supervisor"},
		{"restarting the worker", "crashes_in_a_row", "1"},
		{"worker restarted", "process", "supervisor"},
		{"log file reopened", "process", "supervisor", "signal", "hangup"},
		{"log file reopened", "process", "worker", "signal", "hangup"},
		{"worker finished", "process", "supervisor"},
	} {
		if !hasRecord(recs, want[0], want[1:]...) {
			t.Errorf("no record %q in the background log:\n%s", want, b)
		}
	}
}

// logFormatCSI runs a keeper, a CSI node driver and a registrar with the
// format: a volume on Azurite is staged and published, written to, the
// driver is killed and adopts the mounts again, then torn down and every
// process stopped with SIGTERM.
func logFormatCSI(t *testing.T, bin, format string) {
	if os.Getenv("BLOBFS_TEST_AZURITE") == "" {
		storetest.AzuriteConfig(t) // skips, saying why
	}
	r := newRestartRig(t)
	r.keeper = exec.Command(r.bin, "keeper", "--socket", r.keeperSock, "--log-format", format)
	r.keeper.Stderr = r.driverLog
	if err := r.keeper.Start(); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--log-format", format, "--log-level", "debug"}
	r.startDriver(flags...)
	var regLog lockedBuffer
	reg := exec.Command(bin, "registrar", "--csi-address", strings.TrimPrefix(r.endpoint, "unix://"),
		"--registration-dir", filepath.Join(r.dir, "registry"), "--check-interval", "100ms", "--log-format", format, "--log-level", "debug")
	reg.Stderr = &regLog
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Process.Kill(); reg.Wait() })

	r.stage()
	target, err := r.publish("pod-a", nil)
	if err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("through the CSI mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.stopDriver(syscall.SIGKILL)
	r.startDriver(flags...)
	if _, err := r.node.NodeGetInfo(context.Background(), &csipb.NodeGetInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	r.teardown(target)
	r.stopDriver(syscall.SIGTERM)
	r.keeper.Process.Signal(syscall.SIGTERM)
	if err := waitExit(r.keeper, 30*time.Second); err != nil {
		t.Fatalf("keeper: %v", err)
	}
	r.keeper = nil
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(regLog.String(), "offering registration") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	reg.Process.Signal(syscall.SIGTERM)
	if err := waitExit(reg, 30*time.Second); err != nil {
		t.Fatalf("registrar: %v", err)
	}

	b, err := os.ReadFile(r.driverLog.Name())
	if err != nil {
		t.Fatal(err)
	}
	recs := parseLog(t, "driver and keeper log", format, b)
	for _, want := range [][]string{
		{"keeper listening"},
		{"CSI driver serving", "node_id", "node-1"},
		{"volume staged", "read_only", "false"},
		{"volume published", "read_only", "false"},
		{"store ", "name", "f"},
		{"adopted the live mounts"},
		{"signal received: stopping the CSI driver", "signal", "terminated"},
		{"signal received: the keeper stops", "signal", "terminated"},
	} {
		if !hasRecord(recs, want[0], want[1:]...) {
			t.Errorf("no record %q in the driver's and keeper's log", want)
		}
	}
	regRecs := parseLog(t, "registrar log", format, []byte(regLog.String()))
	for _, want := range [][]string{
		{"offering registration to kubelet", "driver_path", "/var/lib/kubelet/plugins/blob.csi.blobfs.io/csi.sock"},
		{"signal received: the registrar stops", "signal", "terminated"},
	} {
		if !hasRecord(regRecs, want[0], want[1:]...) {
			t.Errorf("no record %q in the registrar's log:\n%s", want, regLog.String())
		}
	}
}

// TestLogFormatFlag: a format or level that does not exist is one line
// naming the flag, exit status 2, for every command that logs.
func TestLogFormatFlag(t *testing.T) {
	bin := blobfsBin(t)
	mp := t.TempDir()
	helper := filepath.Join(filepath.Dir(bin), "mount.blobfs")
	for _, tc := range []struct {
		flag string
		argv []string
	}{
		{"--log-format", []string{bin, "mount", "--log-format", "yaml", "--local-dir", t.TempDir(), mp}},
		{"--log-format", []string{helper, "local:" + t.TempDir(), mp, "-o", "log-format=yaml"}},
		{"--log-format", []string{bin, "csi", "--log-format", "yaml", "--endpoint", "unix://" + filepath.Join(t.TempDir(), "csi.sock")}},
		{"--log-format", []string{bin, "keeper", "--socket", filepath.Join(t.TempDir(), "k.sock"), "--log-format", "JSON"}},
		{"--log-format", []string{bin, "registrar", "--log-format", ""}},
		{"--log-level", []string{bin, "mount", "--log-level", "loud", "--local-dir", t.TempDir(), mp}},
		{"--log-level", []string{bin, "keeper", "--socket", filepath.Join(t.TempDir(), "k.sock"), "--log-level", "loud"}},
	} {
		out, err := exec.Command(tc.argv[0], tc.argv[1:]...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: %v; want exit status 2", tc.argv, err)
		}
		if msg := strings.TrimSuffix(string(out), "\n"); strings.Contains(msg, "\n") || !strings.Contains(msg, tc.flag) {
			t.Errorf("%q said %q; want one line naming %s", tc.argv, out, tc.flag)
		}
		if mounted(t, mp) {
			t.Fatalf("%q mounted", tc.argv)
		}
	}
}

// TestDebugFUSEFlag: --debug-fuse alone, at the default log level, logs the
// FUSE requests (it once logged them at debug level, so nothing showed
// unless --log-level debug was given as well).
func TestDebugFUSEFlag(t *testing.T) {
	bin := blobfsBin(t)
	store, mp, log := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "blobfs.log")
	cmd := exec.Command(bin, "mount", "--foreground", "--debug-fuse", "--log-file", log, "--local-dir", store, "--cache-dir", t.TempDir(), mp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); syscall.Unmount(mp, syscall.MNT_DETACH) })
	waitMounted(t, mp, true)
	if err := os.WriteFile(filepath.Join(mp, "traced"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := waitExit(cmd, 60*time.Second); err != nil {
		t.Fatalf("blobfs exited with %v", err)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var creates int
	for _, rec := range parseLog(t, "log", "text", b) {
		if rec["component"] == "go-fuse" && strings.HasPrefix(rec["msg"], "rx ") && strings.Contains(rec["msg"], "CREATE") {
			creates++
		}
	}
	if creates == 0 {
		t.Fatalf("--debug-fuse logged no CREATE request:\n%s", b)
	}
}
