package bench

import (
	"net"
	"os"
	"strconv"
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

// TestStoreCPUFindsListener: the meter finds the process listening on the
// endpoint's port (this test, here) and reads a CPU time that grows as
// the process works.
func TestStoreCPUFindsListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	a := &azureEnv{endpoint: "http://127.0.0.1:" + strconv.Itoa(port) + "/devstoreaccount1"}
	pid, before, ok := a.storeCPU()
	if !ok || pid != os.Getpid() {
		t.Fatalf("storeCPU = pid %d, ok %v; want this process, %d", pid, ok, os.Getpid())
	}
	// Spin for a little over a clock tick's worth of CPU several times over.
	deadline := time.Now().Add(200 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	_, after, ok := a.storeCPU()
	if !ok || after <= before {
		t.Fatalf("CPU went from %v to %v (ok %v) over 200 ms of spinning", before, after, ok)
	}
	l.Close()
	if pid, _, ok := a.storeCPU(); ok {
		t.Fatalf("storeCPU found pid %d on a closed port", pid)
	}
	_ = x
}
