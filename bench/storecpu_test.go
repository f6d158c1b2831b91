package bench

import (
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

// TestMainThreadCPU: the main thread of a process spinning on it reads as
// busy about all the time, that of a sleeping one as idle, and that of a
// process spinning on another thread as idle while the process is busy:
// the meter reads the main thread, not the process.
func TestMainThreadCPU(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	offMain := exec.Command(self)
	offMain.Env = append(os.Environ(), spinOffMainEnv+"=1")
	for _, c := range []struct {
		name             string
		cmd              *exec.Cmd
		mainMin, mainMax float64
		processMin       float64
	}{
		{"spinning shell", exec.Command("sh", "-c", "while :; do :; done"), 0.2, 1.1, 0.2},
		{"sleeping shell", exec.Command("sh", "-c", "sleep 30"), 0, 0.1, 0},
		{"spinning off its main thread", offMain, 0, 0.1, 0.2},
	} {
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		proc := storeProc{pid: c.cmd.Process.Pid}
		time.Sleep(100 * time.Millisecond) // past the child's start-up
		mainBefore, ok := proc.mainThreadCPU()
		_, procBefore, ok2 := proc.cpu()
		start := time.Now()
		time.Sleep(500 * time.Millisecond)
		mainAfter, ok3 := proc.mainThreadCPU()
		_, procAfter, ok4 := proc.cpu()
		wall := time.Since(start)
		c.cmd.Process.Kill()
		c.cmd.Wait()
		if !ok || !ok2 || !ok3 || !ok4 {
			t.Fatalf("%s: not readable", c.name)
		}
		// A shared machine (two CPUs, other test binaries running) may
		// hold a spinner off a CPU for much of the time: a fifth is the
		// bar, which a reading that does not move still fails.
		if busy := float64(mainAfter-mainBefore) / float64(wall); busy < c.mainMin || busy > c.mainMax {
			t.Errorf("%s: main thread busy %.2f of %v, want %.1f-%.1f", c.name, busy, wall, c.mainMin, c.mainMax)
		}
		if busy := float64(procAfter-procBefore) / float64(wall); busy < c.processMin {
			t.Errorf("%s: process busy %.2f of %v, want at least %.1f", c.name, busy, wall, c.processMin)
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
	select {}
}
