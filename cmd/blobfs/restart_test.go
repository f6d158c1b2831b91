package main

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// These tests prove blobfs's headline promise with real processes: a CSI
// driver serving FUSE mounts in-process, a keeper holding their fds, a
// volume staged and published on Azurite as kubelet does, applications in
// processes of their own, and kill -9.

// restartRig is one node: a keeper, a driver, and a volume on Azurite.
type restartRig struct {
	t                    *testing.T
	bin, dir, kubelet    string
	endpoint, keeperSock string
	cfg                  blobstore.AzureConfig
	volumeID, staging    string
	driver, keeper       *exec.Cmd
	driverLog            *os.File
	conn                 *grpc.ClientConn
	node                 csipb.NodeClient
}

func newRestartRig(t *testing.T) *restartRig {
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	dir := t.TempDir()
	r := &restartRig{t: t, bin: bin, dir: dir, cfg: cfg,
		kubelet:    filepath.Join(dir, "kubelet"),
		endpoint:   "unix://" + filepath.Join(dir, "csi.sock"),
		keeperSock: filepath.Join(dir, "keeper.sock"),
	}
	r.volumeID = fmt.Sprintf("blobfs1#%s#%s#%s", cfg.Account, cfg.Container, cfg.Endpoint)
	r.staging = filepath.Join(r.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io/0123abcd/globalmount")
	if err := os.MkdirAll(r.staging, 0o750); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	r.driverLog = log
	t.Cleanup(r.cleanup)
	return r
}

// cleanup stops what is left, unmounts, and on failure shows the logs.
func (r *restartRig) cleanup() {
	r.stopDriver(syscall.SIGKILL)
	if r.keeper != nil {
		r.keeper.Process.Kill()
		r.keeper.Wait()
	}
	if r.conn != nil {
		r.conn.Close()
	}
	for _, p := range mountsUnder(r.t, r.kubelet) {
		syscall.Unmount(p, syscall.MNT_DETACH)
	}
	if r.t.Failed() {
		if b, err := os.ReadFile(r.driverLog.Name()); err == nil {
			lines := strings.Split(string(b), "\n")
			r.t.Logf("driver and keeper log (last 80 lines):\n%s", strings.Join(lines[max(0, len(lines)-80):], "\n"))
		}
	}
	r.driverLog.Close()
}

func mountsUnder(t *testing.T, dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	slices.Sort(out)
	slices.Reverse(out) // deepest first
	return out
}

// newPublishedRig starts a keeper and a driver, stages the volume and
// publishes it for one pod, whose target it returns.
func newPublishedRig(t *testing.T) (*restartRig, string) {
	r := newRestartRig(t)
	r.startKeeper()
	r.startDriver()
	r.stage()
	target, err := r.publish("pod-a", nil)
	if err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	return r, target
}

func (r *restartRig) startKeeper() {
	r.keeper = exec.Command(r.bin, "keeper", "--socket", r.keeperSock)
	r.keeper.Stderr = r.driverLog
	if err := r.keeper.Start(); err != nil {
		r.t.Fatal(err)
	}
}

func (r *restartRig) killKeeper() {
	r.keeper.Process.Kill()
	r.keeper.Wait()
	r.keeper = nil
}

// startDriver starts `blobfs csi --mode=node` and waits until it is ready
// (Probe), which it is once it has adopted or repaired every mount.
func (r *restartRig) startDriver(extra ...string) time.Duration {
	args := []string{"csi", "--mode=node", "--endpoint=" + r.endpoint, "--node-id=node-1",
		"--kubelet-dir=" + r.kubelet, "--state-dir=" + filepath.Join(r.dir, "state"),
		"--cache-dir=" + filepath.Join(r.dir, "cache"), "--health-interval=1s"}
	if r.keeper != nil {
		args = append(args, "--keeper-socket="+r.keeperSock)
	}
	sock := strings.TrimPrefix(r.endpoint, "unix://")
	before, _ := os.Stat(sock)
	start := time.Now()
	r.driver = exec.Command(r.bin, append(args, extra...)...)
	r.driver.Stderr = r.driverLog
	if err := r.driver.Start(); err != nil {
		r.t.Fatal(err)
	}
	// A driver still running (an upgrade) answers on the socket until the
	// new one, having adopted the mounts, takes the socket's name over.
	deadline := time.Now().Add(2 * time.Minute)
	for before != nil {
		// (Inode numbers are reused at once on some filesystems: the
		// creation time tells a new socket.)
		if now, err := os.Stat(sock); err == nil && (!os.SameFile(before, now) || !now.ModTime().Equal(before.ModTime())) {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatal("the new driver did not take the socket over")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r.conn == nil {
		conn, err := grpc.NewClient(r.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			r.t.Fatal(err)
		}
		r.conn, r.node = conn, csipb.NewNodeClient(conn)
	}
	waitProbeReady(r.t, r.conn, 2*time.Minute)
	return time.Since(start)
}

func waitProbeReady(t *testing.T, conn *grpc.ClientConn, within time.Duration) {
	t.Helper()
	id := csipb.NewIdentityClient(conn)
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p, err := id.Probe(ctx, &csipb.ProbeRequest{})
		cancel()
		if err == nil && p.GetReady().GetValue() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready within %v: %v", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *restartRig) stopDriver(sig syscall.Signal) {
	if r.driver == nil {
		return
	}
	r.driver.Process.Signal(sig)
	exited := make(chan struct{})
	go func() { r.driver.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		// Killed while a thread of its own waited on one of its mounts
		// (the health check's statfs) with the keeper gone: that
		// thread waits for an answer only the dead process could give,
		// and the process cannot finish exiting. The next driver aborts
		// such a connection when it repairs the mount; the rig, which
		// waits for this one first, does the same here.
		r.t.Logf("driver did not exit within 20 s of signal %v: aborting the FUSE connections under the kubelet directory", sig)
		for _, p := range mountsUnder(r.t, r.kubelet) {
			var st unix.Statx_t
			if unix.Statx(unix.AT_FDCWD, p, unix.AT_STATX_DONT_SYNC|unix.AT_SYMLINK_NOFOLLOW, 0, &st) == nil {
				kernel.AbortConnection(st.Dev_major, st.Dev_minor)
			}
		}
		<-exited
	}
	r.driver = nil
}

func (r *restartRig) secrets() map[string]string {
	return map[string]string{"azurestorageaccountname": r.cfg.Account, "azurestorageaccountkey": r.cfg.Key}
}

func mountCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
	}
}

func (r *restartRig) stage() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := likeKubelet(ctx, func() error {
		_, err := r.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
			VolumeId: r.volumeID, StagingTargetPath: r.staging, VolumeCapability: mountCap(), Secrets: r.secrets(),
		})
		return err
	})
	if err != nil {
		r.t.Fatalf("NodeStageVolume: %v", err)
	}
}

// publish publishes the volume for a pod; secrets are what kubelet sends
// with a nodePublishSecretRef (nil for none).
func (r *restartRig) publish(pod string, secrets map[string]string) (string, error) {
	target := filepath.Join(r.kubelet, "pods", pod, "volumes/kubernetes.io~csi/pv-1/mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := likeKubelet(ctx, func() error {
		_, err := r.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: r.volumeID, StagingTargetPath: r.staging, TargetPath: target, VolumeCapability: mountCap(), Secrets: secrets,
		})
		return err
	})
	return target, err
}

// likeKubelet calls rpc again, as kubelet does, while the driver answers
// Aborted: another operation on the volume is in progress (the driver's
// health check of its mounts takes the volume's lock for a moment; under
// load a publish right after a stage met it).
func likeKubelet(ctx context.Context, rpc func() error) error {
	for {
		err := rpc()
		if status.Code(err) != codes.Aborted {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// teardown unpublishes and unstages (uploading what is dirty): afterwards
// nothing may be mounted.
func (r *restartRig) teardown(targets ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// As kubelet does, a call that finds the volume busy (the health
	// check holds its lock while it looks at it) is made again.
	for _, target := range targets {
		if err := likeKubelet(ctx, func() error {
			_, err := r.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: r.volumeID, TargetPath: target})
			return err
		}); err != nil {
			r.t.Fatalf("NodeUnpublishVolume: %v", err)
		}
	}
	if err := likeKubelet(ctx, func() error {
		_, err := r.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: r.volumeID, StagingTargetPath: r.staging})
		return err
	}); err != nil {
		r.t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if left := mountsUnder(r.t, r.kubelet); len(left) > 0 {
		r.t.Fatalf("mounts left after unstage: %v", left)
	}
}

// storeContent returns the sha256 of every file blob in the container.
func (r *restartRig) storeContent() map[string]string {
	store, err := blobstore.NewAzure(r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx := context.Background()
	out := map[string]string{}
	marker := ""
	for {
		page, err := store.List(ctx, blobstore.ListOptions{Marker: marker})
		if err != nil {
			r.t.Fatal(err)
		}
		for _, b := range page.Blobs {
			if b.Metadata["hdi_isfolder"] == "true" {
				continue // a directory's marker
			}
			buf := make([]byte, b.Size)
			if b.Size > 0 {
				if _, err := store.ReadAt(ctx, b.Name, buf, 0, ""); err != nil {
					r.t.Fatalf("read %s: %v", b.Name, err)
				}
			}
			out[b.Name] = sum(buf)
		}
		if marker = page.NextMarker; marker == "" {
			return out
		}
	}
}

// app is one application process.
type app struct {
	cmd     *exec.Cmd
	out     string // manifest file
	stdout  *bufio.Scanner
	ops     []slowOp
	opsDone chan struct{}
	stderr  strings.Builder
}

type slowOp struct{ start, end time.Time }

func startApp(t *testing.T, kind string, env ...string) *app {
	a := &app{out: filepath.Join(t.TempDir(), "manifest.json"), opsDone: make(chan struct{})}
	a.cmd = exec.Command(os.Args[0], "-test.run=^$")
	a.cmd.Env = append(os.Environ(), append([]string{appEnv + "=" + kind, "BLOBFS_TEST_APP_OUT=" + a.out}, env...)...)
	a.cmd.Stderr = &a.stderr
	pipe, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(a.opsDone)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			var start, d int64
			if _, err := fmt.Sscanf(sc.Text(), "op %d %d", &start, &d); err == nil {
				s := time.Unix(0, start)
				a.ops = append(a.ops, slowOp{s, s.Add(time.Duration(d))})
			}
		}
	}()
	t.Cleanup(func() { a.cmd.Process.Kill() })
	return a
}

// wait waits for the app to end and fails the test if it saw an error.
func (a *app) wait(t *testing.T, within time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { <-a.opsDone; done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("application failed (%v): %s", err, a.stderr.String())
		}
	case <-time.After(within):
		a.cmd.Process.Signal(syscall.SIGQUIT)
		t.Fatalf("application did not finish within %v (hung)", within)
	}
}

func (a *app) manifest(t *testing.T) map[string]string {
	b, err := os.ReadFile(a.out)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// pauses returns, for each moment in kills, the longest application
// operation in progress then: the pause the restart caused.
func pauses(apps []*app, kills []time.Time) []time.Duration {
	out := make([]time.Duration, len(kills))
	for i, k := range kills {
		for _, a := range apps {
			for _, op := range a.ops {
				if !op.start.After(k) && !op.end.Before(k) {
					out[i] = max(out[i], op.end.Sub(op.start))
				}
			}
		}
	}
	return out
}

func summary(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("median %v, max %v (n=%d)", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}

func stopFile(t *testing.T) (path string, stop func()) {
	path = filepath.Join(t.TempDir(), "stop")
	return path, func() {
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDriverKilledUnderLoad: applications create, write, append, rename,
// mkdir and unlink with verification while the driver is SIGKILLed at
// random moments and restarted, 20 times. Expected: no application sees an
// error, and afterwards the store holds exactly what they acknowledged.
func TestDriverKilledUnderLoad(t *testing.T) {
	r, target := newPublishedRig(t)
	stopPath, stop := stopFile(t)
	var apps []*app
	for i := range 3 {
		apps = append(apps, startApp(t, "churn", "BLOBFS_TEST_APP_DIR="+target, "BLOBFS_TEST_APP_ROOT="+target,
			fmt.Sprintf("BLOBFS_TEST_APP_ID=w%d", i), fmt.Sprintf("BLOBFS_TEST_APP_SEED=%d", i+1), "BLOBFS_TEST_APP_STOP="+stopPath))
	}
	kills := restartRepeatedly(t, r, 20)
	stop()
	for _, a := range apps {
		a.wait(t, 3*time.Minute)
	}
	t.Logf("application pause per driver restart: %s", summary(pauses(apps, kills)))

	want := map[string]string{}
	for _, a := range apps {
		for name, sha := range a.manifest(t) {
			want[name] = sha
		}
	}
	r.teardown(target)
	got := r.storeContent()
	for name, sha := range want {
		if got[name] != sha {
			t.Errorf("%s: store has sha256 %.12q, the application wrote %.12q", name, got[name], sha)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok && !strings.HasSuffix(name, "/") {
			t.Errorf("%s is in the store but the application removed it (or never made it)", name)
		}
	}
	t.Logf("%d files checked in the store", len(want))
}

// TestRestartPauseMetric: a driver started after its predecessor was
// killed tells, for the mount it adopts from the keeper, how long it went
// unserved: a histogram observation between the wait before the new
// driver started and the whole time from the kill to ready.
func TestRestartPauseMetric(t *testing.T) {
	r, target := newPublishedRig(t)
	addr := freeAddr(t)
	const unserved = "mounts unserved: their server released them or is gone"
	seen := strings.Count(readFile(r.driverLog.Name()), unserved)
	killed := time.Now()
	r.stopDriver(syscall.SIGKILL)
	// The pause counts from when the keeper saw the driver gone, which
	// on a loaded machine may be a while after the kill: the test's
	// lower bound counts from when the keeper's log says so, after it.
	waitLog(t, r.driverLog.Name(), unserved, seen+1)
	gone := time.Now()
	// The node without a driver for a while: the pause the metric must
	// show, made here (not a wait for an event; the check below holds
	// however long the machine takes around it).
	time.Sleep(500 * time.Millisecond)
	started := time.Now()
	r.startDriver("--metrics-address=" + addr)
	lower, upper := started.Sub(gone), time.Since(killed)
	body := scrape(t, addr)
	n, _ := metricValue(body, "blobfs_restart_pause_seconds_count")
	sum, _ := metricValue(body, "blobfs_restart_pause_seconds_sum")
	if n != 1 || sum < lower.Seconds() || sum > upper.Seconds() {
		t.Errorf("restart pauses: %v observations summing to %vs; want 1, between %v and %v:\n%s", n, sum, lower, upper, linesContaining(body, "blobfs_restart_pause"))
	}
	r.teardown(target)
}

// restartRepeatedly SIGKILLs the driver n times at random moments and
// starts it again each time; it returns the moments of the kills.
func restartRepeatedly(t *testing.T, r *restartRig, n int) []time.Time {
	var kills []time.Time
	var ready []time.Duration
	for range n {
		time.Sleep(time.Duration(100+rand.IntN(500)) * time.Millisecond)
		kills = append(kills, time.Now())
		r.stopDriver(syscall.SIGKILL)
		ready = append(ready, r.startDriver())
	}
	t.Logf("driver start to ready (adoption included): %s", summary(ready))
	return kills
}

// TestDriverUpgradeHandoff: a second driver process takes the mounts over
// from a running one (a rolling update with surge) while an application
// streams a file; the first is then stopped with SIGTERM. Expected: no
// error, the mount still serves, and the first driver left it alone.
func TestDriverUpgradeHandoff(t *testing.T) {
	r, target := newPublishedRig(t)
	data := make([]byte, 24<<20)
	crand.Read(data)
	if err := os.WriteFile(filepath.Join(target, "big.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	stopPath, stop := stopFile(t)
	reader := startApp(t, "stream", "BLOBFS_TEST_APP_FILE="+filepath.Join(target, "big.bin"),
		"BLOBFS_TEST_APP_SHA256="+sum(data), "BLOBFS_TEST_APP_STOP="+stopPath)

	var kills []time.Time
	for range 3 {
		time.Sleep(500 * time.Millisecond)
		old := r.driver
		r.driver = nil
		kills = append(kills, time.Now())
		took := r.startDriver() // the new one adopts; the old one releases
		t.Logf("new driver ready after %v", took.Round(time.Millisecond))
		old.Process.Signal(syscall.SIGTERM)
		if err := waitExit(old, time.Minute); err != nil {
			t.Fatalf("old driver after handing over, on SIGTERM: %v", err)
		}
		if !mounted(t, target) || !mounted(t, r.staging) {
			t.Fatal("the old driver's exit took the mounts with it")
		}
	}
	stop()
	reader.wait(t, 2*time.Minute)
	t.Logf("reader pause per handoff: %s", summary(pauses([]*app{reader}, kills)))
	// Each handoff went through a release, not through the old driver's
	// exit.
	logText, _ := os.ReadFile(r.driverLog.Name())
	if n := strings.Count(string(logText), "released the mounts to another process"); n != 3 {
		t.Errorf("%d releases in the drivers' logs, want 3", n)
	}
	r.teardown(target)
	if got := r.storeContent()["big.bin"]; got != sum(data) {
		t.Errorf("big.bin in the store: sha256 %.12s, want %.12s", got, sum(data))
	}
}

func waitExit(cmd *exec.Cmd, within time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(within):
		cmd.Process.Kill()
		return fmt.Errorf("did not exit within %v", within)
	}
}

// killBoth writes kept.txt ("still here") through target, then kills the
// keeper and the driver, every holder of the mount's fds: the mount must
// be dead.
func (r *restartRig) killBoth(target string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(target, "kept.txt"), []byte("still here"), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.killKeeper()
	r.stopDriver(syscall.SIGKILL)
	if _, err := os.Stat(filepath.Join(target, "kept.txt")); err == nil {
		r.t.Fatal("the mount still answers with no server and no keeper")
	}
}

// TestKeeperAndDriverKilled: with every holder of the fds gone, the mounts
// are dead ("transport endpoint is not connected"). The restarted driver
// reports the volume abnormal, and the next NodePublishVolume for a new
// pod (without NodeStageVolume, as kubelet does after a restart) repairs
// the staging mount with the credentials in the request; the data is
// there.
func TestKeeperAndDriverKilled(t *testing.T) {
	r, target := newPublishedRig(t)
	r.killBoth(target)
	r.startKeeper()
	r.startDriver("--log-level=debug") // the repair's retries are logged at debug level
	ctx := context.Background()
	stats, err := r.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: r.volumeID, VolumePath: target})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats: %v", err)
	}
	if !stats.GetVolumeCondition().GetAbnormal() {
		t.Errorf("a dead mount is reported healthy: %v", stats.GetVolumeCondition())
	}
	// The health check (every second here) retries, and says why it
	// cannot repair once, not every time: at error level the first time,
	// at debug level at every retry. Two retries, however long they take.
	const lost = "staging mount is gone and cannot be mounted again yet"
	waitLog(t, r.driverLog.Name(), lost, 3)
	if errs := linesContaining(linesContaining(readFile(r.driverLog.Name()), "level=ERROR"), lost); strings.Count(errs, lost) != 1 {
		t.Errorf("the failed repair is logged at error level %d times in three health checks; want once:\n%s", strings.Count(errs, lost), errs)
	}
	target2, err := r.publish("pod-b", r.secrets())
	if err != nil {
		t.Fatalf("NodePublishVolume for a new pod after both died: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(target2, "kept.txt"))
	if err != nil || string(b) != "still here" {
		t.Fatalf("new pod reads %q, %v", b, err)
	}
	// The first pod's dead bind mount is repaired by the health check.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(target, "kept.txt")); err == nil && string(b) == "still here" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first pod's target was not repaired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stats, err = r.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: r.volumeID, VolumePath: target2})
	if err != nil || stats.GetVolumeCondition().GetAbnormal() {
		t.Errorf("after repair: %v, %v", stats.GetVolumeCondition(), err)
	}
	r.teardown(target, target2)
}

// TestKeeperAndDriverKilledWithFilesOpen: the keeper and the driver both
// die while a pod has a file open for writing, so its data is only in a
// spill file of the volume's cache directory. When the volume is served
// again (the restarted driver repairs the dead staging mount), the file
// is uploaded: a new pod reads it, and no spill file is left behind.
func TestKeeperAndDriverKilledWithFilesOpen(t *testing.T) {
	r, target := newPublishedRig(t)
	f, err := os.OpenFile(filepath.Join(target, "open.txt"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("written, never closed"); err != nil {
		t.Fatal(err)
	}
	spills := filepath.Join(r.dir, "cache", "*", "spill", "spill-*")
	if left, _ := filepath.Glob(spills); len(left) == 0 {
		t.Fatalf("no spill file for the open file under %s", spills)
	}
	r.killKeeper()
	r.stopDriver(syscall.SIGKILL)
	f.Close() // the mount is dead: the data stays in the spill file
	r.startKeeper()
	r.startDriver()
	target2, err := r.publish("pod-b", r.secrets())
	if err != nil {
		t.Fatalf("NodePublishVolume after both died: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(target2, "open.txt"))
	if err != nil || string(b) != "written, never closed" {
		t.Fatalf("new pod reads %q, %v", b, err)
	}
	if left, _ := filepath.Glob(spills); len(left) != 0 {
		t.Errorf("spill files left in the cache directory: %v", left)
	}
	r.teardown(target, target2)
}
