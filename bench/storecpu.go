package bench

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// storeProc is one process: its pid and its start time (in clock ticks
// since boot), which together tell it from a later process given the
// same pid.
type storeProc struct {
	pid   int
	start uint64
}

// storeCPU reports the CPU time the process serving the Azurite endpoint
// has used so far, when that process is on this machine and readable
// (found anew at every call: -fresh-azurite replaces it). A figure's
// time on Azurite is mostly Azurite's own: its JavaScript runs on one
// thread (its CPU time can exceed the wall time by a tenth or so: the
// garbage collector's and I/O threads), and it shares the machine's CPUs
// with the client. How much of it a side's requests cost is what tells
// two request shapes apart where the wall times are within the noise,
// so every timing line of an Azurite figure carries it (storeCPUMeter).
func (a *azureEnv) storeCPU() (storeProc, time.Duration, bool) {
	proc, ok := a.storeProcess()
	if !ok {
		return storeProc{}, 0, false
	}
	return proc.cpu()
}

// storeProcess finds the process listening on the endpoint's loopback
// port.
func (a *azureEnv) storeProcess() (storeProc, bool) {
	if a == nil {
		return storeProc{}, false
	}
	port, ok := loopbackPort(a.endpoint)
	if !ok {
		return storeProc{}, false
	}
	pid, ok := tcpListener(port)
	return storeProc{pid: pid}, ok
}

// cpu reads the process's CPU time so far and returns it with the
// process as it is now (its start time filled in).
func (p storeProc) cpu() (storeProc, time.Duration, bool) {
	cpu, start, ok := readStat(fmt.Sprintf("/proc/%d/stat", p.pid))
	if !ok {
		return storeProc{}, 0, false
	}
	return storeProc{p.pid, start}, cpu, true
}

// mainThreadCPU reads the CPU time of the process's main thread (the
// thread whose id is the pid) so far: Azurite's JavaScript event loop,
// which parses, authorises and stores every request on that one thread.
func (p storeProc) mainThreadCPU() (time.Duration, bool) {
	cpu, _, ok := readStat(fmt.Sprintf("/proc/%d/task/%d/stat", p.pid, p.pid))
	return cpu, ok
}

// readStat reads a /proc stat file (a process's or a thread's) and
// parses it.
func readStat(path string) (cpu time.Duration, start uint64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	return parseStat(string(b))
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
// listens on port on a loopback or wildcard address, from
// /proc/net/tcp{,6} and the processes' fds.
func tcpListener(port int) (int, bool) {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		for _, inode := range listeningInodes(f, port) {
			inodes[inode] = true
		}
		f.Close()
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

// listeningInodes returns the socket inodes of the rows of a
// /proc/net/tcp or tcp6 table in state LISTEN (0A) on port, on a
// loopback or wildcard address: a socket on another address (a
// container's proxy on the host's, say) is not the endpoint's.
func listeningInodes(table io.Reader, port int) []string {
	var out []string
	sc := bufio.NewScanner(table)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		hexIP, hexPort, ok := strings.Cut(fields[1], ":")
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if !ok || err != nil || int(p) != port {
			continue
		}
		if ip, ok := procNetIP(hexIP); ok && (ip.IsLoopback() || ip.IsUnspecified()) {
			out = append(out, fields[9])
		}
	}
	return out
}

// procNetIP decodes an address of /proc/net/tcp{,6}: the bytes in hex,
// each 32-bit word in the machine's order, little-endian on every
// machine this runs on.
func procNetIP(s string) (net.IP, bool) {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return nil, false
	}
	for w := 0; w < len(b); w += 4 {
		slices.Reverse(b[w : w+4])
	}
	return net.IP(b), true
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go runs on.
const clockTicks = 100

// parseStat returns the user plus system time of all the threads of a
// process, and its start time, from the text of /proc/PID/stat.
func parseStat(stat string) (cpu time.Duration, start uint64, ok bool) {
	// utime, stime and starttime are fields 14, 15 and 22.
	fields := statFields(stat)
	if len(fields) < 20 {
		return 0, 0, false
	}
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	start, err3 := strconv.ParseUint(fields[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, start, true
}

// storeCPUMeter returns, for an Azurite figure whose Azurite runs on this
// machine, a meter: called before a timed phase, it returns a function
// that, called after it with the phase's time, says how much CPU Azurite
// used in between, and for how much of the phase its main thread was
// running, as a suffix for the phase's timing line. Otherwise the suffix
// is empty.
//
// The main thread's share tells whether a figure measured the client or
// Azurite: a side whose requests kept the event loop running most of the
// time was waiting for Azurite, whatever the client did meanwhile.
//
// The share is of the phase's time, not of the time between the two
// calls: a mount's side is metered around its mount, settle and unmount
// as well (Azurite's CPU covers those too), where Azurite is mostly idle,
// and dividing by that longer time made a mount's share read lower than
// an SDK side's for the same work. What Azurite's main thread does
// outside the phase for a mount (a request or two) is within the ticks'
// error.
func (r *runner) storeCPUMeter(fig string) func() func(phase time.Duration) string {
	none := func(time.Duration) string { return "" }
	if r.az == nil || !slices.Contains(azuriteFigures, fig) {
		return func() func(time.Duration) string { return none }
	}
	return func() func(time.Duration) string {
		proc, before, ok := r.az.storeCPU()
		if !ok {
			return none
		}
		loopBefore, loopOK := proc.mainThreadCPU()
		return func(phase time.Duration) string {
			// The same process, if it still runs: no second search.
			again, after, ok := proc.cpu()
			if !ok || again != proc || after < before {
				// Not readable now, or Azurite restarted in between.
				return ""
			}
			loopAfter, ok := proc.mainThreadCPU()
			loopOK = loopOK && ok && loopAfter >= loopBefore
			return storeCPUSuffix(after-before, loopAfter-loopBefore, loopOK, phase)
		}
	}
}

// minSharePhase: the shortest phase whose main-thread share is printed
// (two readings a tick of 10 ms off: 2 points at 1 s).
const minSharePhase = time.Second

// storeCPUSuffix formats the meter's reading: the CPU time the process
// used, and, if known (loopOK), its main thread's share of the phase's
// time. /proc counts in ticks of 10 ms, and each of the two readings can
// be a tick off either way: over a phase shorter than minSharePhase that
// is more than a few points, so the share is left out; it is capped at
// 100%.
func storeCPUSuffix(used, loop time.Duration, loopOK bool, phase time.Duration) string {
	if !loopOK || phase < minSharePhase {
		return fmt.Sprintf("  (Azurite CPU %.2f s)", used.Seconds())
	}
	busy := min(float64(loop)/float64(phase), 1)
	return fmt.Sprintf("  (Azurite CPU %.2f s, main thread busy %.0f%%)", used.Seconds(), 100*busy)
}
