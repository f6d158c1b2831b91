package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLoopbackPort(t *testing.T) {
	cases := []struct {
		endpoint string
		port     int
		ok       bool
	}{
		{"http://127.0.0.1:10000/devstoreaccount1", 10000, true},
		{"http://localhost:10006/devstoreaccount1", 10006, true},
		{"http://[::1]:7777/acct", 7777, true},
		{"http://127.0.0.1/devstoreaccount1", 80, true},
		{"https://localhost/acct", 443, true},
		// Not on this machine: there is no process to read.
		{"https://acct.blob.core.windows.net/", 0, false},
		{"http://10.0.0.5:10000/devstoreaccount1", 0, false},
		{"::not a url", 0, false},
	}
	for _, c := range cases {
		port, ok := loopbackPort(c.endpoint)
		if port != c.port || ok != c.ok {
			t.Errorf("loopbackPort(%q) = %d, %v; want %d, %v", c.endpoint, port, ok, c.port, c.ok)
		}
	}
}

func TestListeningInodes(t *testing.T) {
	// Rows as the kernel writes them; port 10006 is 2716 in hex.
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2716 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 00000000:2716 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0
   2: 0500000A:2716 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 0100007F:2716 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 100 0 0 10 0
   4: 0100007F:2717 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1005 1 0000000000000000 100 0 0 10 0
`
	// 1001: 127.0.0.1, 1002: 0.0.0.0, listening; 1003 on 10.0.0.5 is
	// someone else's; 1004 is a connection, 1005 another port.
	if got, want := listeningInodes(strings.NewReader(tcp), 10006), []string{"1001", "1002"}; !slices.Equal(got, want) {
		t.Errorf("tcp: %v, want %v", got, want)
	}
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2716 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:2716 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:2716 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2003 1 0000000000000000 100 0 0 10 0
   3: B80D0120000000000000000001000000:2716 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2004 1 0000000000000000 100 0 0 10 0
`
	// ::1, ::, ::ffff:127.0.0.1; not 2001:db8::1.
	if got, want := listeningInodes(strings.NewReader(tcp6), 10006), []string{"2001", "2002", "2003"}; !slices.Equal(got, want) {
		t.Errorf("tcp6: %v, want %v", got, want)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with ") " in it, as a process may name itself;
	// utime 250, stime 130 ticks, start 987654.
	stat := "4242 (node) (x) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 130 0 0 20 0 11 0 987654 1234567 890 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
	cpu, start, ok := parseStat(stat)
	if !ok || cpu != 3800*time.Millisecond || start != 987654 {
		t.Errorf("parseStat = %v, %d, %v; want 3.8s, 987654, true", cpu, start, ok)
	}
	for _, bad := range []string{"", "4242 node S 1", "4242 (node) S 1 2 3"} {
		if _, _, ok := parseStat(bad); ok {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

// TestStoreCPUFindsListener: the meter finds the process listening on the
// endpoint's port (this test, here) and reads its CPU time, which agrees
// with what getrusage says this process used.
func TestStoreCPUFindsListener(t *testing.T) {
	for _, network := range []struct{ addr, host string }{{"127.0.0.1:0", "127.0.0.1"}, {"[::1]:0", "[::1]"}} {
		l, err := net.Listen("tcp", network.addr)
		if err != nil {
			if network.host == "[::1]" {
				t.Logf("no IPv6 loopback here: %v", err)
				continue
			}
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		a := &azureEnv{endpoint: "http://" + network.host + ":" + strconv.Itoa(port) + "/devstoreaccount1"}
		proc, before, ok := a.storeCPU()
		if !ok || proc.pid != os.Getpid() {
			t.Fatalf("%s: storeCPU = pid %d, ok %v; want this process, %d", network.addr, proc.pid, ok, os.Getpid())
		}
		ruBefore := rusageCPU(t)
		// Spin until getrusage says 300 ms of CPU went by (30 ticks).
		for deadline := time.Now().Add(10 * time.Second); rusageCPU(t)-ruBefore < 300*time.Millisecond; {
			if time.Now().After(deadline) {
				t.Fatal("300 ms of CPU took more than 10 s")
			}
		}
		again, after, ok := a.storeCPU()
		ruUsed := rusageCPU(t) - ruBefore
		if !ok || again != proc {
			t.Fatalf("%s: second reading: %+v, ok %v; want %+v", network.addr, again, ok, proc)
		}
		// /proc counts in ticks of 10 ms; other goroutines of the test
		// binary (the GC) run meanwhile too.
		if used := after - before; used < ruUsed-50*time.Millisecond || used > ruUsed+200*time.Millisecond {
			t.Errorf("%s: /proc says %v of CPU, getrusage %v", network.addr, used, ruUsed)
		}
		l.Close()
		if proc, _, ok := a.storeCPU(); ok {
			t.Fatalf("%s: storeCPU found pid %d on a closed port", network.addr, proc.pid)
		}
	}
}

func rusageCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestStoreCPUSuffix(t *testing.T) {
	cases := []struct {
		used, loop time.Duration
		loopOK     bool
		phase      time.Duration
		want       string
	}{
		{8710 * time.Millisecond, 6800 * time.Millisecond, true, 8290 * time.Millisecond, "  (Azurite CPU 8.71 s, main thread busy 82%)"},
		// Ticks of 10 ms: a thread busy all along can read a tick over.
		{1010 * time.Millisecond, 1010 * time.Millisecond, true, time.Second, "  (Azurite CPU 1.01 s, main thread busy 100%)"},
		{0, 0, true, time.Second, "  (Azurite CPU 0.00 s, main thread busy 0%)"},
		// The thread not readable, or a phase too short for ticks of
		// 10 ms to tell its share within a few points: the CPU alone.
		{3620 * time.Millisecond, 0, false, 4 * time.Second, "  (Azurite CPU 3.62 s)"},
		{3620 * time.Millisecond, time.Second, true, 0, "  (Azurite CPU 3.62 s)"},
		{250 * time.Millisecond, 200 * time.Millisecond, true, 999 * time.Millisecond, "  (Azurite CPU 0.25 s)"},
		// The share is of the phase, whatever the CPU was metered over
		// (a mount's side: its mount and unmount too).
		{2500 * time.Millisecond, 1500 * time.Millisecond, true, 2 * time.Second, "  (Azurite CPU 2.50 s, main thread busy 75%)"},
	}
	for _, c := range cases {
		if got := storeCPUSuffix(c.used, c.loop, c.loopOK, c.phase); got != c.want {
			t.Errorf("storeCPUSuffix(%v, %v, %v, %v) = %q, want %q", c.used, c.loop, c.loopOK, c.phase, got, c.want)
		}
	}
}

// TestMainThreadCPU: the meter reads a process's main thread, not the
// process: of a shell spinning on its one thread, the main thread used
// about all the CPU the process did; of a process spinning on another
// thread, next to none of it; of a sleeping shell, none.
//
// There is no bar on the share of wall time: on a loaded machine a
// spinner gets whatever share the scheduler gives it (a run next to other
// test binaries read 0.18 of a CPU). The readings end once each spinner
// has used a set amount of CPU, however long that takes, and each main
// thread is compared with its own process over the same interval. The
// share of wall time the benchmark prints is storeCPUSuffix's (tested with
// fixed inputs above), and the tick's unit TestStoreCPUFindsListener's.
func TestMainThreadCPU(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	offMain := exec.Command(self)
	offMain.Env = append(os.Environ(), spinOffMainEnv+"=1")
	// mainMin and mainMax bound a spinner's main thread's CPU as a share
	// of its process's, over the same interval.
	procs := []struct {
		name             string
		cmd              *exec.Cmd
		spin             bool
		mainMin, mainMax float64
	}{
		// The two readings of a pair are a moment apart, in which the
		// spinner may run: a half is plenty of room either way.
		{"spinning shell", exec.Command("sh", "-c", "echo ready; while :; do :; done"), true, 0.5, 2},
		{"spinning off its main thread", offMain, true, 0, 0.1},
		{"sleeping shell", exec.Command("sh", "-c", "echo ready; exec sleep 600"), false, 0, 0},
	}
	type reading struct{ main, process time.Duration }
	read := func(p storeProc) reading {
		t.Helper()
		main, ok := p.mainThreadCPU()
		_, process, ok2 := p.cpu()
		if !ok || !ok2 {
			t.Fatalf("process %d: not readable", p.pid)
		}
		return reading{main, process}
	}
	started := make([]storeProc, len(procs))
	for i, c := range procs {
		out, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		})
		// Past its start-up (a Go runtime's is on its main thread too):
		// it says so once it spins or sleeps.
		if line, err := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
			t.Fatalf("%s: %q, %v; want ready", c.name, line, err)
		}
		started[i] = storeProc{pid: c.cmd.Process.Pid}
	}
	before := make([]reading, len(procs))
	for i := range procs {
		before[i] = read(started[i])
	}
	// The event: each spinner has used this much CPU since.
	const used = 300 * time.Millisecond
	deadline := time.Now().Add(2 * time.Minute)
	for i, c := range procs {
		for c.spin && read(started[i]).process-before[i].process < used {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not %v of CPU in 2 minutes", c.name, used)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i, c := range procs {
		after := read(started[i])
		main, process := after.main-before[i].main, after.process-before[i].process
		if !c.spin {
			// A tick of 10 ms either side at most.
			if main > 20*time.Millisecond || process > 20*time.Millisecond {
				t.Errorf("%s: main thread used %v, the process %v, while the spinners used %v each; want none", c.name, main, process, used)
			}
			continue
		}
		if share := float64(main) / float64(process); share < c.mainMin || share > c.mainMax {
			t.Errorf("%s: main thread used %v of the process's %v (%.2f), want %.1f-%.1f of it", c.name, main, process, share, c.mainMin, c.mainMax)
		}
	}
	if _, ok := (storeProc{pid: 1 << 30}).mainThreadCPU(); ok {
		t.Error("a process that does not exist was read")
	}
}

// spinOffMainEnv makes this test binary, started again, spin on a thread
// other than its main one, which it parks (spinOffMainChild).
const spinOffMainEnv = "BLOBFS_BENCH_TEST_SPIN_OFF_MAIN"

func init() {
	if os.Getenv(spinOffMainEnv) == "1" {
		// In init, this keeps the main goroutine on the main thread, so
		// that the spinner below runs on another.
		runtime.LockOSThread()
	}
}

// spinOffMainChild, in the child TestMainThreadCPU starts, spins on
// another thread while the main thread sleeps, until it is killed.
func spinOffMainChild() {
	if os.Getenv(spinOffMainEnv) != "1" {
		return
	}
	go func() {
		for {
		}
	}()
	fmt.Println("ready")
	select {}
}
