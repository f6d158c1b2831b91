package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A process the harness started: its output goes to logs/NAME.log and its
// pid to pids/NAME.pid (with its executable, so that a later run that
// cleans up after a killed one kills only what is still that program).
type process struct {
	name    string
	pidFile string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and was reaped
	err     error         // its exit status, once done is closed
}

type processes struct {
	pidDir, logDir string
	mu             sync.Mutex
	byName         map[string]*process
}

func (ps *processes) start(name string, env []string, path string, args ...string) (*process, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.byName[name]; p != nil && !p.exited() {
		return nil, fmt.Errorf("%s is already running (pid %d)", name, p.cmd.Process.Pid)
	}
	logPath := filepath.Join(ps.logDir, name+".log")
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	fmt.Fprintf(out, "==== %s started: %s %s\n", time.Now().Format(time.RFC3339), path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a ^C to the test does not reach it; the
	// harness stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, pidFile: filepath.Join(ps.pidDir, name+".pid"), logPath: logPath, cmd: cmd, done: make(chan struct{})}
	exe, _ := filepath.Abs(path)
	if err := os.WriteFile(p.pidFile, []byte(fmt.Sprintf("%d %s\n", cmd.Process.Pid, exe)), 0o644); err != nil {
		cmd.Process.Kill()
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	ps.byName[name] = p
	logf("started %s (pid %d)", name, cmd.Process.Pid)
	return p, nil
}

func (ps *processes) get(name string) *process {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.byName[name]
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig and waits up to grace for the exit; then SIGKILL.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if p.exited() {
		os.Remove(p.pidFile)
		return
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		logf("%s (pid %d) did not exit %s after %v; killing it", p.name, p.pid(), grace, sig)
		p.cmd.Process.Kill()
		<-p.done
	}
	os.Remove(p.pidFile)
	logf("stopped %s (pid %d): %v", p.name, p.pid(), p.err)
}

// kill is SIGKILL and wait: what a crash or the OOM killer does.
func (p *process) kill() { p.stop(syscall.SIGKILL, time.Minute) }

// killRecorded kills the processes named in pid files of an earlier run,
// if they still run the recorded executable.
func killRecorded(pidDir string) {
	files, _ := filepath.Glob(filepath.Join(pidDir, "*.pid"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		fields := strings.Fields(string(b))
		if len(fields) == 2 {
			pid, _ := strconv.Atoi(fields[0])
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && pid > 1 && exe == fields[1] {
				logf("leftover %s (pid %d): killing it", filepath.Base(f), pid)
				syscall.Kill(pid, syscall.SIGKILL)
				waitGone(pid, 30*time.Second)
			}
		}
		os.Remove(f)
	}
}

// processesUnder lists processes whose executable lies under one of dirs:
// everything this harness runs (containerd's shims, a keeper started by a
// driver) lives in the cache or the run directory.
func processesUnder(dirs ...string) map[int]string {
	found := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if strings.HasPrefix(exe, d+"/") {
				found[pid] = exe
			}
		}
	}
	return found
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			return true
		}
		// A zombie child of ours counts as gone.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}
