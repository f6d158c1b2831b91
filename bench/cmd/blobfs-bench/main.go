// Command blobfs-bench measures blobfs against the raw azblob SDK on the
// same Azurite, side by side in one run, and prints a markdown table of
// ratios. See package bench for the figures and the method.
//
//	make build && ./.ci/azurite.sh start
//	go run ./bench/cmd/blobfs-bench                 # the full run (1 GiB files, 3 repetitions)
//	go run ./bench/cmd/blobfs-bench -quick          # a 64 MiB smoke run
//	go run ./bench/cmd/blobfs-bench -figures seq-read,memory -reps 5
//	go run ./bench/cmd/blobfs-bench -report-dir bench-report   # also report.{json,tsv,md,svg} there
//	go run ./bench/cmd/blobfs-bench -figures random -report-dir bench-report -merge   # its rows added
//
// It needs root (mount(2), dropping the page cache) and a blobfs binary
// (-blobfs, default bin/blobfs).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/blobfs/blobfs/bench"
)

func main() {
	if child, err := bench.ServeMountsChild(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "blobfs-bench: serving mounts:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "blobfs-bench:", err)
		os.Exit(1)
	}
}

// options are the flags that are not part of bench.Config.
type options struct {
	quick       bool
	figures     string
	blobfsArgs  string
	compareArgs string
	quiet       bool
	out         string
	reportDir   string
	merge       bool
	cpuProfile  string
	timeout     time.Duration
}

// newFlags registers every flag with defaults taken from c.
func newFlags(c *bench.Config, o *options) *flag.FlagSet {
	fl := flag.NewFlagSet("blobfs-bench", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: blobfs-bench [flags]\n\nFigures: %s\n(groups: all, seq, small, random, write-back, faulty, azurite, local; \"all\" leaves out %s, which run when named)\n\n",
			strings.Join(bench.FigureIDs(), ", "), strings.Join(bench.OptInFigureIDs(), ", "))
		fl.PrintDefaults()
	}
	fl.BoolVar(&o.quick, "quick", false, "smoke run: 64 MiB files, 100 small files, 1 repetition, few SDK strategies (other flags still apply)")
	fl.StringVar(&o.figures, "figures", "all", "comma-separated figures or groups to run")
	fl.StringVar(&c.Endpoint, "endpoint", c.Endpoint, "Azurite blob endpoint with the account (env BLOBFS_TEST_AZURITE)")
	fl.StringVar(&c.Key, "key", c.Key, "account key (env BLOBFS_TEST_AZURITE_KEY; default Azurite's well-known key)")
	fl.StringVar(&c.BlobfsBin, "blobfs", c.BlobfsBin, "blobfs binary (make build)")
	fl.StringVar(&o.blobfsArgs, "blobfs-args", "", "extra `blobfs mount` flags, space-separated, e.g. \"--readahead-blocks=32\"")
	fl.StringVar(&o.compareArgs, "compare-args", "", "also measure a second blobfs with these extra mount flags, beside the first in one run, e.g. \"--posix-attrs=false\"")
	fl.BoolVar(&c.InProcess, "inprocess", c.InProcess, "diagnostic: serve the Azurite figures' blobfs mount in this process (profile it with -cpuprofile)")
	fl.IntVar(&c.Reps, "reps", c.Reps, "timed repetitions per side; the best counts")
	fl.Var(byteSize{&c.Size}, "size", "large file size (seq-read, seq-write, fuse)")
	fl.IntVar(&c.SmallFiles, "small-files", c.SmallFiles, "number of small files")
	fl.Var(intSize{&c.SmallFileSize}, "small-size", "size of each small file")
	fl.Var(byteSize{&c.FaultySize}, "faulty-size", "file size of the faulty-* figures")
	fl.DurationVar(&c.FaultyLatency, "faulty-latency", c.FaultyLatency, "latency the fake store adds to every call")
	fl.Var(byteSize{&c.FaultyBandwidth}, "faulty-bandwidth", "the fake store's bandwidth per stream, per second")
	fl.Var(byteSize{&c.MemorySize}, "memory-size", "file size streamed by the memory figure")
	fl.Int64Var(&c.BlockCacheMB, "block-cache-mb", c.BlockCacheMB, "--block-cache-mb of the memory figure's mount")
	fl.BoolVar(&c.FewStrategies, "few-strategies", c.FewStrategies, "try only three SDK strategies for seq-read and seq-write")
	fl.BoolVar(&c.Others, "others", c.Others, "also measure blobfuse2 and rclone when on PATH")
	fl.BoolVar(&c.DropCaches, "drop-caches", c.DropCaches, "drop the page cache before timed phases (root)")
	fl.StringVar(&c.WorkDir, "workdir", c.WorkDir, "directory for mountpoints, caches and the local store (default $TMPDIR)")
	fl.BoolVar(&c.KeepContainer, "keep-container", c.KeepContainer, "leave the Azurite container in place")
	fl.StringVar(&c.FreshAzurite, "fresh-azurite", c.FreshAzurite, "shell command run before every Azurite figure but the first, and every seq-write and seq-write-own-cpu repetition, that leaves an empty Azurite at the endpoint, e.g. restarts an in-memory one (make bench sets it)")
	fl.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fl.StringVar(&o.out, "out", "", "also write the report to this file")
	fl.StringVar(&o.reportDir, "report-dir", "", "also write the report into this directory as report.json, report.tsv, report.md and report.svg")
	fl.BoolVar(&o.merge, "merge", false, "with -report-dir: add this run's figures to the report there (a figure in both takes this run's row) instead of replacing it")
	fl.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (covers in-process mounts)")
	fl.DurationVar(&o.timeout, "timeout", 2*time.Hour, "give up after this long")
	return fl
}

func run(args []string) error {
	c, o, err := bench.ParseFlags(args, func(quick bool) bench.Config {
		if quick {
			return bench.QuickConfig()
		}
		return bench.DefaultConfig()
	}, newFlags, func(o *options) bool { return o.quick }, func(c *bench.Config) { bench.AzuriteFromEnv(&c.Endpoint, &c.Key) })
	if err != nil {
		return err
	}
	figs, err := bench.ParseFigures(o.figures)
	if err != nil {
		return err
	}
	c.Figures = figs
	c.BlobfsArgs = strings.Fields(o.blobfsArgs)
	c.CompareArgs = strings.Fields(o.compareArgs)
	// Merging is asked for, never implied by a report.json being there:
	// the directory outlives runs (make bench leaves bench-report/), and
	// an implicit append would fold last week's rows into today's report.
	// And it happens here, not in a separate merge command over two
	// files, so that a two-part run (.ci/bench.sh) is two calls with one
	// directory and no intermediate files. The earlier report is read and
	// checked against this run's configuration before a run that may take
	// an hour, not after it.
	var earlier *bench.Report
	if o.merge {
		if o.reportDir == "" {
			return errors.New("-merge needs -report-dir")
		}
		if earlier, err = bench.ReadReportDir(o.reportDir); err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
		if err := earlier.Accepts(c); err != nil {
			return err
		}
	}
	if !o.quiet {
		c.Log = os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	rep, err := bench.Run(ctx, c)
	if err != nil {
		return err
	}
	if err := bench.WriteReport(rep.Markdown, o.out); err != nil {
		return err
	}
	if o.reportDir != "" {
		whole := rep
		if earlier != nil {
			if whole, err = bench.Merge(earlier, rep); err != nil {
				return err
			}
		}
		if err := bench.WriteReportDir(o.reportDir, whole); err != nil {
			return err
		}
		if !o.quiet {
			fmt.Fprintf(os.Stderr, "blobfs-bench: report in %s: %s, %s, %s, %s\n", o.reportDir,
				bench.ReportJSONFile, bench.ReportTSVFile, bench.ReportMarkdownFile, bench.ReportSVGFile)
		}
	}
	return rep.Err()
}

// byteSize is a flag holding a size such as 4096, 64MiB, 1GiB or 1G.
type byteSize struct{ p *int64 }

func (b byteSize) String() string {
	if b.p == nil {
		return ""
	}
	return formatSize(*b.p)
}

func (b byteSize) Set(s string) error {
	v, err := parseSize(s)
	if err != nil {
		return err
	}
	*b.p = v
	return nil
}

// intSize is byteSize for an int.
type intSize struct{ p *int }

func (b intSize) String() string {
	if b.p == nil {
		return ""
	}
	return formatSize(int64(*b.p))
}

func (b intSize) Set(s string) error {
	v, err := parseSize(s)
	if err != nil {
		return err
	}
	if v > 1<<31-1 {
		return fmt.Errorf("%s is too large", s)
	}
	*b.p = int(v)
	return nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", bench.GiB}, {"MiB", bench.MiB}, {"KiB", bench.KiB}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

// parseSize reads a byte count with an optional binary unit: K, KiB, M,
// MiB, G, GiB (all powers of 1024), case-insensitive.
func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", bench.KiB}, {"mib", bench.MiB}, {"gib", bench.GiB}, {"k", bench.KiB}, {"m", bench.MiB}, {"g", bench.GiB}, {"b", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (KiB, MiB, GiB)", s)
	}
	return v * mult, nil
}
