package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// supervisedAppEnv names the directory the streaming application (the test binary
// re-executed) works in.
const supervisedAppEnv = "BLOBFS_TEST_SUPERVISED_APP_DIR"

// streamByte is the content of the application's stream at offset off.
func streamByte(off int64) byte {
	return byte(off*7 ^ off>>9 ^ off>>17)
}

func streamContent(n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = streamByte(int64(i))
	}
	return b
}

// streamApp is an application with one file open for the whole run: until
// its stdin closes, it appends a chunk to DIR/stream, reads back a random
// earlier range and checks it, and reads a random range of DIR/data (which
// holds streamContent) after dropping it from the page cache, so that
// every cycle needs the server. After each cycle it prints
// "ok ACKED STARTED" (bytes acknowledged so far, the cycle's start in Unix
// nanoseconds); at the end it closes the stream (which uploads it) and
// prints "done ACKED ERRORS". Errors are printed as "error ..." lines.
func streamApp(dir string) int {
	errs := 0
	fail := func(format string, args ...any) {
		errs++
		fmt.Printf("error "+format+"\n", args...)
	}
	data, err := os.Open(filepath.Join(dir, "data"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer data.Close()
	dataSize, _ := data.Seek(0, io.SeekEnd)
	stream, err := os.OpenFile(filepath.Join(dir, "stream"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	stop := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	fmt.Println("ready")
	const chunk = 8 << 10
	var acked int64
	buf := make([]byte, 64<<10)
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for errs == 0 && !stopped() {
		started := time.Now().UnixNano()
		w := make([]byte, chunk)
		for i := range w {
			w[i] = streamByte(acked + int64(i))
		}
		if _, err := stream.WriteAt(w, acked); err != nil {
			fail("write at %d: %v", acked, err)
			continue
		}
		acked += chunk
		off := rand.Int64N(acked)
		n := min(int64(len(buf)), acked-off)
		if _, err := stream.ReadAt(buf[:n], off); err != nil {
			fail("read back stream at %d: %v", off, err)
			continue
		}
		for i := range n {
			if buf[i] != streamByte(off+i) {
				fail("stream byte %d: got %d, want %d", off+i, buf[i], streamByte(off+i))
				break
			}
		}
		off = rand.Int64N(dataSize - int64(len(buf)))
		unix.Fadvise(int(data.Fd()), off&^4095, int64(len(buf))+4096, unix.FADV_DONTNEED)
		if _, err := data.ReadAt(buf, off); err != nil {
			fail("read data at %d: %v", off, err)
			continue
		}
		for i := range int64(len(buf)) {
			if buf[i] != streamByte(off+i) {
				fail("data byte %d: got %d, want %d", off+i, buf[i], streamByte(off+i))
				break
			}
		}
		fmt.Println("ok", acked, started)
		// Pace the stream: the point is to be busy across restarts,
		// not to fill the disk.
		time.Sleep(2 * time.Millisecond)
	}
	if err := stream.Close(); err != nil {
		fail("close stream: %v", err)
	}
	fmt.Println("done", acked, errs)
	if errs > 0 {
		return 1
	}
	return 0
}

// backgroundMount mounts store at mp in the background and returns the log
// file; the mount is detached lazily at the end of the test if it is left.
func backgroundMount(t *testing.T, bin, store, mp string, flags ...string) string {
	t.Helper()
	log := filepath.Join(t.TempDir(), "blobfs.log")
	args := append([]string{"mount", "--local-dir", store, "--log-file", log, "--cache-dir", t.TempDir()}, flags...)
	out, err := exec.Command(bin, append(args, mp)...).CombinedOutput()
	if err != nil {
		t.Fatalf("blobfs mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if w, _ := findWorker(mp); w != nil {
			syscall.Kill(w.ppid, syscall.SIGKILL)
			syscall.Kill(w.pid, syscall.SIGKILL)
		}
		syscall.Unmount(mp, syscall.MNT_DETACH)
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("blobfs log:\n%s", b)
		}
	})
	if !mounted(t, mp) {
		t.Fatal("not mounted after blobfs mount returned")
	}
	return log
}

type workerProc struct{ pid, ppid int }

// findWorker finds the worker process serving mp, and its supervisor.
func findWorker(mp string) (*workerProc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(argv) < 3 || argv[1] != workerMode || argv[len(argv)-1] != mp {
			continue
		}
		st, err := procState(pid)
		if err != nil || st.state == "Z" {
			continue
		}
		return &workerProc{pid: pid, ppid: st.ppid}, nil
	}
	return nil, nil
}

type procStat struct {
	state string
	ppid  int
}

func procState(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// pid (comm) state ppid ...; comm may hold spaces.
	rest := string(b[bytes.LastIndexByte(b, ')')+2:])
	f := strings.Fields(rest)
	ppid, _ := strconv.Atoi(f[1])
	return procStat{state: f[0], ppid: ppid}, nil
}

// waitWorker waits for a live worker serving mp other than not.
func waitWorker(t *testing.T, mp string, not int) *workerProc {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, err := findWorker(mp)
		if err != nil {
			t.Fatal(err)
		}
		if w != nil && w.pid != not {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("no worker process for %s (other than pid %d) after 30s", mp, not)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExited waits until pid (not a child of the test) has exited: gone,
// or a zombie nobody reaps.
func waitExited(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := procState(pid)
		if err != nil || st.state == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) still running after 60s", what, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLog waits until the log file holds n lines containing s.
func waitLog(t *testing.T, log, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Count(string(b), s) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log has not %d lines with %q after 30s:\n%s", n, s, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBackgroundWorkerKilled: the worker under a background `blobfs mount`
// is SIGKILLed again and again while an application process streams writes
// and reads through files it keeps open. Expected: the application sees no
// error, every byte it was acknowledged is in the store after unmount, and
// the pause each restart costs it is reported.
func TestBackgroundWorkerKilled(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	log := backgroundMount(t, bin, store, mp)
	dataContent := streamContent(4 << 20)
	if err := os.WriteFile(filepath.Join(mp, "data"), dataContent, 0o644); err != nil {
		t.Fatal(err)
	}

	app := exec.Command(os.Args[0], "-test.run=^$")
	app.Env = append(os.Environ(), supervisedAppEnv+"="+mp)
	app.Stderr = os.Stderr
	appIn, err := app.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	appOut, err := app.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Process.Kill(); app.Wait() })

	// Progress: each "ok" line's cycle start time, as it arrives.
	type cycle struct {
		started time.Time
		acked   int64
	}
	cycles := make(chan cycle, 1<<16)
	final := make(chan string, 1)
	var appErrors []string
	go func() {
		defer close(cycles)
		sc := bufio.NewScanner(appOut)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 3 && f[0] == "ok":
				acked, _ := strconv.ParseInt(f[1], 10, 64)
				ns, _ := strconv.ParseInt(f[2], 10, 64)
				cycles <- cycle{time.Unix(0, ns), acked}
			case len(f) > 0 && f[0] == "done":
				final <- sc.Text()
			case len(f) > 0 && f[0] == "error":
				appErrors = append(appErrors, sc.Text())
			}
		}
	}()
	// nextCycle returns the first cycle that started after since.
	nextCycle := func(since time.Time) cycle {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case c, ok := <-cycles:
				if !ok {
					t.Fatalf("application ended early: %v", appErrors)
				}
				if c.started.After(since) {
					return c
				}
			case <-timeout:
				t.Fatalf("no application progress for 60s after %v", since)
			}
		}
	}
	nextCycle(time.Now())

	const kills = 6
	var pauses []time.Duration
	lastWorker := 0
	for i := range kills {
		// Let the application work with this worker for a while.
		nextCycle(time.Now().Add(100 * time.Millisecond))
		w := waitWorker(t, mp, lastWorker)
		killed := time.Now()
		if err := syscall.Kill(w.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		lastWorker = w.pid
		// The first cycle begun after the kill needs the next worker.
		c := nextCycle(killed)
		pause := time.Since(killed)
		pauses = append(pauses, pause)
		t.Logf("kill %d of worker %d: application paused %v (acknowledged %d bytes so far)", i+1, w.pid, pause.Round(time.Millisecond), c.acked)
	}

	appIn.Close() // stop the application: it closes (uploads) its stream
	var done string
	select {
	case done = <-final:
	case <-time.After(2 * time.Minute):
		t.Fatal("application did not finish")
	}
	if err := app.Wait(); err != nil || len(appErrors) > 0 {
		t.Fatalf("application: %v, errors: %q", err, appErrors)
	}
	var acked, errs int64
	fmt.Sscanf(done, "done %d %d", &acked, &errs)
	if errs != 0 || acked == 0 {
		t.Fatalf("application reported %q", done)
	}

	w := waitWorker(t, mp, 0)
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	waitExited(t, w.ppid, "supervisor")
	waitExited(t, w.pid, "worker")
	got, err := os.ReadFile(filepath.Join(store, "stream"))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != acked || !bytes.Equal(got, streamContent(acked)) {
		t.Fatalf("store holds %d bytes of the stream (first difference at %d); the application was acknowledged %d",
			len(got), firstDifference(got, streamContent(acked)), acked)
	}
	if got, _ := os.ReadFile(filepath.Join(store, "data")); !bytes.Equal(got, dataContent) {
		t.Fatal("data file changed in the store")
	}
	b, _ := os.ReadFile(log)
	if n := strings.Count(string(b), "worker restarted; it adopted the mount"); n != kills {
		t.Errorf("the log reports %d restarts, want %d", n, kills)
	}
	sorted := slices.Clone(pauses)
	slices.Sort(sorted)
	t.Logf("%d restarts, %d bytes streamed: application pause median %v, max %v (restarts 3 and later include the crash-loop backoff: 250ms, 500ms, 1s, 2s)",
		kills, acked, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestBackgroundSIGTERM: SIGTERM to the supervisor makes the worker upload a
// file still open for writing and unmount; both processes exit.
func TestBackgroundSIGTERM(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	log := backgroundMount(t, bin, store, mp, "--shutdown-grace", "1s")
	f, err := os.Create(filepath.Join(mp, "open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("written before SIGTERM"); err != nil {
		t.Fatal(err)
	}
	w := waitWorker(t, mp, 0)
	if err := syscall.Kill(w.ppid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExited(t, w.ppid, "supervisor")
	waitExited(t, w.pid, "worker")
	if mounted(t, mp) {
		t.Fatal("still mounted after SIGTERM")
	}
	got, err := os.ReadFile(filepath.Join(store, "open.txt"))
	if err != nil || string(got) != "written before SIGTERM" {
		t.Fatalf("store has %q, %v; want the bytes written before SIGTERM", got, err)
	}
	waitLog(t, log, "worker finished", 1)
}

// TestBackgroundSIGTERMWorkerDown: SIGTERM arrives while no worker runs
// (the supervisor gave up restarting, or waits out a crash-loop backoff).
// The supervisor starts a worker that adopts the mount, uploads the file the
// dead worker held dirty, and unmounts.
func TestBackgroundSIGTERMWorkerDown(t *testing.T) {
	bin := blobfsBin(t)
	for _, tc := range []struct {
		name string
		// quickKills are kills each followed by a restart before the last
		// one; the backoff after the last grows with their number.
		quickKills int
		flags      []string
		downLog    string // the supervisor's log line once the last worker is down
	}{
		{"given up", 0, []string{"--restart-limit", "0"}, "not restarting the worker"},
		{"backoff", 4, nil, "after=1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, mp := t.TempDir(), t.TempDir()
			log := backgroundMount(t, bin, store, mp, append([]string{"--shutdown-grace", "1s"}, tc.flags...)...)
			f, err := os.Create(filepath.Join(mp, "open.txt"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var want bytes.Buffer
			write := func(s string) {
				t.Helper()
				if _, err := f.WriteString(s); err != nil {
					t.Fatalf("write: %v", err)
				}
				want.WriteString(s)
			}
			write("before the kills\n")
			last := 0
			for i := range tc.quickKills {
				w := waitWorker(t, mp, last)
				syscall.Kill(w.pid, syscall.SIGKILL)
				last = w.pid
				write(fmt.Sprintf("after kill %d\n", i+1)) // waits for the next worker
			}
			w := waitWorker(t, mp, last)
			syscall.Kill(w.pid, syscall.SIGKILL)
			waitLog(t, log, tc.downLog, 1)
			if cur, _ := findWorker(mp); cur != nil {
				t.Fatalf("worker %d runs; the test needs the supervisor between workers", cur.pid)
			}
			if err := syscall.Kill(w.ppid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitExited(t, w.ppid, "supervisor")
			if mounted(t, mp) {
				t.Fatal("still mounted after SIGTERM")
			}
			got, err := os.ReadFile(filepath.Join(store, "open.txt"))
			if err != nil || !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("store has %q, %v; want %q", got, err, want.Bytes())
			}
		})
	}
}

// TestBackgroundGiveUpAndSIGHUP: past --restart-limit the supervisor stops
// restarting the worker but keeps the mount: a write waits instead of
// failing, and completes once SIGHUP makes the supervisor try again.
func TestBackgroundGiveUpAndSIGHUP(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	log := backgroundMount(t, bin, store, mp, "--restart-limit", "0")
	f, err := os.Create(filepath.Join(mp, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := waitWorker(t, mp, 0)
	syscall.Kill(w.pid, syscall.SIGKILL)
	waitLog(t, log, "not restarting the worker", 1)

	wrote := make(chan error, 1)
	go func() {
		_, err := f.WriteString("waited for SIGHUP")
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("a write finished while no worker ran (err %v); want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	if cur, _ := findWorker(mp); cur != nil {
		t.Fatalf("worker %d started although the supervisor gave up", cur.pid)
	}
	if err := syscall.Kill(w.ppid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("write after SIGHUP: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write still waits 30s after SIGHUP")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(store, "f")); err != nil || string(got) != "waited for SIGHUP" {
		t.Fatalf("store has %q, %v", got, err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	waitExited(t, w.ppid, "supervisor")
}

// TestBackgroundRestartLimit counts restarts: with --restart-limit 3 the
// supervisor restarts the worker after its first and second crash in a
// row, and gives up at the third: two restarts, exactly, and no worker
// runs after. Then SIGHUP starts a worker again.
func TestBackgroundRestartLimit(t *testing.T) {
	bin := blobfsBin(t)
	const limit = 3
	store, mp := t.TempDir(), t.TempDir()
	log := backgroundMount(t, bin, store, mp, "--restart-limit", strconv.Itoa(limit), "--log-format", "json")
	w := waitWorker(t, mp, 0)
	for crash := 1; ; crash++ {
		if err := syscall.Kill(w.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		restarts, gaveUp := waitRestartDecisions(t, log, crash)
		if gaveUp {
			if crash != limit || restarts != limit-1 {
				t.Fatalf("--restart-limit %d: the supervisor gave up at crash %d after %d restarts; want it to give up at crash %d after %d", limit, crash, restarts, limit, limit-1)
			}
			break
		}
		if crash >= limit {
			t.Fatalf("--restart-limit %d: the supervisor restarted the worker after crash %d (%d restarts); want it to give up at crash %d after %d restarts", limit, crash, restarts, limit, limit-1)
		}
		w = waitWorker(t, mp, w.pid)
	}
	if cur, _ := findWorker(mp); cur != nil {
		t.Fatalf("worker %d runs although the supervisor gave up", cur.pid)
	}
	if err := syscall.Kill(w.ppid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitWorker(t, mp, w.pid)
}

// waitRestartDecisions waits until the supervisor has decided about n
// worker crashes (a JSON log), and returns how many it restarted and
// whether it gave up.
func waitRestartDecisions(t *testing.T, log string, n int) (restarts int, gaveUp bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		restarts, gaveUp = 0, false
		for _, l := range strings.Split(string(b), "\n") {
			var rec struct{ Msg string }
			if json.Unmarshal([]byte(l), &rec) != nil {
				continue
			}
			switch {
			case rec.Msg == "restarting the worker":
				restarts++
			case strings.HasPrefix(rec.Msg, "not restarting the worker"):
				gaveUp = true
			}
		}
		if restarts+btoi(gaveUp) >= n {
			return restarts, gaveUp
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s the log shows decisions about %d of %d crashes:\n%s", restarts+btoi(gaveUp), n, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
