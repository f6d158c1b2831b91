// Command blobfs-dirbench times the listing of one large directory through
// one or more blobfs binaries, side by side in one run, and through the
// azblob SDK on the same Azurite: the first getdents (what `ls -f | head`
// waits for) and all of them (`ls -f`). With -tree DIRSxFILES it times
// `find` over a tree of DIRS directories of FILES files each instead,
// against one flat listing of the tree through the SDK. Each repetition
// mounts every binary afresh, in turn, so that they share the machine's
// noise; the best time of each counts, and ratios are to the first binary.
//
//	make build && git stash && go build -o /tmp/blobfs-old ./cmd/blobfs && git stash pop
//	AZURITE_PORT=10006 ./.ci/azurite.sh start
//	go run ./bench/cmd/blobfs-dirbench -endpoint http://127.0.0.1:10006/devstoreaccount1 \
//		-bin before=/tmp/blobfs-old,after=bin/blobfs -blobs 20000
//	go run ./bench/cmd/blobfs-dirbench -endpoint ... -bin after=bin/blobfs -tree 200x1000
//
// It needs root (mount(2)).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/bench"
	"github.com/blobfs/blobfs/blobstore"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "blobfs-dirbench:", err)
		os.Exit(1)
	}
}

// side is one way of listing the directory.
type side struct {
	name string
	// list returns the times to the open's end (the lookup; 0 for the
	// SDK), to the first entries and to all of them, and how many names
	// it saw.
	list func(ctx context.Context) (t times, n int, err error)
	best times
}

// times are the moments a listing reached, from its start, and the time
// from the open's end to the first entries.
type times struct{ open, first, all, afterOpen time.Duration }

func run(args []string) error {
	fl := flag.NewFlagSet("blobfs-dirbench", flag.ContinueOnError)
	var (
		endpoint = "http://127.0.0.1:10000/devstoreaccount1"
		key      string
	)
	bench.AzuriteFromEnv(&endpoint, &key)
	fl.StringVar(&endpoint, "endpoint", endpoint, "Azurite blob endpoint with the account (env BLOBFS_TEST_AZURITE)")
	fl.StringVar(&key, "key", key, "account key (env BLOBFS_TEST_AZURITE_KEY; default Azurite's well-known key)")
	bins := fl.String("bin", "blobfs=bin/blobfs", "comma-separated name=path of the blobfs binaries to compare; ratios are to the first")
	blobs := fl.Int("blobs", 20000, "blobs in the directory")
	reps := fl.Int("reps", 5, "repetitions; the best time of each side counts")
	tree := fl.String("tree", "", "DIRSxFILES: time find over a tree of DIRS directories of FILES files each instead of one directory")
	memory := fl.Bool("memory", false, "the memory store with -latency per request, served in this process, instead of Azurite")
	latency := fl.Duration("latency", 20*time.Millisecond, "with -memory: latency added to every store request")
	perEntry := fl.Int("per-entry", 0, "N: the heap blobfs grows by per entry while a directory of N blobs on the memory store is listed, instead of timings")
	keep := fl.String("keep", "", "use this container, filling it only if it lacks the blobs, and keep it afterwards (for repeated runs)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	var dirs, files int
	if *tree != "" {
		if _, err := fmt.Sscanf(*tree, "%dx%d", &dirs, &files); err != nil || dirs < 1 || files < 1 {
			return fmt.Errorf("-tree %q: want DIRSxFILES, e.g. 200x1000", *tree)
		}
		*blobs = dirs * files
	}
	if *perEntry > 0 || *memory {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if *perEntry > 0 {
			return runMemoryPerEntry(ctx, *perEntry)
		}
		if dirs == 0 {
			return runMemoryFlat(ctx, *blobs, *reps, *latency)
		}
		return runMemoryTree(ctx, dirs, files, *reps, *latency)
	}
	if key == "" {
		key = blobstore.AzuriteAccountKey
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	account := filepath.Base(strings.TrimRight(endpoint, "/"))
	cfg := blobstore.AzureConfig{Account: account, Endpoint: endpoint, Key: key, Auth: blobstore.AzureAuthKey,
		Container: cmp.Or(*keep, fmt.Sprintf("dirbench-%d", time.Now().UnixNano()))}
	if err := blobstore.CreateContainer(ctx, cfg, nil); err != nil && !(*keep != "" && errors.Is(err, blobstore.ErrAlreadyExists)) {
		return fmt.Errorf("create container: %w", err)
	}
	if *keep == "" {
		defer func() {
			c, cf := context.WithTimeout(context.Background(), time.Minute)
			defer cf()
			if err := blobstore.DeleteContainer(c, cfg); err != nil {
				fmt.Fprintln(os.Stderr, "delete container:", err)
			}
		}()
	}
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		return err
	}
	store := blobstore.NewRetrying(az, blobstore.RetryPolicy{})
	fill := *blobs
	if *keep != "" {
		if t, n, err := listTreeSDK(ctx, store, ""); err == nil && n == *blobs {
			fmt.Fprintf(os.Stderr, "container %s holds the %d blobs (listed in %v)\n", cfg.Container, n, t.all)
			fill = 0
		}
	}
	fmt.Fprintf(os.Stderr, "writing %d blobs ...\n", fill)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range fill {
		name := fmt.Sprintf("d/f%07d", i)
		if dirs > 0 {
			name = fmt.Sprintf("t/d%04d/f%06d", i/files, i%files)
		}
		g.Go(func() error {
			_, err := store.Put(gctx, name, nil, blobstore.PutOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("fill: %w", err)
	}

	if dirs > 0 {
		return runTree(ctx, *bins, cfg, store, dirs, files, *reps)
	}
	var sides []*side
	for _, nb := range strings.Split(*bins, ",") {
		name, path, ok := strings.Cut(nb, "=")
		if !ok {
			return fmt.Errorf("-bin %q: want name=path", nb)
		}
		sides = append(sides, &side{name: name, list: func(ctx context.Context) (times, int, error) {
			return listThroughMount(ctx, path, cfg)
		}})
	}
	sides = append(sides, &side{name: "SDK (List pages of 5000)", list: func(ctx context.Context) (times, int, error) {
		return listThroughSDK(ctx, store)
	}})
	for r := range *reps {
		for _, s := range sides {
			t, n, err := s.list(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if n != *blobs {
				return fmt.Errorf("%s listed %d names, want %d", s.name, n, *blobs)
			}
			fmt.Fprintf(os.Stderr, "rep %d %-26s open %7.1f ms  first %7.1f ms  all %8.1f ms\n", r+1, s.name, ms(t.open), ms(t.first), ms(t.all))
			if r == 0 {
				s.best = t
			}
			s.best.open = min(s.best.open, t.open)
			s.best.first = min(s.best.first, t.first)
			s.best.all = min(s.best.all, t.all)
			s.best.afterOpen = min(s.best.afterOpen, t.afterOpen)
		}
	}
	fmt.Printf("Directory of %d blobs on Azurite, best of %d, fresh mount each time; times from before the open.\n\n", *blobs, *reps)
	fmt.Println("| lister | open (lookup) | first entries | ratio | first entries after the open | ratio | all entries | ratio |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	base := sides[0].best
	for _, s := range sides {
		b := s.best
		fmt.Printf("| %s | %.0f ms | %.0f ms | %.2f | %.0f ms | %.2f | %.0f ms | %.2f |\n", s.name, ms(b.open),
			ms(b.first), ratio(b.first, base.first), ms(b.afterOpen), ratio(b.afterOpen, base.afterOpen),
			ms(b.all), ratio(b.all, base.all))
	}
	return nil
}

// runTree times find over t/ through each binary, and one flat listing of
// t/ through the SDK, and prints the table; ratios are to the SDK.
func runTree(ctx context.Context, bins string, cfg blobstore.AzureConfig, store blobstore.Store, dirs, files, reps int) error {
	var sides []*side
	for _, nb := range strings.Split(bins, ",") {
		name, path, ok := strings.Cut(nb, "=")
		if !ok {
			return fmt.Errorf("-bin %q: want name=path", nb)
		}
		sides = append(sides, &side{name: name, list: func(ctx context.Context) (times, int, error) {
			return findThroughMount(ctx, path, cfg)
		}})
	}
	sdk := &side{name: "SDK (one flat listing, pages of 5000)", list: func(ctx context.Context) (times, int, error) {
		return listTreeSDK(ctx, store, "t/")
	}}
	return timeTree(ctx, sides, sdk, dirs, files, reps, "on Azurite", "the SDK's flat listing")
}

// timeTree runs find through every side and the flat listing sdk, reps
// times in turn, checks what each saw, and prints the best times as a
// table of speed ratios to sdk.
func timeTree(ctx context.Context, sides []*side, sdk *side, dirs, files, reps int, where, base string) error {
	sides = append(sides, sdk)
	for r := range reps {
		for _, s := range sides {
			t, n, err := s.list(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			if s != sdk && n != dirs*files+dirs {
				return fmt.Errorf("%s: find printed %d paths below t, want %d", s.name, n, dirs*files+dirs)
			} else if s == sdk && n != dirs*files {
				return fmt.Errorf("%s listed %d blobs, want %d", s.name, n, dirs*files)
			}
			fmt.Fprintf(os.Stderr, "rep %d %-48s all %8.1f ms\n", r+1, s.name, ms(t.all))
			if r == 0 || t.all < s.best.all {
				s.best = t
			}
		}
	}
	fmt.Printf("find over %d directories of %d files (%d blobs) %s, best of %d, fresh mount each time.\n\n", dirs, files, dirs*files, where, reps)
	fmt.Printf("| lister | whole tree | speed, ratio to %s |\n", base)
	fmt.Println("|---|---:|---:|")
	for _, s := range sides {
		fmt.Printf("| %s | %.0f ms | %.2f |\n", s.name, ms(s.best.all), ratio(sdk.best.all, s.best.all))
	}
	return nil
}

// findThroughMount mounts the container with bin and times `find t`.
func findThroughMount(ctx context.Context, bin string, cfg blobstore.AzureConfig) (t times, n int, err error) {
	err = withMount(ctx, bin, cfg, func(mnt string) error {
		start := time.Now()
		out, err := exec.CommandContext(ctx, "find", filepath.Join(mnt, "t")).Output()
		if err != nil {
			return fmt.Errorf("find: %w", err)
		}
		t.all = time.Since(start)
		n = strings.Count(string(out), "\n") - 1 // not t itself
		return nil
	})
	return t, n, err
}

// listTreeSDK lists t/ flat, page by page, as a program using the SDK
// would, and counts the blobs.
func listTreeSDK(ctx context.Context, store blobstore.Store, prefix string) (t times, n int, err error) {
	start := time.Now()
	opts := blobstore.ListOptions{Prefix: prefix}
	for {
		page, err := store.List(ctx, opts)
		if err != nil {
			return times{}, 0, err
		}
		n += len(page.Blobs)
		if page.NextMarker == "" {
			t.all = time.Since(start)
			return t, n, nil
		}
		opts.Marker = page.NextMarker
	}
}

// withMount mounts the container with bin on a fresh mountpoint and cache
// directory, runs f, and unmounts.
func withMount(ctx context.Context, bin string, cfg blobstore.AzureConfig, f func(mnt string) error) (err error) {
	dir, err := os.MkdirTemp("", "dirbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mnt, cache := filepath.Join(dir, "mnt"), filepath.Join(dir, "cache")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, "mount", "--foreground", "--container", cfg.Container, "--endpoint", cfg.Endpoint,
		"--auth-type", "key", "--cache-dir", cache, "--log-level", "warn", mnt)
	cmd.Env = append(os.Environ(), "AZURE_STORAGE_ACCOUNT="+cfg.Account, "AZURE_STORAGE_KEY="+cfg.Key)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		if out, uerr := exec.Command(bin, "unmount", mnt).CombinedOutput(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmount: %v: %s", uerr, out))
		}
		cmd.Wait()
	}()
	if err := waitMounted(ctx, mnt); err != nil {
		return err
	}
	return f(mnt)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ratio(d, base time.Duration) float64 { return float64(d) / float64(base) }

// listThroughMount mounts the container with bin, and times the open of d
// and getdents of 32 KiB (as ls does) until the end.
func listThroughMount(ctx context.Context, bin string, cfg blobstore.AzureConfig) (t times, n int, err error) {
	err = withMount(ctx, bin, cfg, func(mnt string) error {
		t, n, err = getdentsAll(filepath.Join(mnt, "d"), nil)
		return err
	})
	return t, n, err
}

// getdentsAll times the open of dir and getdents of 32 KiB (as ls does)
// until the end, and counts the names other than "." and "..". atEnd, if
// not nil, runs after the last getdents, with the directory still open.
func getdentsAll(dir string, atEnd func()) (t times, n int, err error) {
	// The clock starts before the open: its lookup of the directory is
	// part of what `ls` waits for.
	start := time.Now()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return t, 0, err
	}
	defer unix.Close(fd)
	t.open = time.Since(start)
	buf := make([]byte, 32<<10)
	for {
		k, err := unix.Getdents(fd, buf)
		if err != nil {
			return t, n, err
		}
		if t.first == 0 {
			t.first = time.Since(start)
			t.afterOpen = t.first - t.open
		}
		if k == 0 {
			break
		}
		for b := buf[:k]; len(b) > 0; {
			reclen := int(b[16]) | int(b[17])<<8
			if name := b[19:reclen]; name[0] != '.' {
				n++
			}
			b = b[reclen:]
		}
	}
	t.all = time.Since(start)
	if atEnd != nil {
		atEnd()
	}
	return t, n, nil
}

// waitMounted waits until dir is a FUSE mount point.
func waitMounted(ctx context.Context, dir string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var st, parent unix.Stat_t
		if unix.Stat(dir, &st) == nil && unix.Stat(filepath.Dir(dir), &parent) == nil && st.Dev != parent.Dev {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not mounted after 30 s", dir)
}

// listThroughSDK lists d/ page by page, as a program using the SDK would.
func listThroughSDK(ctx context.Context, store blobstore.Store) (t times, n int, err error) {
	start := time.Now()
	opts := blobstore.ListOptions{Prefix: "d/", Delimiter: "/"}
	for {
		page, err := store.List(ctx, opts)
		if err != nil {
			return times{}, 0, err
		}
		if t.first == 0 {
			t.first = time.Since(start)
			t.afterOpen = t.first
		}
		n += len(page.Blobs) + len(page.Prefixes)
		if page.NextMarker == "" {
			t.all = time.Since(start)
			return t, n, nil
		}
		opts.Marker = page.NextMarker
	}
}
