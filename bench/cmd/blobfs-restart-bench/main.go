// Command blobfs-restart-bench measures what the keeper buys when blobfs's
// CSI node driver restarts: the time from a driver's start to serving 1, 10
// and 100 adopted mounts, against a fresh driver staging them all again,
// and the pause a streaming reader sees across a SIGKILL + restart and a
// graceful handoff. It prints markdown tables of medians and ratios. See
// bench.RunRestart for the method.
//
//	make bench-restart                               # starts a private Azurite; the full run
//	make bench-restart BENCH_ARGS=-quick             # 1 and 10 mounts, 2 repetitions
//	go run ./bench/cmd/blobfs-restart-bench -endpoint http://127.0.0.1:10000/devstoreaccount1 -mounts 1,10 -reps 3
//
// It needs root (the driver mounts with mount(2)), /dev/fuse and a blobfs
// binary (-blobfs, default bin/blobfs).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/blobfs/blobfs/bench"
)

func main() {
	// This executable is also the benchmark's application processes.
	bench.RestartAppMain()
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "blobfs-restart-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	quick   bool
	mounts  string
	quiet   bool
	out     string
	timeout time.Duration
}

func newFlags(c *bench.RestartConfig, o *options) *flag.FlagSet {
	fl := flag.NewFlagSet("blobfs-restart-bench", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: blobfs-restart-bench [flags]\n\n")
		fl.PrintDefaults()
	}
	fl.BoolVar(&o.quick, "quick", false, "smoke run: 1 and 10 mounts, 2 repetitions, an 8 MiB streamed file (other flags still apply)")
	fl.StringVar(&o.mounts, "mounts", joinInts(c.Mounts), "comma-separated mount counts to measure")
	fl.IntVar(&c.Reps, "reps", c.Reps, "repetitions of each measurement; medians are reported")
	fl.StringVar(&c.Endpoint, "endpoint", c.Endpoint, "Azurite blob endpoint with the account (env BLOBFS_TEST_AZURITE)")
	fl.StringVar(&c.Key, "key", c.Key, "account key (env BLOBFS_TEST_AZURITE_KEY; default Azurite's well-known key)")
	fl.StringVar(&c.BlobfsBin, "blobfs", c.BlobfsBin, "blobfs binary (make build)")
	fl.Int64Var(&c.StreamSize, "stream-size", c.StreamSize, "size in bytes of the file the streaming reader reads")
	fl.Int64Var(&c.StreamRate, "stream-rate", c.StreamRate, "bytes per second the streaming reader reads")
	fl.StringVar(&c.WorkDir, "workdir", c.WorkDir, "directory for the nodes' kubelet directories, state and logs (default: a temporary one, removed)")
	fl.BoolVar(&c.KeepContainers, "keep-containers", c.KeepContainers, "leave the Azurite containers in place")
	fl.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	fl.StringVar(&o.out, "out", "", "also write the report to this file")
	fl.DurationVar(&o.timeout, "timeout", time.Hour, "give up after this long")
	return fl
}

func run(args []string) error {
	c, o, err := bench.ParseFlags(args, func(quick bool) bench.RestartConfig {
		if quick {
			return bench.QuickRestartConfig()
		}
		return bench.DefaultRestartConfig()
	}, newFlags, func(o *options) bool { return o.quick }, func(c *bench.RestartConfig) { bench.AzuriteFromEnv(&c.Endpoint, &c.Key) })
	if err != nil {
		return err
	}
	mounts, err := parseInts(o.mounts)
	if err != nil {
		return fmt.Errorf("-mounts: %w", err)
	}
	c.Mounts = mounts
	if !o.quiet {
		c.Log = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	rep, err := bench.RunRestart(ctx, c)
	if rep == nil {
		return err
	}
	if mdErr := bench.WriteReport(rep.Markdown, o.out); mdErr != nil {
		return mdErr
	}
	return errors.Join(err, rep.Err())
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no mount count given")
	}
	return out, nil
}
