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
// starts afterwards, run on the clients' CPUs; release gives both every
// CPU again.
func TestCPUSplit(t *testing.T) {
	split, err := newCPUSplit()
	if err != nil {
		t.Skipf("no split here: %v", err)
	}
	if split.store.Count() != 1 || split.clients.Count() != split.all.Count()-1 {
		t.Fatalf("split %s of %s: want one CPU for the store and the rest for the clients", split, cpuList(&split.all))
	}
	store := exec.Command("sh", "-c", "while :; do :; done")
	if err := store.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		store.Process.Kill()
		store.Wait()
	}()
	defer split.release(store.Process.Pid)

	if err := split.pinStore(store.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := threadsOnCPUs(store.Process.Pid, &split.store); err != nil {
		t.Error(err)
	}
	time.Sleep(200 * time.Millisecond)
	if cpu, err := lastCPU(store.Process.Pid); err != nil {
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
	child := exec.Command("sleep", "10")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	if err := threadsOnCPUs(child.Process.Pid, &split.clients); err != nil {
		t.Errorf("a process started by a pinned client: %v", err)
	}

	if err := split.release(store.Process.Pid); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{os.Getpid(), store.Process.Pid} {
		if err := threadsOnCPUs(pid, &split.all); err != nil {
			t.Errorf("after release: %v", err)
		}
	}
	if err := split.release(1 << 30); err != nil {
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
