package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cpuSetBits is how many CPUs a unix.CPUSet can name.
const cpuSetBits = int(unsafe.Sizeof(unix.CPUSet{})) * 8

// cpuSplit keeps a store on this machine off the clients' CPUs: the store
// process gets the last CPU this process may run on, and this process
// (the SDK sides run in it) and every process it starts (the mounts) get
// the others.
//
// Why: with Azurite on the clients' CPUs, a figure that keeps Azurite busy
// measures how the two share the CPUs as much as the client. Azurite runs
// every request on one JavaScript thread, and on seq-write that thread is
// busy 82-88% of either side's time on these 2-CPU machines, so a client
// can only tie another there. A store of its own, as Azure is to its
// clients, leaves each side to meet its own bound: the store's CPU, or
// the client's.
type cpuSplit struct {
	all, store, clients unix.CPUSet
	// firstStore is the first store process pinned, and storeHad the
	// CPUs it had before: release gives them back.
	firstStore storeProc
	storeHad   unix.CPUSet
}

// newCPUSplit splits the CPUs this process may run on: the last for the
// store, the rest for the clients. It needs two at least.
func newCPUSplit() (*cpuSplit, error) {
	var s cpuSplit
	if err := unix.SchedGetaffinity(0, &s.all); err != nil {
		return nil, fmt.Errorf("read this process's CPUs: %w", err)
	}
	if s.all.Count() < 2 {
		return nil, fmt.Errorf("the store needs a CPU of its own and the clients one at least: this process may run on %d", s.all.Count())
	}
	s.clients = s.all
	for cpu := cpuSetBits - 1; cpu >= 0; cpu-- {
		if s.all.IsSet(cpu) {
			s.store.Set(cpu)
			s.clients.Clear(cpu)
			break
		}
	}
	return &s, nil
}

// String names the split for logs: "store on CPU 1, clients on CPU 0".
func (s *cpuSplit) String() string {
	return fmt.Sprintf("store on CPU %s, clients on CPU %s", cpuList(&s.store), cpuList(&s.clients))
}

// pinClients puts this process's threads on the clients' CPUs.
func (s *cpuSplit) pinClients() error { return setProcessAffinity(os.Getpid(), &s.clients) }

// pinStore puts every thread of the store process p on the store's CPU.
// Pinning one again is harmless: every repetition does.
func (s *cpuSplit) pinStore(p storeProc) error {
	p, _, ok := p.cpu() // with its start time: a later process may get its pid
	if !ok {
		return errors.New("the store's process is gone")
	}
	if s.firstStore.pid == 0 {
		if err := unix.SchedGetaffinity(p.pid, &s.storeHad); err != nil {
			return fmt.Errorf("read the CPUs of the store's process %d: %w", p.pid, err)
		}
		s.firstStore = p
	}
	return setProcessAffinity(p.pid, &s.store)
}

// release gives this process every CPU of the split again, and the store
// process p (zero: none) what it had: the first store pinned gets its own
// CPUs back; a store started since, which inherited the clients' CPUs,
// gets every CPU this process had.
func (s *cpuSplit) release(p storeProc) error {
	err := setProcessAffinity(os.Getpid(), &s.all)
	if p.pid == 0 {
		return err
	}
	set := &s.all
	if now, _, ok := p.cpu(); ok && now == s.firstStore {
		set = &s.storeHad
	}
	if serr := setProcessAffinity(p.pid, set); serr != nil && !errors.Is(serr, os.ErrNotExist) {
		err = errors.Join(err, serr)
	}
	return err
}

// setProcessAffinity sets the CPUs of every thread of process pid. A
// thread takes its CPUs from the thread that starts it, so a thread
// started during a pass by one not yet set may have the old ones: passes
// repeat until one finds no thread it had not set before. A thread that
// ends meanwhile is skipped.
func setProcessAffinity(pid int, set *unix.CPUSet) error {
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tids, err := processThreads(pid)
		if err != nil {
			return err
		}
		fresh := 0
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			fresh++
			if err := unix.SchedSetaffinity(tid, set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("set the CPUs of thread %d of process %d: %w", tid, pid, err)
			}
			done[tid] = true
		}
		if fresh == 0 {
			return nil
		}
	}
	return fmt.Errorf("process %d kept starting threads while its CPUs were set", pid)
}

// processThreads lists the thread ids of process pid.
func processThreads(pid int) ([]int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// cpuList formats a CPU set as its CPU numbers, comma-separated.
func cpuList(set *unix.CPUSet) string {
	out := ""
	for cpu := 0; cpu < cpuSetBits; cpu++ {
		if set.IsSet(cpu) {
			if out != "" {
				out += ","
			}
			out += strconv.Itoa(cpu)
		}
	}
	return out
}
