package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// The restart benchmark (RunRestart): what blobfs's keeper buys when the
// CSI node driver restarts.
//
// For each mount count N (1, 10, 100), N volumes, each its own container
// (as a StorageClass makes one container per claim), and two simulated
// nodes of real processes, driven over gRPC as kubelet drives them:
//
//   - the "keeper" node: `blobfs keeper` and a node driver using it, the N
//     volumes staged once, and a streaming reader (an application process)
//     reading a file through the first mount all along;
//   - the "fresh" node: a node driver without a keeper, which is what a
//     driver without restart support has to do after a restart: start,
//     and stage every volume again.
//
// Each repetition does, in this order, so that the three share the
// machine's moment:
//
//  1. fresh start (the baseline): start the fresh node's driver with empty
//     state, NodeStageVolume every volume at once (kubelet does not
//     serialise them), and read a file through each mount as soon as it is
//     staged; then unstage and stop it.
//  2. SIGKILL: kill the keeper node's driver at a random moment of the
//     stream and start another; a probe application has queued a read
//     through every mount, which waits in the kernel until the mount is
//     served again.
//  3. graceful handoff: start a second driver while the first runs (it
//     adopts after the first released), then SIGTERM the first.
//
// Start-up figures count from just before the driver process is started
// to: Probe ready (the driver is ready once every mount is adopted); and
// the first successful read through every mount. The application-visible
// pause is the longest read of the streaming reader in progress at any
// moment from the kill (or the new driver's start) to the moment every
// mount was read (or the old driver exited). Medians over the repetitions
// are reported, and the ratio of the medians.

// RestartConfig describes one run of the restart benchmark.
type RestartConfig struct {
	// Endpoint is Azurite's blob endpoint with the account; Key its
	// account key (default: Azurite's well-known key).
	Endpoint string
	Key      string
	// BlobfsBin is the blobfs binary whose `keeper` and `csi` subcommands
	// are measured.
	BlobfsBin string
	// Mounts are the mount counts measured, in order.
	Mounts []int
	// Reps is the number of repetitions of each measurement.
	Reps int
	// StreamSize is the size of the file the streaming reader reads, and
	// StreamRate the bytes per second at which it reads: bounded, so that
	// it does not take the (shared) CPU from what is timed.
	StreamSize int64
	StreamRate int64
	// WorkDir holds the nodes' kubelet directories, state, caches and
	// logs (default: a new directory under $TMPDIR, removed afterwards
	// unless a measurement failed).
	WorkDir string
	// KeepContainers leaves the Azurite containers in place.
	KeepContainers bool
	// Log, when set, receives progress lines.
	Log io.Writer
}

// DefaultRestartConfig is the full run: 1, 10 and 100 mounts, 5
// repetitions each.
func DefaultRestartConfig() RestartConfig {
	return RestartConfig{
		Endpoint:   "http://127.0.0.1:10000/" + blobstore.AzuriteAccount,
		Key:        blobstore.AzuriteAccountKey,
		BlobfsBin:  "bin/blobfs",
		Mounts:     []int{1, 10, 100},
		Reps:       5,
		StreamSize: 32 * MiB,
		StreamRate: 32 * MiB,
	}
}

// QuickRestartConfig is a smoke run: 1 and 10 mounts, 2 repetitions.
func QuickRestartConfig() RestartConfig {
	c := DefaultRestartConfig()
	c.Mounts = []int{1, 10}
	c.Reps = 2
	c.StreamSize = 8 * MiB
	return c
}

func (c *RestartConfig) validate() error {
	if c.Key == "" {
		c.Key = blobstore.AzuriteAccountKey
	}
	if c.Endpoint == "" {
		return errors.New("restart benchmark: Endpoint (Azurite's blob endpoint) is required")
	}
	if c.BlobfsBin == "" {
		return errors.New("restart benchmark: BlobfsBin is required (make build)")
	}
	if _, err := os.Stat(c.BlobfsBin); err != nil {
		return fmt.Errorf("restart benchmark: blobfs binary: %w (make build)", err)
	}
	if len(c.Mounts) == 0 || slices.Min(c.Mounts) < 1 {
		return fmt.Errorf("restart benchmark: mount counts %v: want at least one, each ≥ 1", c.Mounts)
	}
	if c.Reps < 1 {
		return fmt.Errorf("restart benchmark: Reps %d: want ≥ 1", c.Reps)
	}
	if c.StreamSize < streamChunk || c.StreamRate < streamChunk {
		return fmt.Errorf("restart benchmark: StreamSize and StreamRate must be at least %d", streamChunk)
	}
	if os.Geteuid() != 0 {
		return errors.New("restart benchmark: run as root (the driver mounts with mount(2))")
	}
	return nil
}

// RestartRow holds one mount count's measurements, one entry per
// repetition (in order).
type RestartRow struct {
	Mounts int
	// The baseline: a fresh driver without a keeper, from its start to
	// Probe ready, to every volume staged, and to a read through every
	// mount.
	FreshReady, FreshStaged, FreshRead []time.Duration
	// After a SIGKILL: the new driver from its start to Probe ready
	// (every mount adopted) and to a read through every mount; the
	// mounts it adopted; the streaming reader's longest stall.
	KillReady, KillRead []time.Duration
	KillAdopted         []int
	KillStall           []time.Duration
	// Graceful handoff: the new driver from its start to Probe ready; to
	// the old one's exit after SIGTERM; the mounts adopted; the stall.
	HandoffReady, HandoffOldExit []time.Duration
	HandoffAdopted               []int
	HandoffStall                 []time.Duration
	// Err is set when the measurement failed.
	Err error
}

// RestartReport is a run's result.
type RestartReport struct {
	Machine Machine
	Config  RestartConfig
	Rows    []RestartRow
	// Details lists every repetition's timings.
	Details []string
	Started time.Time
	Elapsed time.Duration
	// KeptWorkDir is the work directory left in place, with the logs of
	// every driver and keeper, because a measurement failed.
	KeptWorkDir string
}

// Err joins the errors of the rows that failed.
func (r *RestartReport) Err() error {
	var errs []error
	for _, row := range r.Rows {
		if row.Err != nil {
			errs = append(errs, fmt.Errorf("%d mounts: %w", row.Mounts, row.Err))
		}
	}
	return errors.Join(errs...)
}

// restartRun is the state of one RunRestart.
type restartRun struct {
	cfg       RestartConfig
	work      string
	vols      []restartVolume
	streamSHA string
	report    *RestartReport
}

// probeContent is what every volume's probe.txt holds.
const probeContent = "blobfs restart benchmark probe\n"

const (
	restartProbeFile  = "probe.txt"
	restartStreamFile = "stream.bin"
)

// RunRestart runs the restart benchmark. A measurement that fails is
// reported in its row; the error is for a run that could not start.
func RunRestart(ctx context.Context, cfg RestartConfig) (*RestartReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &restartRun{cfg: cfg, report: &RestartReport{Config: cfg, Started: time.Now()}}
	r.report.Machine = machineOf(cfg.BlobfsBin, cfg.Endpoint)
	work := cfg.WorkDir
	if work == "" {
		d, err := os.MkdirTemp("", "blobfs-restart-bench-")
		if err != nil {
			return nil, err
		}
		defer func() {
			// The drivers' and keeper's logs tell what went wrong.
			if r.report.Err() != nil {
				r.report.KeptWorkDir = d
				return
			}
			os.RemoveAll(d)
		}()
		work = d
	}
	r.work = work
	if err := r.makeVolumes(ctx, slices.Max(cfg.Mounts)); err != nil {
		r.deleteVolumes()
		return nil, err
	}
	defer r.deleteVolumes()
	for _, n := range cfg.Mounts {
		r.logf("%d mounts: %d repetitions", n, cfg.Reps)
		row := r.measure(ctx, n)
		if row.Err != nil {
			r.logf("%d mounts: %v", n, row.Err)
		}
		r.report.Rows = append(r.report.Rows, row)
		if ctx.Err() != nil {
			break
		}
	}
	r.report.Machine.LoadEnd = loadAvg()
	r.report.Elapsed = time.Since(r.report.Started)
	return r.report, ctx.Err()
}

func (r *restartRun) logf(format string, args ...any) {
	if r.cfg.Log != nil {
		fmt.Fprintf(r.cfg.Log, "restart-bench: "+format+"\n", args...)
	}
}

func (r *restartRun) detail(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.report.Details = append(r.report.Details, s)
	r.logf("%s", s)
}

// makeVolumes creates n containers with a probe file each, and the
// streamed file in the first.
func (r *restartRun) makeVolumes(ctx context.Context, n int) error {
	endpoint := strings.TrimSuffix(r.cfg.Endpoint, "/")
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return fmt.Errorf("endpoint %q is not a URL like http://127.0.0.1:10000/devstoreaccount1", endpoint)
	}
	account, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if account == "" {
		return fmt.Errorf("endpoint %q names no account; expected http://HOST:PORT/ACCOUNT", endpoint)
	}
	var suffix [3]byte
	rand.Read(suffix[:])
	prefix := fmt.Sprintf("restart-%s-%s", time.Now().UTC().Format("150405"), hex.EncodeToString(suffix[:]))
	stream := make([]byte, r.cfg.StreamSize)
	rand.Read(stream)
	sum := sha256.Sum256(stream)
	r.streamSHA = hex.EncodeToString(sum[:])
	r.logf("creating %d containers %s-NNN on %s", n, prefix, endpoint)
	r.vols = make([]restartVolume, n)
	for i := range n {
		c := fmt.Sprintf("%s-%03d", prefix, i)
		r.vols[i] = restartVolume{container: c,
			id: fmt.Sprintf("blobfs1#%s#%s#%s", account, c, endpoint),
			store: blobstore.AzureConfig{Account: account, Container: c, Endpoint: endpoint,
				Key: r.cfg.Key, Auth: blobstore.AzureAuthKey}}
	}
	return forEachVolume(n, func(i int) error {
		v := r.vols[i]
		if err := blobstore.CreateContainer(ctx, v.store, nil); err != nil {
			return fmt.Errorf("create container %s (is Azurite running? .ci/azurite.sh start): %w", v.container, err)
		}
		store, err := blobstore.NewAzure(v.store)
		if err != nil {
			return err
		}
		if _, err := store.Put(ctx, restartProbeFile, []byte(probeContent), blobstore.PutOptions{}); err != nil {
			return fmt.Errorf("upload %s/%s: %w", v.container, restartProbeFile, err)
		}
		if i == 0 {
			if _, err := store.Put(ctx, restartStreamFile, stream, blobstore.PutOptions{}); err != nil {
				return fmt.Errorf("upload %s/%s: %w", v.container, restartStreamFile, err)
			}
		}
		return nil
	})
}

func (r *restartRun) deleteVolumes() {
	if r.cfg.KeepContainers {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := forEachVolume(len(r.vols), func(i int) error {
		if r.vols[i].container == "" {
			return nil
		}
		return blobstore.DeleteContainer(ctx, r.vols[i].store)
	})
	if err != nil {
		r.logf("deleting the containers: %v", err)
	}
}

// measure runs every repetition for n mounts.
func (r *restartRun) measure(ctx context.Context, n int) (row RestartRow) {
	row.Mounts = n
	vols := r.vols[:n]
	dir := filepath.Join(r.work, fmt.Sprintf("n%d", n))
	kept, err := newCSINode(r.cfg.BlobfsBin, filepath.Join(dir, "keeper-node"), "keeper", true)
	if err != nil {
		row.Err = err
		return row
	}
	defer kept.close()
	fresh, err := newCSINode(r.cfg.BlobfsBin, filepath.Join(dir, "fresh-node"), "fresh", false)
	if err != nil {
		row.Err = err
		return row
	}
	defer fresh.close()

	if err := kept.startKeeper(ctx); err != nil {
		row.Err = err
		return row
	}
	before := kept.socketStat()
	d, err := kept.startDriver()
	if err == nil {
		_, err = kept.waitReady(ctx, d, before)
	}
	if err == nil {
		err = kept.stage(ctx, d, vols, nil)
	}
	if err != nil {
		row.Err = fmt.Errorf("setting up the keeper node: %w", err)
		return row
	}
	stream, err := startStreamer(filepath.Join(kept.stagingPath(0), restartStreamFile), r.streamSHA, r.cfg.StreamRate)
	if err != nil {
		row.Err = err
		return row
	}
	streamStopped := false
	defer func() {
		if !streamStopped {
			stream.stop(10 * time.Second)
		}
	}()
	if err := stream.waitStarted(time.Minute); err != nil {
		row.Err = err
		return row
	}

	type window struct{ from, to time.Time }
	var killWindows, handoffWindows []window
	for rep := range r.cfg.Reps {
		if ctx.Err() != nil {
			row.Err = ctx.Err()
			return row
		}
		ready, staged, read, err := r.freshStart(ctx, fresh, vols)
		if err != nil {
			row.Err = fmt.Errorf("repetition %d, fresh driver: %w", rep+1, err)
			return row
		}
		row.FreshReady = append(row.FreshReady, ready)
		row.FreshStaged = append(row.FreshStaged, staged)
		row.FreshRead = append(row.FreshRead, read)

		// A random moment of the stream.
		time.Sleep(time.Duration(200+mrand.IntN(500)) * time.Millisecond)
		kill, ready, read, adopted, err := r.killRestart(ctx, kept, vols)
		if err != nil {
			row.Err = fmt.Errorf("repetition %d, SIGKILL and restart: %w", rep+1, err)
			return row
		}
		row.KillReady = append(row.KillReady, ready)
		row.KillRead = append(row.KillRead, read)
		row.KillAdopted = append(row.KillAdopted, adopted)
		killWindows = append(killWindows, window{kill, kept.driver.started.Add(read)})

		time.Sleep(time.Duration(200+mrand.IntN(500)) * time.Millisecond)
		ready, oldExit, adopted, err := r.handoff(ctx, kept)
		if err != nil {
			row.Err = fmt.Errorf("repetition %d, graceful handoff: %w", rep+1, err)
			return row
		}
		row.HandoffReady = append(row.HandoffReady, ready)
		row.HandoffOldExit = append(row.HandoffOldExit, oldExit)
		row.HandoffAdopted = append(row.HandoffAdopted, adopted)
		handoffWindows = append(handoffWindows, window{kept.driver.started, kept.driver.started.Add(oldExit)})

		r.detail("%d mounts, rep %d: fresh: ready %v, all staged %v, every mount read %v | SIGKILL: ready %v (%d adopted), every mount read %v | handoff: ready %v (%d adopted), old driver exited at %v",
			n, rep+1, ms(row.FreshReady[rep]), ms(row.FreshStaged[rep]), ms(row.FreshRead[rep]),
			ms(row.KillReady[rep]), row.KillAdopted[rep], ms(row.KillRead[rep]),
			ms(row.HandoffReady[rep]), row.HandoffAdopted[rep], ms(row.HandoffOldExit[rep]))
	}
	streamStopped = true
	if err := stream.stop(time.Minute); err != nil {
		row.Err = err
		return row
	}
	for i, w := range killWindows {
		s, ok := stream.stall(w.from, w.to)
		if !ok {
			row.Err = fmt.Errorf("repetition %d: the streaming reader made no read around the SIGKILL", i+1)
			return row
		}
		row.KillStall = append(row.KillStall, s)
	}
	for i, w := range handoffWindows {
		s, ok := stream.stall(w.from, w.to)
		if !ok {
			row.Err = fmt.Errorf("repetition %d: the streaming reader made no read during the handoff", i+1)
			return row
		}
		row.HandoffStall = append(row.HandoffStall, s)
	}
	r.detail("%d mounts: reader stall per SIGKILL %v; per handoff %v", n, msList(row.KillStall), msList(row.HandoffStall))
	for i := range row.KillAdopted {
		if row.KillAdopted[i] != n || row.HandoffAdopted[i] != n {
			row.Err = fmt.Errorf("repetition %d: %d and %d of %d mounts adopted (SIGKILL, handoff)", i+1, row.KillAdopted[i], row.HandoffAdopted[i], n)
			return row
		}
	}
	if err := kept.unstage(ctx, kept.driver, vols); err != nil {
		row.Err = fmt.Errorf("teardown: %w", err)
		return row
	}
	if err := kept.driver.stop(syscall.SIGTERM); err != nil {
		row.Err = fmt.Errorf("teardown: %w", err)
	}
	return row
}

// freshStart is the baseline: a fresh driver stages every volume and each
// mount is read as soon as it is staged. Times count from the process
// start.
func (r *restartRun) freshStart(ctx context.Context, node *csiNode, vols []restartVolume) (ready, staged, read time.Duration, err error) {
	// Nothing of a previous run: the driver starts as on a new node.
	os.RemoveAll(filepath.Join(node.dir, "state"))
	os.RemoveAll(filepath.Join(node.dir, "cache"))
	probe, err := startProber(probeContent)
	if err != nil {
		return 0, 0, 0, err
	}
	defer probe.close()
	before := node.socketStat()
	d, err := node.startDriver()
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() {
		if stopErr := d.stop(syscall.SIGTERM); err == nil {
			err = stopErr
		}
	}()
	if ready, err = node.waitReady(ctx, d, before); err != nil {
		return 0, 0, 0, err
	}
	err = node.stage(ctx, d, vols, func(i int) {
		probe.read(i, filepath.Join(node.stagingPath(i), restartProbeFile))
	})
	if err != nil {
		return 0, 0, 0, err
	}
	staged = time.Since(d.started)
	reads, err := probe.collect(ctx, len(vols), stageTimeout)
	if err != nil {
		return 0, 0, 0, err
	}
	read = latest(reads).Sub(d.started)
	if err := node.unstage(ctx, d, vols); err != nil {
		return 0, 0, 0, err
	}
	return ready, staged, read, nil
}

// killRestart SIGKILLs node's driver and starts another, with a read
// through every mount waiting for it.
func (r *restartRun) killRestart(ctx context.Context, node *csiNode, vols []restartVolume) (kill time.Time, ready, read time.Duration, adopted int, err error) {
	probe, err := startProber(probeContent)
	if err != nil {
		return kill, 0, 0, 0, err
	}
	defer probe.close()
	before := node.socketStat()
	kill = time.Now()
	if err := node.driver.stop(syscall.SIGKILL); err != nil {
		return kill, 0, 0, 0, err
	}
	d, err := node.startDriver()
	if err != nil {
		return kill, 0, 0, 0, err
	}
	for i := range vols {
		if err := probe.read(i, filepath.Join(node.stagingPath(i), restartProbeFile)); err != nil {
			return kill, 0, 0, 0, fmt.Errorf("probe application: %w", err)
		}
	}
	if ready, err = node.waitReady(ctx, d, before); err != nil {
		return kill, 0, 0, 0, err
	}
	reads, err := probe.collect(ctx, len(vols), stageTimeout)
	if err != nil {
		return kill, 0, 0, 0, fmt.Errorf("%w; driver log: %s", err, fileTail(d.logPath, 10))
	}
	return kill, ready, latest(reads).Sub(d.started), d.adopted(), nil
}

// handoff starts a second driver beside the running one, waits until it
// serves (it adopts once the first released), then SIGTERMs the first.
func (r *restartRun) handoff(ctx context.Context, node *csiNode) (ready, oldExit time.Duration, adopted int, err error) {
	old := node.driver
	before := node.socketStat()
	d, err := node.startDriver()
	if err != nil {
		return 0, 0, 0, err
	}
	if ready, err = node.waitReady(ctx, d, before); err != nil {
		return 0, 0, 0, err
	}
	if err := old.stop(syscall.SIGTERM); err != nil {
		return 0, 0, 0, fmt.Errorf("the old driver, after handing over: %w", err)
	}
	oldExit = time.Since(d.started)
	if n := old.logCount("released the mounts to another process"); n != 1 {
		return 0, 0, 0, fmt.Errorf("the old driver's log says %d times that it released the mounts, want once: %s", n, fileTail(old.logPath, 10))
	}
	return ready, oldExit, d.adopted(), nil
}

func latest(ts map[int]time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

// median of ds (the upper one of an even count); 0 for none.
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

func msList(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = ms(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// Markdown writes the machine description, the two tables and the details.
func (r *RestartReport) Markdown(w io.Writer) error {
	var b strings.Builder
	m, c := r.Machine, r.Config
	fmt.Fprintf(&b, "## blobfs restart benchmark, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "- machine: %d CPUs, %s; kernel %s; %s\n", m.NProc, m.CPU, m.Kernel, m.Go)
	fmt.Fprintf(&b, "- blobfs: %s; Azurite: %s\n", orDash(m.Blobfs), orDash(m.Azurite))
	fmt.Fprintf(&b, "- load average at start: %s; at end: %s\n", m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "- method: each volume its own container; per repetition, interleaved: a fresh driver without keeper stages every volume at once (baseline), then the keeper node's driver is SIGKILLed and restarted, then handed over gracefully; medians of %d repetitions; times from the driver process's start; streaming reader: %s at %s/s through the first mount; run took %v\n",
		c.Reps, human(c.StreamSize), human(c.StreamRate), r.Elapsed.Round(time.Second))
	b.WriteString("\nStart to serving (medians; ratio = adopting driver / fresh driver, to a read through every mount):\n\n")
	b.WriteString("| mounts | fresh driver: ready | fresh: all staged | fresh: every mount read (baseline) | after SIGKILL: ready, all adopted | after SIGKILL: every mount read | ratio |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Rows {
		if row.Err != nil {
			fmt.Fprintf(&b, "| %d | error: %s | | | | | |\n", row.Mounts, oneLine(row.Err))
			continue
		}
		fr, kr := median(row.FreshRead), median(row.KillRead)
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %.2f |\n", row.Mounts, ms(median(row.FreshReady)), ms(median(row.FreshStaged)),
			ms(fr), ms(median(row.KillReady)), ms(kr), float64(kr)/float64(fr))
	}
	b.WriteString("\nApplication-visible pause (longest read stall of the streaming reader; median and max over the repetitions):\n\n")
	b.WriteString("| mounts | SIGKILL + restart: median | max | graceful handoff: new driver ready | handoff stall: median | max |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Rows {
		if row.Err != nil {
			fmt.Fprintf(&b, "| %d | error | | | | |\n", row.Mounts)
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", row.Mounts, ms(median(row.KillStall)), ms(slices.Max(row.KillStall)),
			ms(median(row.HandoffReady)), ms(median(row.HandoffStall)), ms(slices.Max(row.HandoffStall)))
	}
	if r.KeptWorkDir != "" {
		fmt.Fprintf(&b, "\nA measurement failed: the logs of every driver and keeper are in %s\n", r.KeptWorkDir)
	}
	if len(r.Details) > 0 {
		b.WriteString("\n<details><summary>every timing</summary>\n\n```\n")
		b.WriteString(strings.Join(r.Details, "\n"))
		b.WriteString("\n```\n</details>\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
