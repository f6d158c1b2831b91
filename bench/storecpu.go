package bench

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// storeCPU reports the CPU time the process serving the Azurite endpoint
// has used so far, when that process is on this machine and readable
// (found anew at every call: -fresh-azurite replaces it). A figure's
// time on Azurite is mostly Azurite's own: it answers on one JavaScript
// thread, which shares the machine's CPUs with the client. How much of
// it a side's requests cost is what tells two request shapes apart
// where the wall times are within the noise, so every timing line on
// Azurite carries it.
func (a *azureEnv) storeCPU() (pid int, cpu time.Duration, ok bool) {
	if a == nil {
		return 0, 0, false
	}
	port, ok := loopbackPort(a.endpoint)
	if !ok {
		return 0, 0, false
	}
	if pid, ok = tcpListener(port); !ok {
		return 0, 0, false
	}
	cpu, ok = processCPU(pid)
	return pid, cpu, ok
}

// loopbackPort returns the port of endpoint when its host is a loopback
// address or localhost.
func loopbackPort(endpoint string) (int, bool) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return 0, false
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		return 0, false
	}
	p := u.Port()
	if p == "" {
		p = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	port, err := strconv.Atoi(p)
	return port, err == nil
}

// tcpListener returns the pid of a process holding a TCP socket that
// listens on port, from /proc/net/tcp{,6} and the processes' fds.
func tcpListener(port int) (int, bool) {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for inode := range listeningInodes(table, port) {
			inodes[inode] = true
		}
	}
	if len(inodes) == 0 {
		return 0, false
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		fds, _ := os.ReadDir(dir + "/fd")
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/fd/" + fd.Name())
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				pid, err := strconv.Atoi(filepath.Base(dir))
				return pid, err == nil
			}
		}
	}
	return 0, false
}

// listeningInodes returns the socket inodes of table's rows in state
// LISTEN (0A) on port.
func listeningInodes(table string, port int) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(table)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
			out[fields[9]] = true
		}
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// processCPU returns the user and system time of pid, all its threads,
// from /proc/PID/stat.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count from the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// storeCPUMeter returns, for an Azurite figure whose Azurite runs on this
// machine, a meter: called before a timed phase, it returns a function
// that, called after it, says how much CPU Azurite used in between, as
// a suffix for the phase's timing line. Otherwise the suffix is empty.
// A side's phase includes its mount and unmount (a few requests).
func (r *runner) storeCPUMeter(fig string) func() func() string {
	none := func() string { return "" }
	if r.az == nil || !slices.Contains(azuriteFigures, fig) {
		return func() func() string { return none }
	}
	return func() func() string {
		pid, before, ok := r.az.storeCPU()
		if !ok {
			return none
		}
		return func() string {
			again, after, ok := r.az.storeCPU()
			if !ok || again != pid {
				// Not readable now, or Azurite restarted in between.
				return ""
			}
			return fmt.Sprintf("  (Azurite CPU %.2f s)", (after - before).Seconds())
		}
	}
}
