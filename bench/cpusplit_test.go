package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCPUSplit: a store process pinned by the split runs on the store's
// CPU only, with every thread; this process's threads, and a process it
// starts afterwards, run on the clients' CPUs; release gives this process
// every CPU again, the first store the CPUs it had, and a store started
// since (a fresh Azurite) every CPU.
func TestCPUSplit(t *testing.T) {
	split, err := newCPUSplit()
	if err != nil {
		t.Skipf("no split here: %v", err)
	}
	if split.store.Count() != 1 || split.clients.Count() != split.all.Count()-1 {
		t.Fatalf("split %s of %s: want one CPU for the store and the rest for the clients", split, cpuList(&split.all))
	}
	spin := func() storeProc {
		t.Helper()
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
		return storeProc{pid: cmd.Process.Pid}
	}
	store := spin()
	defer split.release(store)
	// The store had fewer CPUs than this process (a shared Azurite on
	// CPUs of its own): release gives it those back, not this process's.
	had := split.clients
	if err := setProcessAffinity(store.pid, &had); err != nil {
		t.Fatal(err)
	}

	if err := split.pinStore(store); err != nil {
		t.Fatal(err)
	}
	if err := threadsOnCPUs(store.pid, &split.store); err != nil {
		t.Error(err)
	}
	time.Sleep(200 * time.Millisecond)
	if cpu, err := lastCPU(store.pid); err != nil {
		t.Error(err)
	} else if !split.store.IsSet(cpu) {
		t.Errorf("the store ran on CPU %d, not the store's %s", cpu, cpuList(&split.store))
	}

	if err := split.pinClients(); err != nil {
		t.Fatal(err)
	}
	if err := threadsOnCPUs(os.Getpid(), &split.clients); err != nil {
		t.Error(err)
	}
	fresh := spin() // as -fresh-azurite's, started by a pinned client
	if err := threadsOnCPUs(fresh.pid, &split.clients); err != nil {
		t.Errorf("a process started by a pinned client: %v", err)
	}
	if err := split.pinStore(fresh); err != nil {
		t.Fatal(err)
	}
	if err := threadsOnCPUs(fresh.pid, &split.store); err != nil {
		t.Error(err)
	}

	if err := split.release(fresh); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{os.Getpid(), fresh.pid} {
		if err := threadsOnCPUs(pid, &split.all); err != nil {
			t.Errorf("after release: %v", err)
		}
	}
	if err := split.release(store); err != nil {
		t.Fatal(err)
	}
	if err := threadsOnCPUs(store.pid, &had); err != nil {
		t.Errorf("the first store after release: %v", err)
	}
	if err := split.release(storeProc{pid: 1 << 30}); err != nil {
		t.Errorf("release with a store that is gone: %v", err)
	}
}

// threadsOnCPUs checks that every thread of process pid may run on the
// CPUs of want, and on no other.
func threadsOnCPUs(pid int, want *unix.CPUSet) error {
	tids, err := processThreads(pid)
	if err != nil {
		return err
	}
	for _, tid := range tids {
		var got unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &got); err != nil {
			return fmt.Errorf("thread %d of %d: %w", tid, pid, err)
		}
		if got != *want {
			return fmt.Errorf("thread %d of %d may run on CPU %s, want %s", tid, pid, cpuList(&got), cpuList(want))
		}
	}
	return nil
}

// lastCPU reads the CPU that process pid last ran on (field 39 of its
// stat).
func lastCPU(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields from the state (field 3) on: field 39 is index 36.
	fields := statFields(string(b))
	if len(fields) < 37 {
		return 0, fmt.Errorf("short stat of %d: %q", pid, strings.TrimSpace(string(b)))
	}
	return strconv.Atoi(fields[36])
}
