package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/fusefs"
)

// Cleaning up: the same code runs before a run (after a killed one) and
// after it. Order matters: processes first (by recorded pid, then any
// process of ours the pid files missed, then what is left in kubelet's
// pod cgroups), then mounts (deepest first), then cgroups, then the kernel
// settings kubelet changed, then the files.

// kubeletSysctls are the kernel settings kubelet sets at start-up
// (pkg/kubelet/cm: setupKernelTunables); their values are saved before the
// first start and put back at the end.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	// set by the CNI bridge plugin (isGateway)
	"net/ipv4/ip_forward",
}

// hardCodedPaths are created outside the run directory: by containerd 1.6
// (/run/containerd), and by kubelet and deploy/'s manifests, which name
// the standard kubelet directory and blobfs's cache directory on the node
// (the tests run kubelet with its standard root directory so that the
// manifests apply unchanged). Removed at the end if they did not exist
// before.
var hardCodedPaths = []string{kubeletRoot, "/var/lib/blobfs", "/run/containerd"}

// kubeletRoot is kubelet's root directory, as deploy/ expects it.
const kubeletRoot = "/var/lib/kubelet"

// bridgeName is the test node's pod bridge (cluster_test.go); removed by
// the clean-up.
const bridgeName = "blobfs-e2e0"

func saveSysctls(file string) error {
	if _, err := os.Stat(file); err == nil {
		return nil // an earlier run's originals, not yet put back
	}
	saved := map[string]string{}
	for _, k := range kubeletSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			continue
		}
		saved[k] = strings.TrimSpace(string(b))
	}
	b, _ := json.Marshal(saved)
	return os.WriteFile(file, b, 0o644)
}

func restoreSysctls(file string) []error {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	saved := map[string]string{}
	if err := json.Unmarshal(b, &saved); err != nil {
		return []error{fmt.Errorf("%s: %w", file, err)}
	}
	for k, v := range saved {
		cur, _ := os.ReadFile("/proc/sys/" + k)
		if strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		} else {
			logf("restored sysctl %s = %s (kubelet had set %s)", strings.ReplaceAll(k, "/", "."), v, strings.TrimSpace(string(cur)))
		}
	}
	if len(errs) == 0 {
		os.Remove(file)
	}
	return errs
}

// recordCreatedPaths notes which hard-coded paths do not exist yet.
func recordCreatedPaths(file string) error {
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	var missing []string
	for _, p := range hardCodedPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, p)
		}
	}
	return os.WriteFile(file, []byte(strings.Join(missing, "\n")), 0o644)
}

// mountsUnder lists mount points under any of dirs, deepest first.
func mountsUnder(dirs ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fusefs.UnescapeMountInfo(fields[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	// Reverse mount order, then deeper paths first.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// unmountAll detaches every mount under dirs; stacked mounts need rounds.
func unmountAll(dirs ...string) error {
	for round := 0; round < 20; round++ {
		ms := mountsUnder(dirs...)
		if len(ms) == 0 {
			return nil
		}
		for _, m := range ms {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				logf("unmount %s: %v", m, err)
			}
		}
	}
	if ms := mountsUnder(dirs...); len(ms) > 0 {
		return fmt.Errorf("still mounted after 20 rounds of unmounting: %s", strings.Join(ms, ", "))
	}
	return nil
}

// kubepodsCgroups lists kubelet's pod cgroups (cgroupfs driver) in every
// hierarchy, deepest first.
func kubepodsCgroups() []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if fi, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil && fi.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/kubepods") // cgroup v2
	}
	var dirs []string
	for _, r := range roots {
		filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.SliceStable(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	return dirs
}

// cleanCgroups kills what still runs in kubelet's pod cgroups and removes
// them.
func cleanCgroups() error {
	dirs := kubepodsCgroups()
	killed := map[int]bool{}
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && !killed[pid] {
				killed[pid] = true
				logf("leftover container process %d in %s: killing it", pid, d)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	var last error
	for _, d := range dirs {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if time.Now().After(deadline) {
				last = fmt.Errorf("remove cgroup %s: %w", d, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return last
}

// ourExecutables are the directories that hold every program the
// harness runs: the blobfs under test (copied into the run directory), the
// Kubernetes binaries and the unpacked Debian packages (containerd's shims
// among them).
func ourExecutables(runDir, cacheDir string) []string {
	dirs := []string{filepath.Join(runDir, "state", "bin"), filepath.Join(cacheDir, "kube-"+kubeVersion)}
	debian, _ := filepath.Glob(filepath.Join(cacheDir, "debian-root-*"))
	return append(dirs, debian...)
}

// checkDir refuses a run or cache directory that cleaning up could harm:
// the clean-up unmounts everything under the run directory and kills
// processes run from these directories.
func checkDir(what, dir string) error {
	if !filepath.IsAbs(dir) || strings.Count(filepath.Clean(dir), "/") < 2 {
		return fmt.Errorf("%s %q: use a dedicated directory at least two levels deep, like /var/lib/blobfs-e2e", what, dir)
	}
	return nil
}

// cleanUp removes everything a run (finished or killed) left behind. It
// returns what it could not clean.
func cleanUp(runDir, cacheDir string) []error {
	var errs []error
	killRecorded(filepath.Join(runDir, "pids"))
	ours := ourExecutables(runDir, cacheDir)
	for round := 0; round < 10; round++ {
		left := processesUnder(ours...)
		if len(left) == 0 {
			break
		}
		for pid, exe := range left {
			logf("leftover process %d (%s): killing it", pid, exe)
			syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 10*time.Second)
		}
	}
	if err := cleanCgroups(); err != nil {
		errs = append(errs, err)
	}
	stopAzurite(runDir)

	created, _ := os.ReadFile(filepath.Join(runDir, "created-paths"))
	createdPaths := strings.Fields(string(created))
	// Mounts under kubelet's directory are the run's even when the
	// directory was there before: the run holds the machine's lock, and
	// another kubelet is refused at the start (checkNoOtherKubelet).
	if err := unmountAll(append([]string{runDir, kubeletRoot}, createdPaths...)...); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat("/sys/class/net/" + bridgeName); err == nil {
		if out, err := exec.Command("ip", "link", "del", bridgeName).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %v: %s", bridgeName, err, out))
		}
	}
	errs = append(errs, restoreSysctls(filepath.Join(runDir, "sysctls.json"))...)

	if len(mountsUnder(append([]string{runDir}, createdPaths...)...)) == 0 {
		for _, p := range createdPaths {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, err)
			}
		}
		os.Remove(filepath.Join(runDir, "created-paths"))
		// Never remove through a mount: only once nothing is mounted.
		if err := os.RemoveAll(filepath.Join(runDir, "state")); err != nil {
			errs = append(errs, err)
		}
	}
	if left := processesUnder(ours...); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running: %v", left))
	}
	if cg := kubepodsCgroups(); len(cg) > 0 {
		errs = append(errs, fmt.Errorf("cgroups left: %s", strings.Join(cg, ", ")))
	}
	return errs
}

// stopAzurite stops the Azurite that .ci/azurite.sh started for this run.
func stopAzurite(runDir string) {
	script := filepath.Join(repoRoot(), ".ci", "azurite.sh")
	pidFiles, _ := filepath.Glob(filepath.Join(runDir, "azurite", "azurite-*.pid"))
	for _, f := range pidFiles {
		port := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "azurite-"), ".pid")
		cmd := exec.Command("bash", script, "stop")
		cmd.Env = append(os.Environ(), "AZURITE_PORT="+port, "AZURITE_RUN_DIR="+filepath.Join(runDir, "azurite"))
		if out, err := cmd.CombinedOutput(); err != nil {
			logf("azurite.sh stop: %v: %s", err, out)
		}
	}
}

// checkNoOtherKubelet refuses a machine that runs a kubelet other than a
// run's own: the tests use kubelet's standard directory, whose mounts the
// clean-up removes.
func checkNoOtherKubelet(cacheDir string) error {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || filepath.Base(exe) != "kubelet" || strings.HasPrefix(exe, cacheDir+"/") {
			continue
		}
		return fmt.Errorf("another kubelet runs on this machine (pid %d, %s): the end-to-end tests need a machine of their own", pid, exe)
	}
	return nil
}
