package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Settings (environment):
//
//	BLOBFS_E2E=1                 run at all (make e2e sets it)
//	BLOBFS_E2E_IMAGE             the image to install (make e2e: bin/blobfs-image.tar); default: made with make image
//	BLOBFS_E2E_CACHE             artifacts cache (default ~/.cache/blobfs-e2e)
//	BLOBFS_E2E_RUN               run directory: cluster state, logs (default /var/lib/blobfs-e2e)
//	BLOBFS_E2E_AZURITE_PORT      Azurite's port (default 10180)
//	BLOBFS_E2E_KEEP=1            leave the cluster running after the tests (debugging; the next run cleans up)
const lockFile = "/run/blobfs-e2e.lock"

// theCluster is the cluster all scenarios share.
var theCluster *cluster

func logf(format string, args ...any) {
	log.Printf("e2e: "+format, args...)
}

func TestMain(m *testing.M) {
	if os.Getenv("BLOBFS_E2E") != "1" {
		fmt.Println("skipping the end-to-end tests: set BLOBFS_E2E=1 (make e2e)")
		os.Exit(0)
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	flag.Parse() // for -test.timeout, read below
	os.Exit(run(m))
}

// testTimeout is go test's -timeout (0: none).
func testTimeout() time.Duration {
	if f := flag.Lookup("test.timeout"); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			if d, ok := g.Get().(time.Duration); ok {
				return d
			}
		}
	}
	return 0
}

func repoRoot() string {
	wd, _ := os.Getwd() // go test runs in deploy/e2e
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(m *testing.M) (code int) {
	if os.Geteuid() != 0 {
		logf("the end-to-end tests need root (kubelet, mounts, cgroups)")
		return 1
	}
	if runtime.GOOS != "linux" {
		logf("the end-to-end tests need Linux")
		return 1
	}
	home, _ := os.UserHomeDir()
	cacheDir, _ := filepath.Abs(envOr("BLOBFS_E2E_CACHE", filepath.Join(home, ".cache", "blobfs-e2e")))
	runDir, _ := filepath.Abs(envOr("BLOBFS_E2E_RUN", "/var/lib/blobfs-e2e"))
	for what, dir := range map[string]string{"BLOBFS_E2E_CACHE": cacheDir, "BLOBFS_E2E_RUN": runDir} {
		if err := checkDir(what, dir); err != nil {
			logf("%v", err)
			return 1
		}
	}
	port, err := strconv.Atoi(envOr("BLOBFS_E2E_AZURITE_PORT", "10180"))
	if err != nil {
		logf("BLOBFS_E2E_AZURITE_PORT: %v", err)
		return 1
	}

	// One run per machine: the cluster uses fixed ports and kubelet
	// owns the machine's pod cgroups. The kernel drops the lock when this
	// process dies, however it dies.
	lock, err := os.OpenFile(lockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		logf("lock: %v", err)
		return 1
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("another end-to-end run holds %s (%v); one run per machine", lockFile, err)
		return 1
	}

	if err := checkNoOtherKubelet(cacheDir); err != nil {
		logf("%v", err)
		return 1
	}
	start := time.Now()
	if errs := cleanUp(runDir, cacheDir); len(errs) > 0 {
		logf("could not clean up after an earlier run: %v", errors.Join(errs...))
		return 1
	}
	logDir := filepath.Join(runDir, "logs")
	os.RemoveAll(logDir + ".previous")
	os.Rename(logDir, logDir+".previous")
	for _, d := range []string{logDir, filepath.Join(runDir, "pids"), filepath.Join(runDir, "state", "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			logf("%v", err)
			return 1
		}
	}
	if err := recordCreatedPaths(filepath.Join(runDir, "created-paths")); err != nil {
		logf("%v", err)
		return 1
	}
	if err := saveSysctls(filepath.Join(runDir, "sysctls.json")); err != nil {
		logf("%v", err)
		return 1
	}

	c := &cluster{
		runDir: runDir, stateDir: filepath.Join(runDir, "state"), logDir: logDir,
		procs:       &processes{pidDir: filepath.Join(runDir, "pids"), logDir: logDir, byName: map[string]*process{}},
		azuritePort: port, azuriteURL: fmt.Sprintf("http://%s:%d/devstoreaccount1", bridgeIP, port),
		kubeletDir: kubeletRoot,
	}
	host, _ := os.Hostname()
	c.node = strings.ToLower(host)
	theCluster = c

	keep := os.Getenv("BLOBFS_E2E_KEEP") == "1"
	var tornDown sync.Once
	teardown := func(code int) int {
		tornDown.Do(func() {
			if code != 0 {
				c.dumpDiagnostics()
			}
			if keep {
				logf("BLOBFS_E2E_KEEP=1: the cluster keeps running (KUBECONFIG=%s); the next run cleans up", c.adminKubeconfig)
				return
			}
			c.down()
			if errs := cleanUp(runDir, cacheDir); len(errs) > 0 {
				logf("LEFT BEHIND: %v", errors.Join(errs...))
				code = 1
			} else {
				logf("torn down: no process, mount, cgroup or socket left (logs in %s)", logDir)
			}
			logf("total %s", time.Since(start).Round(time.Second))
		})
		return code
	}
	defer func() { code = teardown(code) }()
	// go test's -timeout panics without running deferred calls, and ^C
	// or a cancelled CI job kills: tear down (and explain) first.
	emergency := func(why string) {
		logf("%s: printing diagnostics and tearing down", why)
		teardown(1)
		os.Exit(1)
	}
	if d := testTimeout(); d > 5*time.Minute {
		time.AfterFunc(d-2*time.Minute, func() { emergency(fmt.Sprintf("2 minutes before go test's -timeout %s", d)) })
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		emergency("got " + s.String())
	}()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	art, err := ensureArtifacts(cacheDir, repoRoot())
	if err != nil {
		logf("%v", err)
		return 1
	}
	c.art = art
	logf("artifacts ready after %s", time.Since(start).Round(time.Second))
	if err := c.up(ctx); err != nil {
		logf("cluster: %v", err)
		return 1
	}
	logf("cluster up after %s", time.Since(start).Round(time.Second))
	if err := c.setUpBlobfs(ctx); err != nil {
		logf("blobfs: %v", err)
		return 1
	}
	logf("blobfs driver registered after %s; running the scenarios", time.Since(start).Round(time.Second))
	return m.Run()
}

// down stops the cluster in order: pods first (so that kubelet unpublishes
// and unstages their volumes through the driver), then the driver, then
// kubelet and the control plane. cleanUp removes whatever remains.
func (c *cluster) down() {
	if c.adminKubeconfig != "" && c.procs.get("kube-apiserver") != nil && !c.procs.get("kube-apiserver").exited() {
		// kubelet needs the driver to unmount the pods' volumes: a test
		// that stopped in the middle of a restart may have left it down.
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		if err := c.ensureDriverUp(ctx); err != nil {
			logf("driver not up for the pods' deletion: %v", err)
		}
		cancel()
		if out, err := c.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true", "--timeout=120s"); err != nil {
			logf("deleting pods: %v: %s", err, out)
		}
		c.kubectl("delete", "pvc", "--all", "-n", "default", "--wait=false")
	}
	// blobfs's own pods stop with kubelet's containers below: with no
	// volume left there is nothing for them to hand over.
	order := []string{"kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}
	for _, n := range order {
		if p := c.procs.get(n); p != nil {
			p.stop(syscall.SIGTERM, 30*time.Second)
		}
	}
	// Containers: kill their tasks while containerd still runs, so that
	// the shims exit; cleanUp kills anything that remains.
	if p := c.procs.get("containerd"); p != nil && !p.exited() {
		if out, err := c.ctr("tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				c.ctr("tasks", "kill", "-s", "SIGKILL", id)
			}
			for _, id := range strings.Fields(out) {
				c.ctr("tasks", "rm", "-f", id)
			}
		}
		p.stop(syscall.SIGTERM, 30*time.Second)
	}
}

// dumpDiagnostics prints what a CI log needs to explain a failure: the
// tails of the component logs, the objects and the events.
func (c *cluster) dumpDiagnostics() {
	fmt.Fprintln(os.Stderr, "\n======== end-to-end diagnostics ========")
	if c.adminKubeconfig != "" {
		for _, args := range [][]string{
			{"get", "nodes,csinodes,csidrivers,storageclasses,pv", "-o", "wide"},
			{"get", "pods,pvc,daemonsets,deployments", "-A", "-o", "wide"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		} {
			out, err := c.kubectl(args...)
			fmt.Fprintf(os.Stderr, "---- kubectl %s (%v)\n%s\n", strings.Join(args, " "), err, lastLines(out, 60))
		}
		c.dumpComponentLogs()
	}
	tails := []struct {
		name  string
		lines int
	}{{"node-plugin", 100}, {"node-plugin-2", 60}, {"keeper", 40}, {"keeper-2", 30}, {"registrar", 40}, {"controller-plugin", 40},
		{"kubelet", 120}, {"containerd", 40}, {"kube-controller-manager", 30}, {"kube-apiserver", 20}, {"etcd", 10}}
	for _, t := range tails {
		b, err := os.ReadFile(filepath.Join(c.logDir, t.name+".log"))
		if err != nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "---- last %d lines of %s.log\n%s\n", t.lines, t.name, lastLines(string(b), t.lines))
	}
	fmt.Fprintf(os.Stderr, "======== full logs: %s ========\n", c.logDir)
}
