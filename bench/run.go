package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"golang.org/x/sys/unix"
)

// discardLogger silences the in-process mounts.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// runner is one Run: the configuration, the Azurite side, the clients and
// the buffers that figures share.
type runner struct {
	cfg    Config
	report *Report
	work   string    // this run's directory under cfg.WorkDir
	az     *azureEnv // nil unless an Azurite figure is selected
	blobfs client
	others []client
	seq    atomic.Int64 // for unique names

	data    []byte // cfg.Size random bytes, made on first use
	scratch []byte // a buffer of cfg.Size bytes that reads land in
	dropErr error  // why dropping caches failed, once
	// interrupted counts, per client, the closes of the current figure
	// that failed with EINTR (errCloseInterrupted).
	interrupted map[string]int
}

// Run runs the figures of cfg and returns the report. A figure that fails
// is reported in its row (Report.Err joins them); Run itself fails only
// when nothing can be measured.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, report: &Report{Config: cfg, Started: time.Now()}}
	r.report.Machine = describeMachine(&r.cfg)
	work, err := os.MkdirTemp(cfg.WorkDir, "blobfs-bench-")
	if err != nil {
		return nil, err
	}
	r.work = work
	defer r.removeWork()

	if cfg.needsAzurite() {
		az, err := newAzureEnv(ctx, cfg.Endpoint, cfg.Key)
		if err != nil {
			return nil, err
		}
		r.az = az
		r.logf("container %s on %s", az.container, az.endpoint)
		if !cfg.KeepContainer {
			defer func() {
				if err := az.close(); err != nil {
					r.logf("delete container %s: %v", az.container, err)
				}
			}()
		}
		r.blobfs = blobfsClient(&r.cfg, az)
		if cfg.Others {
			r.report.Clients, r.others = otherClients(az)
		}
		if len(cfg.CompareArgs) > 0 {
			name := blobfsName + " " + strings.Join(cfg.CompareArgs, " ")
			r.others = append(r.others, blobfsVariant(&r.cfg, az, name, cfg.CompareArgs))
			r.report.Clients = append(r.report.Clients, ClientStatus{Name: name, Path: cfg.BlobfsBin})
		}
		if w := r.cfg.azuriteWrites(len(r.others)); w > 8*GiB {
			r.logf("warning: this run writes about %s to Azurite, which an in-memory Azurite keeps until its garbage collection "+
				"(every 10 minutes) and refuses past its memory limit: start a fresh one for it", human(w/GiB*GiB))
		}
	}

	azuriteUsed := false
	for _, fig := range cfg.Figures {
		if err := ctx.Err(); err != nil {
			r.report.Rows = append(r.report.Rows, Row{ID: fig, Figure: fig, Err: err})
			continue
		}
		if r.az != nil && cfg.FreshAzurite != "" && slices.Contains(azuriteFigures, fig) {
			if azuriteUsed {
				if err := r.freshAzurite(ctx); err != nil {
					r.logf("%s failed: %v", fig, err)
					r.report.Rows = append(r.report.Rows, Row{ID: fig, Figure: fig, Err: err})
					continue
				}
			}
			azuriteUsed = true
		}
		r.logf("== %s", fig)
		r.interrupted = map[string]int{}
		row := r.figure(ctx, fig)
		for _, who := range slices.Sorted(maps.Keys(r.interrupted)) {
			if row.Note != "" {
				row.Note += "; "
			}
			row.Note += fmt.Sprintf("%s: close(2) failed with EINTR %d times (FUSE_INTERRUPT, from a signal to the writer, cancelled the commit in FLUSH); "+
				"timed until the data was in the store", who, r.interrupted[who])
		}
		if row.Err != nil {
			r.logf("%s failed: %v", fig, row.Err)
		} else {
			r.logf("%s: blobfs %s, baseline %s (%s), ratio %.2f", fig, formatValue(row.Blobfs, row.Unit),
				formatValue(row.Baseline, row.Unit), row.BaselineName, row.Ratio())
		}
		r.report.Rows = append(r.report.Rows, row)
	}
	r.report.Machine.LoadEnd = loadAvg()
	r.report.Elapsed = time.Since(r.report.Started)
	return r.report, nil
}

func (r *runner) figure(ctx context.Context, fig string) Row {
	switch fig {
	case FigSeqRead:
		return r.seqRead(ctx)
	case FigSeqReadWarm:
		return r.seqReadWarm(ctx)
	case FigSeqWrite:
		return r.seqWrite(ctx)
	case FigSeqWriteOwnCPU:
		return r.seqWriteOwnCPU(ctx)
	case FigSmallCreate:
		return r.smallCreate(ctx)
	case FigSmallList:
		return r.smallList(ctx)
	case FigSmallRead:
		return r.smallRead(ctx)
	case FigRandRead:
		return r.randRead(ctx)
	case FigRandReadWarm:
		return r.randReadWarm(ctx)
	case FigSeqReadCached:
		return r.seqReadCached(ctx)
	case FigWriteBack:
		return r.writeBackLarge(ctx)
	case FigWriteBackSmall:
		return r.writeBackSmall(ctx)
	case FigFaultyRead:
		return r.faultyRead(ctx)
	case FigFaultyWrite:
		return r.faultyWrite(ctx)
	case FigFaultyCreate:
		return r.faultyCreate(ctx)
	case FigFaultyLog:
		return r.faultyLog(ctx)
	case FigFUSE:
		return r.fuseOverhead(ctx)
	case FigMemory:
		return r.memory(ctx)
	case FigMemoryMounts:
		return r.memoryMounts(ctx)
	}
	return Row{ID: fig, Figure: fig, Err: fmt.Errorf("unknown figure")}
}

// removeWork deletes the run's directory, unless something is still
// mounted below it: removing through a live mount would delete blobs.
func (r *runner) removeWork() {
	mps, err := mountpoints()
	if err != nil {
		r.logf("keeping %s: %v", r.work, err)
		return
	}
	for _, mp := range mps {
		if strings.HasPrefix(mp, r.work+"/") {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
				r.logf("keeping %s: %s is still mounted: %v", r.work, mp, err)
				return
			}
		}
	}
	os.RemoveAll(r.work)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Log, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// detail records one timing for the report and the log.
func (r *runner) detail(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	r.report.Details = append(r.report.Details, s)
	r.logf("%s", s)
}

// newDir makes a fresh directory in the run's directory.
func (r *runner) newDir(kind string) (string, error) {
	return os.MkdirTemp(r.work, pathSafe(kind)+"-")
}

// pathSafe makes a name that may carry a client's name into one file name:
// a client's name carries its -compare-args, and a path in them
// ("--cache-dir=/dev/shm/x") must not become directories.
// A long name is cut, with a hash of the whole to keep it apart from
// others cut the same way, within a file name's 255 bytes.
func pathSafe(name string) string {
	safe := strings.Map(func(c rune) rune {
		if c == os.PathSeparator || c == 0 {
			return '_'
		}
		return c
	}, name)
	const keep = 120
	if len(safe) > keep {
		safe = fmt.Sprintf("%s-%08x", strings.ToValidUTF8(safe[:keep], "_"), crc32.ChecksumIEEE([]byte(name)))
	}
	return safe
}

// unique returns a new number for names.
func (r *runner) unique() int64 { return r.seq.Add(1) }

// largeData is cfg.Size bytes of random data: incompressible, and
// different at every offset, so that a misplaced block is caught.
func (r *runner) largeData() []byte {
	if r.data == nil {
		r.data = randomBytes(r.cfg.Size, 1)
	}
	return r.data
}

// scratchBuf is a buffer of cfg.Size bytes, its pages already touched so
// that page faults are not timed.
func (r *runner) scratchBuf() []byte {
	if r.scratch == nil {
		r.scratch = make([]byte, r.cfg.Size)
		for i := 0; i < len(r.scratch); i += 4096 {
			r.scratch[i] = 1
		}
	}
	return r.scratch
}

func randomBytes(n int64, seed uint64) []byte {
	var s [32]byte
	s[0] = byte(seed)
	b := make([]byte, n)
	rand.NewChaCha8(s).Read(b)
	return b
}

// settle runs before every timed phase, of either side. It collects this
// process's garbage, so that a phase does not pay for the memory of the
// ones before it; then it writes back dirty pages and drops the page
// cache, dentries and inodes, so that what follows reads from the store,
// not from memory.
//
// Why the collection: after the Azurite figures this process holds
// gigabytes (the 1 GiB files and their buffers), so its heap goal is large
// and the collector seldom runs. A faulty-* repetition then got fresh
// pages for the fake store's blob copies instead of the last repetition's
// freed ones, and fresh pages are expensive to fault in on these machines
// (the in-memory store's copies took 6 of 18 CPU seconds of such a run,
// pprof). Run after seq-read, one direct faulty-write repetition in three
// took 0.99-1.00 s against 0.58-0.60 s; collected first, all took
// 0.58-0.59 s.
func (r *runner) settle() {
	runtime.GC()
	if !r.cfg.DropCaches || r.dropErr != nil {
		return
	}
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		r.dropErr = err
		r.logf("cannot drop caches (%v); continuing without", err)
	}
}

// side is one contestant of a figure: run sets up (a fresh mount, say),
// times the work itself and returns the time.
type side struct {
	name     string
	optional bool // an other client: its failure does not fail the figure
	// prepare, when set, runs before each of run's repetitions, as a
	// strategy's does (a fresh Azurite, say), outside what the
	// repetition's timing line reports.
	prepare func() error
	run     func(ctx context.Context) (time.Duration, error)
	// check, when set, runs after each repetition that succeeded, also
	// outside its timing line: an untimed read-back of what run wrote,
	// say, or its deletion.
	check func(ctx context.Context) error
}

// outcome is the best time of each side of a comparison.
type outcome struct {
	baseline     string
	baselineTime time.Duration
	times        map[string]time.Duration // contender name -> best time
	contenders   map[string]bool          // every contender, measured or failed
}

// compare picks the baseline and times it against the contenders.
//
// With several baseline strategies, each is first timed once to pick the
// fastest (the exploration round, logged but not counted). Then, cfg.Reps
// times, the chosen strategy and every contender are timed in turn, in
// alternating order (baseline first in odd repetitions, last in even
// ones), and each side's best time counts. Exploration times are not
// counted, so that the baseline gets no more chances than blobfs: picking
// the best of many single noisy runs would favour it. value turns a time
// into the figure's unit for the log. The first contender is blobfs: its
// failure fails the comparison; an optional contender's failure is logged.
func (r *runner) compare(ctx context.Context, fig, kind string, value func(time.Duration) string, baselines []strategy, contenders []side) (outcome, error) {
	best := map[string]time.Duration{}
	keep := func(name string, d time.Duration) {
		if b, ok := best[name]; !ok || d < b {
			best[name] = d
		}
	}
	storeCPU := r.storeCPUMeter(fig)
	timeStrategy := func(s strategy, label string) (time.Duration, error) {
		if s.prepare != nil {
			if err := s.prepare(); err != nil {
				return 0, fmt.Errorf("%s %s: %w", kind, s.name, err)
			}
		}
		r.settle()
		cpu := storeCPU()
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return 0, fmt.Errorf("%s %s: %w", kind, s.name, err)
		}
		d := time.Since(start)
		used := cpu(d)
		if s.check != nil {
			if err := s.check(ctx); err != nil {
				return 0, fmt.Errorf("%s %s: %w", kind, s.name, err)
			}
		}
		r.detail("%-13s %-7s %-40s %8.3f s  %s%s", fig, label, kind+" "+s.name, d.Seconds(), value(d), used)
		return d, nil
	}
	failed := map[string]bool{}
	timeSide := func(s side, label string) error {
		if failed[s.name] {
			return nil
		}
		d, used, err := func() (time.Duration, string, error) {
			if s.prepare != nil {
				if err := s.prepare(); err != nil {
					return 0, "", err
				}
				r.settle() // as a strategy's: what prepare left going
			}
			cpu := storeCPU()
			d, err := s.run(ctx)
			used := cpu(d)
			if err == nil && s.check != nil {
				err = s.check(ctx)
			}
			return d, used, err
		}()
		if err != nil {
			if !s.optional {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			failed[s.name] = true
			r.detail("%-13s %-7s %-40s failed: %v", fig, label, s.name, err)
			return nil
		}
		r.detail("%-13s %-7s %-40s %8.3f s  %s%s", fig, label, s.name, d.Seconds(), value(d), used)
		keep(s.name, d)
		return nil
	}

	winner := baselines[0]
	if len(baselines) > 1 {
		var fastest time.Duration
		for i, s := range baselines {
			d, err := timeStrategy(s, "explore")
			if err != nil {
				return outcome{}, err
			}
			if i == 0 || d < fastest {
				winner, fastest = s, d
			}
		}
	}
	const baselineKey = "\x00baseline"
	for rep := 1; rep <= r.cfg.Reps; rep++ {
		label := fmt.Sprintf("rep %d", rep)
		timeBaseline := func() error {
			d, err := timeStrategy(winner, label)
			if err == nil {
				keep(baselineKey, d)
			}
			return err
		}
		if rep%2 == 1 {
			if err := timeBaseline(); err != nil {
				return outcome{}, err
			}
		}
		for _, s := range contenders {
			if err := ctx.Err(); err != nil {
				return outcome{}, err
			}
			if err := timeSide(s, label); err != nil {
				return outcome{}, err
			}
		}
		if rep%2 == 0 {
			if err := timeBaseline(); err != nil {
				return outcome{}, err
			}
		}
	}
	out := outcome{
		baseline:     winner.name,
		baselineTime: best[baselineKey],
		times:        map[string]time.Duration{},
		contenders:   map[string]bool{},
	}
	for _, s := range contenders {
		out.contenders[s.name] = true
		if d, ok := best[s.name]; ok {
			out.times[s.name] = d
		}
	}
	return out, nil
}

// clientSides turns blobfs and the other clients into contenders, each run
// by do with that client.
func (r *runner) clientSides(do func(ctx context.Context, c client) (time.Duration, error)) []side {
	sides := []side{{name: r.blobfs.name, run: func(ctx context.Context) (time.Duration, error) { return do(ctx, r.blobfs) }}}
	for _, c := range r.others {
		sides = append(sides, side{name: c.name, optional: true, run: func(ctx context.Context) (time.Duration, error) { return do(ctx, c) }})
	}
	return sides
}

// withMount mounts c on a fresh directory, runs f with the mountpoint and
// unmounts. An unmount failure fails the run: data may not be durable.
func (r *runner) withMount(ctx context.Context, c client, f func(dir string) (time.Duration, error)) (d time.Duration, err error) {
	dir, err := r.newDir("mnt-" + c.name)
	if err != nil {
		return 0, err
	}
	scratch, err := r.newDir("cache-" + c.name)
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(scratch)
	m, err := c.mount(ctx, dir, scratch)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := m.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	d, err = f(m.Dir())
	if p, ok := m.(*procMount); ok && err != nil {
		// What the client said about it (blobfs logs warnings and
		// errors here): "input/output error" alone says nothing.
		if out := strings.TrimSpace(p.out.String()); out != "" {
			if len(out) > 2048 {
				out = "…" + out[len(out)-2048:]
			}
			err = fmt.Errorf("%w; %s said: %s", err, c.name, out)
		}
	}
	return d, err
}

// readFileInto reads path sequentially into dst in requests of 1 MiB (the
// largest READ the kernel sends blobfs) and checks that it is exactly
// len(dst) bytes long.
func readFileInto(ctx context.Context, path string, dst []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	off := 0
	for i := 0; ; i++ {
		if i%256 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		end := min(off+MiB, len(dst))
		if off == end {
			// One more read must see end of file.
			var one [1]byte
			n, err := f.Read(one[:])
			if n > 0 {
				return fmt.Errorf("%s is longer than %d bytes", path, len(dst))
			}
			if err != io.EOF {
				return fmt.Errorf("read %s past its end: %v", path, err)
			}
			return nil
		}
		n, err := f.Read(dst[off:end])
		off += n
		if err == io.EOF {
			if off != len(dst) {
				return fmt.Errorf("%s has %d bytes, want %d", path, off, len(dst))
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// errCloseInterrupted: close(2) on a file written through a mount failed
// with EINTR. The FLUSH that close sends was interrupted: a signal reached
// the writer while it waited (Go's runtime preempts goroutines with
// SIGURG), the kernel sent FUSE_INTERRUPT, and the filesystem gave up the
// commit. Whether the data is durable is then for the store to tell, so
// the figures keep going and wait for the blob; the count goes into the
// report because applications rarely check close's error.
var errCloseInterrupted = errors.New("close: interrupted (EINTR)")

func closeFile(f *os.File) error {
	err := f.Close()
	if errors.Is(err, syscall.EINTR) {
		return fmt.Errorf("%w: %v", errCloseInterrupted, err)
	}
	return err
}

// writeFileFrom writes data to a new file at path in requests of 1 MiB and
// closes it; close is when blobfs commits.
func writeFileFrom(ctx context.Context, path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	for off, i := 0, 0; off < len(data); i++ {
		if i%256 == 0 && ctx.Err() != nil {
			f.Close()
			return ctx.Err()
		}
		end := min(off+MiB, len(data))
		n, err := f.Write(data[off:end])
		if err != nil {
			f.Close()
			return err
		}
		off += n
	}
	return closeFile(f)
}

// verify compares what was read with what was written.
func verify(got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("read %d bytes, want %d", len(got), len(want))
	}
	for off := 0; off < len(got); off += MiB {
		end := min(off+MiB, len(got))
		if string(got[off:end]) != string(want[off:end]) {
			return fmt.Errorf("data differs in the MiB at offset %d", off)
		}
	}
	return nil
}

// durableTimeout bounds how long a client may take, after close, to make a
// file durable (rclone, say, may upload after close).
const durableTimeout = 2 * time.Minute

// waitDurable polls check until it reports true and returns when it did;
// a check that is true at once returns the time of the call.
func waitDurable(ctx context.Context, check func(context.Context) (bool, error)) (time.Time, bool, error) {
	first := true
	deadline := time.Now().Add(durableTimeout)
	for {
		ok, err := check(ctx)
		if err != nil {
			return time.Time{}, false, err
		}
		if ok {
			return time.Now(), first, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, false, fmt.Errorf("not in the store %v after close", durableTimeout)
		}
		first = false
		select {
		case <-ctx.Done():
			return time.Time{}, false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func mbps(n int64) func(time.Duration) string {
	return func(d time.Duration) string { return formatValue(float64(n)/d.Seconds()/1e6, UnitMBps) }
}

func gbps(n int64) func(time.Duration) string {
	return func(d time.Duration) string { return formatValue(float64(n)/d.Seconds()/1e9, UnitGBps) }
}

func filesPerSec(n int) func(time.Duration) string {
	return func(d time.Duration) string { return formatValue(float64(n)/d.Seconds(), UnitFilesS) }
}

// fill completes a row from a comparison: rate converts a best time into
// the row's unit; kind prefixes the baseline's name.
func (r *runner) fill(row Row, out outcome, rate func(time.Duration) float64, kind string) Row {
	row.Baseline = rate(out.baselineTime)
	row.BaselineName = kind + out.baseline
	if d, ok := out.times[blobfsName]; ok {
		row.Blobfs = rate(d)
	}
	for _, c := range r.others {
		if !out.contenders[c.name] {
			continue
		}
		if row.Others == nil {
			row.Others = map[string]float64{}
		}
		if d, ok := out.times[c.name]; ok {
			row.Others[c.name] = rate(d)
		} else {
			row.Others[c.name] = 0 // failed
		}
	}
	return row
}

func throughput(n int64) func(time.Duration) float64 {
	return func(d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
}

func rate(n int) func(time.Duration) float64 {
	return func(d time.Duration) float64 { return float64(n) / d.Seconds() }
}

// joinPath is filepath.Join for blob names used as paths in a mount.
func joinPath(dir, name string) string { return filepath.Join(dir, filepath.FromSlash(name)) }

// freshAzurite runs Config.FreshAzurite and creates the run's container
// again in the Azurite it leaves. A container still there means the
// command left the old Azurite running: an error, as the figure would
// not be measured on a fresh one.
func (r *runner) freshAzurite(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "sh", "-c", r.cfg.FreshAzurite)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("-fresh-azurite %q: %w: %s", r.cfg.FreshAzurite, err, bytes.TrimSpace(out))
	}
	if _, err := r.az.client.Create(ctx, nil); err != nil {
		if bloberror.HasCode(err, bloberror.ContainerAlreadyExists) {
			return fmt.Errorf("-fresh-azurite %q left container %s in place: not a fresh Azurite", r.cfg.FreshAzurite, r.az.container)
		}
		return fmt.Errorf("create container %s again after -fresh-azurite: %w", r.az.container, err)
	}
	r.logf("fresh Azurite: %s", bytes.TrimSpace(out))
	return nil
}
