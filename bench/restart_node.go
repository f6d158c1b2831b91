package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/blobfs/blobfs/blobstore"
)

// csiNode is one simulated Kubernetes node for the restart benchmark: a
// kubelet directory, a node driver (`blobfs csi --mode=node`) and, when it
// has one, a keeper (`blobfs keeper`), all real processes; the benchmark
// talks to the driver over its gRPC socket as kubelet does.
type csiNode struct {
	name       string
	bin        string
	dir        string // everything of this node lives below
	kubelet    string
	socket     string
	keeperSock string // empty: no keeper (a driver without restart support)

	keeper     *exec.Cmd
	keeperDone chan struct{}
	driver     *driverProc // the one serving now
	drivers    int         // started so far, for log names
}

// driverProc is one driver process.
type driverProc struct {
	cmd     *exec.Cmd
	logPath string
	// started is taken just before the process is started: every
	// start-up figure counts from it.
	started time.Time
	done    chan struct{}
	waitErr error // set before done is closed
	conn    *grpc.ClientConn
	node    csipb.NodeClient
}

// restartVolume is one volume of the benchmark: its own container.
type restartVolume struct {
	id        string // the CSI volume id
	container string
	store     blobstore.AzureConfig
}

// Time limits of the restart benchmark. Generous: the machine is shared.
const (
	// driverReadyTimeout bounds a driver's start-up. A driver not ready by
	// then gets SIGQUIT, so that its log holds every goroutine's stack.
	driverReadyTimeout = time.Minute
	stageTimeout       = 3 * time.Minute
	driverStopTimeout  = 2 * time.Minute
)

func newCSINode(bin, dir, name string, keeper bool) (*csiNode, error) {
	n := &csiNode{name: name, bin: bin, dir: dir,
		kubelet: filepath.Join(dir, "kubelet"),
		socket:  filepath.Join(dir, "csi.sock"),
	}
	if keeper {
		n.keeperSock = filepath.Join(dir, "keeper.sock")
	}
	for _, d := range []string{n.kubelet, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// stagingPath is where volume i is staged (kubelet's globalmount).
func (n *csiNode) stagingPath(i int) string {
	return filepath.Join(n.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", fmt.Sprintf("vol-%03d", i), "globalmount")
}

func (n *csiNode) startKeeper(ctx context.Context) error {
	log, err := os.Create(filepath.Join(n.dir, "logs", "keeper.log"))
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own copy
	n.keeper = exec.Command(n.bin, "keeper", "--socket", n.keeperSock)
	n.keeper.Stdout, n.keeper.Stderr = log, log
	n.keeper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := n.keeper.Start(); err != nil {
		return fmt.Errorf("start keeper: %w", err)
	}
	n.keeperDone = make(chan struct{})
	go func() { n.keeper.Wait(); close(n.keeperDone) }()
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.Dial("unixpacket", n.keeperSock); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-n.keeperDone:
			return fmt.Errorf("keeper exited at start: %s", fileTail(log.Name(), 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("keeper does not listen after a minute")
		}
	}
}

func (n *csiNode) stopKeeper() {
	if n.keeper == nil {
		return
	}
	n.keeper.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.keeperDone:
	case <-time.After(30 * time.Second):
		n.keeper.Process.Kill()
		<-n.keeperDone
	}
	n.keeper = nil
}

// startDriver starts a driver process and returns at once; waitReady
// tells when it serves. The new process becomes n.driver.
func (n *csiNode) startDriver() (*driverProc, error) {
	n.drivers++
	logPath := filepath.Join(n.dir, "logs", fmt.Sprintf("driver-%03d.log", n.drivers))
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := []string{"csi", "--mode=node", "--endpoint=unix://" + n.socket, "--node-id=bench-" + n.name,
		"--kubelet-dir=" + n.kubelet, "--state-dir=" + filepath.Join(n.dir, "state"),
		"--cache-dir=" + filepath.Join(n.dir, "cache")}
	if n.keeperSock != "" {
		args = append(args, "--keeper-socket="+n.keeperSock)
	}
	p := &driverProc{logPath: logPath, done: make(chan struct{})}
	p.cmd = exec.Command(n.bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start driver: %w", err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	n.driver = p
	return p, nil
}

// socketStat is the driver socket as it is now (nil when absent): a driver
// that replaces a running one is serving once the name points elsewhere.
func (n *csiNode) socketStat() os.FileInfo {
	fi, _ := os.Stat(n.socket)
	return fi
}

// waitReady waits until p listens (on a socket other than before, when a
// driver ran before it) and Probe says ready, which the driver says once
// it has adopted or repaired every mount. It returns the time from p's
// start.
func (n *csiNode) waitReady(ctx context.Context, p *driverProc, before os.FileInfo) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, driverReadyTimeout)
	defer cancel()
	for {
		now, err := os.Stat(n.socket)
		fresh := err == nil && (before == nil || !os.SameFile(before, now) || !now.ModTime().Equal(before.ModTime()))
		if fresh && p.conn == nil {
			// Reconnect fast: gRPC's default backoff after a refused
			// connection is a second, more than what is measured.
			conn, err := grpc.NewClient("unix://"+n.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 2 * time.Millisecond,
					Multiplier: 1.5, MaxDelay: 20 * time.Millisecond}, MinConnectTimeout: time.Second}))
			if err != nil {
				return 0, err
			}
			p.conn, p.node = conn, csipb.NewNodeClient(conn)
		}
		if p.conn != nil {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			r, err := csipb.NewIdentityClient(p.conn).Probe(pctx, &csipb.ProbeRequest{})
			pcancel()
			if err == nil && r.GetReady().GetValue() {
				return time.Since(p.started), nil
			}
		}
		select {
		case <-p.done:
			return 0, fmt.Errorf("driver exited before it was ready (%v): %s", p.waitErr, fileTail(p.logPath, 20))
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				p.cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-p.done:
				case <-time.After(10 * time.Second):
				}
				return 0, fmt.Errorf("driver not ready after %v; its goroutines are in %s", driverReadyTimeout, p.logPath)
			}
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// stop signals p and waits for it to exit (killing it after a while).
func (p *driverProc) stop(sig syscall.Signal) error {
	if p.conn != nil {
		p.conn.Close()
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(driverStopTimeout):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("driver did not exit within %v of %v", driverStopTimeout, sig)
	}
	if sig == syscall.SIGTERM && p.waitErr != nil {
		return fmt.Errorf("driver on SIGTERM: %v: %s", p.waitErr, fileTail(p.logPath, 20))
	}
	return nil
}

// logCount counts the lines of p's log that contain s.
func (p *driverProc) logCount(s string) int {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return -1
	}
	return strings.Count(string(b), s)
}

// adopted is how many mounts p took back from the keeper (its log says so
// once per mount, before it reports ready).
func (p *driverProc) adopted() int { return p.logCount("adopted a live mount") }

// stage stages every volume at once, as kubelet does for the pods that
// land on a node; staged(i) is called as soon as volume i is staged.
func (n *csiNode) stage(ctx context.Context, p *driverProc, vols []restartVolume, staged func(i int)) error {
	ctx, cancel := context.WithTimeout(ctx, stageTimeout)
	defer cancel()
	return forEachVolume(len(vols), func(i int) error {
		v := vols[i]
		if err := os.MkdirAll(n.stagingPath(i), 0o750); err != nil {
			return err
		}
		_, err := p.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
			VolumeId: v.id, StagingTargetPath: n.stagingPath(i), VolumeCapability: restartVolumeCap(),
			Secrets: map[string]string{"azurestorageaccountname": v.store.Account, "azurestorageaccountkey": v.store.Key},
		})
		if err != nil {
			return fmt.Errorf("NodeStageVolume %s: %w", v.container, err)
		}
		if staged != nil {
			staged(i)
		}
		return nil
	})
}

func (n *csiNode) unstage(ctx context.Context, p *driverProc, vols []restartVolume) error {
	ctx, cancel := context.WithTimeout(ctx, stageTimeout)
	defer cancel()
	return forEachVolume(len(vols), func(i int) error {
		_, err := p.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vols[i].id, StagingTargetPath: n.stagingPath(i)})
		if err != nil {
			return fmt.Errorf("NodeUnstageVolume %s: %w", vols[i].container, err)
		}
		return nil
	})
}

// forEachVolume runs f(0..n-1) concurrently and joins the errors.
func forEachVolume(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func restartVolumeCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
	}
}

// close stops whatever still runs and lazily unmounts whatever is left
// under the node's kubelet directory (dead mounts included).
func (n *csiNode) close() {
	if n.driver != nil {
		select {
		case <-n.driver.done:
		default:
			n.driver.stop(syscall.SIGKILL)
		}
		n.driver = nil
	}
	n.stopKeeper()
	if mps, err := mountpoints(); err == nil {
		var under []string
		for _, mp := range mps {
			if strings.HasPrefix(mp, n.kubelet+"/") {
				under = append(under, mp)
			}
		}
		slices.Sort(under)
		slices.Reverse(under) // deepest first
		for _, mp := range under {
			syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
}

// fileTail returns the last lines of a log file, for error messages.
func fileTail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}
