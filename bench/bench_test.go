package bench

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// TestQuickAzurite runs the whole harness in -quick mode against the
// Azurite named by $BLOBFS_TEST_AZURITE, so that it keeps compiling and
// working. It checks that every figure was measured and that the data read
// back was right; it does not check targets, which depend on the machine.
func TestQuickAzurite(t *testing.T) {
	cfg := harnessConfig(t)
	// Smaller than -quick: under -race (as CI runs it) this stays well
	// within a minute.
	cfg.Size = 16 * MiB
	cfg.SmallFiles = 40
	cfg.FaultySize = 16 * MiB
	cfg.MemorySize = 64 * MiB
	cfg.BlockCacheMB = 16
	cfg.Mounts = 4
	cfg.MountFileSize = 8 * MiB
	// The Azurite mounts' cache too: seq-read-warm reads as many files
	// as it takes to pass the cache.
	cfg.BlobfsArgs = []string{"--block-cache-mb=16"}
	cfg.Figures = FigureIDs() // the opt-in ones too
	if testing.Verbose() {
		cfg.Log = testLog{t}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var cpus, azuriteHad unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		t.Fatal(err)
	}
	if proc, ok := (&azureEnv{endpoint: cfg.Endpoint}).storeProcess(); ok {
		unix.SchedGetaffinity(proc.pid, &azuriteHad)
	}
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	table := logReport(t, rep)
	for _, id := range FigureIDs() {
		row, ok := rep.Row(id)
		if !ok {
			t.Errorf("figure %s missing from the report", id)
			continue
		}
		if id == FigSeqWriteOwnCPU && errors.Is(row.Err, errNoCPUOfItsOwn) {
			t.Logf("figure %s not measured here: %v", id, row.Err)
			continue
		}
		if row.Blobfs <= 0 || row.Baseline <= 0 {
			t.Errorf("figure %s: blobfs %v, baseline %v: not measured", id, row.Blobfs, row.Baseline)
		}
		if !strings.Contains(table, "| "+row.Figure+" |") {
			t.Errorf("figure %s has no line in the table", id)
		}
	}
	checkStoreCPUOnTimings(t, rep.Details)
	// seq-write-own-cpu gave this process and Azurite (shared with the
	// other tests, pinned for the second or two of that figure) their
	// CPUs back.
	if err := threadsOnCPUs(os.Getpid(), &cpus); err != nil {
		t.Errorf("after the run: %v", err)
	}
	if proc, ok := (&azureEnv{endpoint: cfg.Endpoint}).storeProcess(); ok && azuriteHad.Count() > 0 {
		if err := threadsOnCPUs(proc.pid, &azuriteHad); err != nil {
			t.Errorf("Azurite after the run: %v", err)
		}
	}
}

// checkStoreCPUOnTimings: where the Azurite CPU meter could read Azurite
// at all (its process on this machine, in this PID namespace), every
// timing line of an Azurite figure carries it.
func checkStoreCPUOnTimings(t *testing.T, details []string) {
	t.Helper()
	const meter = "(Azurite CPU "
	var timings []string
	for _, line := range details {
		fig, _, _ := strings.Cut(line, " ")
		if !slices.Contains(azuriteFigures, fig) {
			continue
		}
		// compare's lines end with a value and a unit; the write-back
		// figures' with the time until durable.
		if timingLine.MatchString(line) {
			timings = append(timings, line)
		}
	}
	if !slices.ContainsFunc(timings, func(l string) bool { return strings.Contains(l, meter) }) {
		t.Logf("no timing line carries the Azurite CPU meter: Azurite's process is not readable here")
		return
	}
	for _, l := range timings {
		if !strings.Contains(l, meter) {
			t.Errorf("a timing line of an Azurite figure lacks the Azurite CPU meter: %q", l)
		}
	}
}

var timingLine = regexp.MustCompile(`\d\.\d{3} s  \S|durable +\d+\.\d{3} s`)

// harnessConfig returns QuickConfig for a test of the harness against the
// Azurite named by $BLOBFS_TEST_AZURITE, with a blobfs built for it, or
// skips the test where it cannot run.
func harnessConfig(t *testing.T) Config {
	t.Helper()
	endpoint, key := azuriteForHarness(t, "the benchmark harness")
	cfg := QuickConfig()
	cfg.Endpoint = endpoint
	if key != "" {
		cfg.Key = key
	}
	cfg.BlobfsBin = buildBlobfs(t)
	cfg.WorkDir = t.TempDir()
	cfg.Others = false
	// Other packages' tests run beside these: do not flush the whole
	// machine's page cache under them.
	cfg.DropCaches = false
	return cfg
}

// azuriteForHarness returns the Azurite endpoint named by
// $BLOBFS_TEST_AZURITE and its key ("" for the default), or skips the test
// where a harness that mounts cannot run: no Azurite, not root, no
// /dev/fuse. what names the test in the skip message.
func azuriteForHarness(t *testing.T, what string) (endpoint, key string) {
	t.Helper()
	endpoint = os.Getenv(storetest.EnvAzurite)
	if endpoint == "" {
		t.Skipf("set %s=http://127.0.0.1:10000/devstoreaccount1 after `.ci/azurite.sh start` to run %s", storetest.EnvAzurite, what)
	}
	if os.Geteuid() != 0 {
		t.Skip("the harness mounts with mount(2): run as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	return endpoint, os.Getenv(storetest.EnvAzuriteKey)
}

// logReport logs a report's tables, fails the test if a row failed, and
// returns the tables.
func logReport(t *testing.T, rep interface {
	Markdown(io.Writer) error
	Err() error
}) string {
	t.Helper()
	var table strings.Builder
	if err := rep.Markdown(&table); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + table.String())
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	return table.String()
}

// buildBlobfs builds cmd/blobfs into a temporary directory, with the race
// detector when this test has it, so that the packages compiled for the
// test are reused.
func buildBlobfs(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build blobfs: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "blobfs")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/blobfs/blobfs/cmd/blobfs")
	if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestBlobfsCacheBytes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, 256 * MiB},
		{[]string{"--readahead-blocks=4"}, 256 * MiB},
		{[]string{"--block-cache-mb=64"}, 64 * MiB},
		{[]string{"--block-cache-mb", "96", "--readahead-blocks", "4"}, 96 * MiB},
		{[]string{"-block-cache-mb", "32", "--block-cache-mb=48"}, 48 * MiB},
	} {
		if got := blobfsCacheBytes(tc.args); got != tc.want {
			t.Errorf("blobfsCacheBytes(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}

func TestParseFigures(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "all", want: DefaultFigureIDs()},
		{in: "all,seq-read-warm,random,write-back", want: FigureIDs()},
		{in: "random", want: []string{FigRandRead, FigRandReadWarm, FigSeqReadCached}},
		{in: "memory,seq-read", want: []string{FigSeqRead, FigMemory}},
		{in: "small, fuse", want: []string{FigSmallCreate, FigSmallList, FigSmallRead, FigFUSE}},
		{in: "seq,seq-read", want: []string{FigSeqRead, FigSeqWrite, FigSeqWriteOwnCPU}},
		{in: "local", want: []string{FigFaultyRead, FigFaultyWrite, FigFaultyCreate, FigFaultyLog, FigFUSE, FigMemory, FigMemoryMounts}},
		{in: "seq-reed", wantErr: true},
		{in: " , ", wantErr: true},
	} {
		got, err := ParseFigures(tc.in)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("ParseFigures(%q) = %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestFreshAzuriteRefused: -fresh-azurite runs before every Azurite figure
// but the first, and a command that fails, or leaves the old Azurite (its
// container still there), fails the figure instead of measuring it on a
// used Azurite. (make bench's restart itself is the positive case.)
func TestFreshAzuriteRefused(t *testing.T) {
	base := harnessConfig(t)
	base.SmallFiles = 5
	base.Reps = 1
	base.Figures = []string{FigSmallList, FigFaultyCreate, FigSmallRead}
	base.FaultyLatency = 0
	for _, c := range []struct{ cmd, want string }{
		{"true", "left container"},
		{"echo no azurite here; exit 3", "no azurite here"},
	} {
		cfg := base
		cfg.FreshAzurite = c.cmd
		rep, err := Run(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		first, _ := rep.Row(FigSmallList)
		local, _ := rep.Row(FigFaultyCreate)
		second, _ := rep.Row(FigSmallRead)
		if first.Err != nil || local.Err != nil {
			t.Errorf("%q: the first Azurite figure (%v) and a local one (%v) need no fresh Azurite", c.cmd, first.Err, local.Err)
		}
		if second.Err == nil || !strings.Contains(second.Err.Error(), c.want) {
			t.Errorf("%q: second Azurite figure: %v, want an error saying %q", c.cmd, second.Err, c.want)
		}
	}
}

// A side's directories carry its name, and -compare-args may hold a path
// ("--cache-dir=/dev/shm/x"): the side was refused with "pattern contains
// path separator" before.
func TestNewDirOfAPathInArgs(t *testing.T) {
	r := &runner{work: t.TempDir()}
	dir, err := r.newDir("mnt-blobfs --cache-dir=/dev/shm/x")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != r.work {
		t.Fatalf("made %s, not in %s", dir, r.work)
	}
	if got := pathSafe("write-blobfs --cache-dir=/dev/shm/x-6.bin"); strings.ContainsRune(got, '/') {
		t.Fatalf("a file name with a separator: %q", got)
	}
	// Long -compare-args made "file name too long".
	long := "mnt-blobfs " + strings.Repeat("--readahead-blocks=4 ", 20)
	if _, err := r.newDir(long); err != nil {
		t.Fatal(err)
	}
	if a, b := pathSafe(long+"a"), pathSafe(long+"b"); a == b || len(a) > 200 {
		t.Fatalf("long names cut to %q and %q", a, b)
	}
}

// -inprocess mounts fusefs with its default options: mount flags for the
// binary are refused, not measured as if applied.
func TestInProcessRefusesArgs(t *testing.T) {
	for _, c := range []Config{
		{InProcess: true, CompareArgs: []string{"--upload-concurrency=8"}},
		{InProcess: true, BlobfsArgs: []string{"--readahead-blocks=4"}},
	} {
		c.Figures, c.Reps = []string{FigFaultyRead}, 1
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), "-inprocess") {
			t.Errorf("%+v: %v, want a refusal naming -inprocess", c, err)
		}
	}
}
