package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The restart benchmark's applications.
//
// They run as processes of their own (this executable, started again with
// restartAppEnv set): a process that has files open on a FUSE mount must
// never fork and exec the server of that mount, and the benchmark starts
// drivers while applications wait on their mounts. The benchmark process
// itself never touches a mount.
//
//   - probe reads the files named on its stdin ("INDEX PATH" lines), each
//     in a goroutine of its own, checks their content and prints
//     "ok INDEX UNIXNANO" when a read completed (or "err INDEX MESSAGE").
//     A read issued while no driver serves the mount waits in the kernel;
//     its completion is when the mount serves again.
//   - stream reads one file again and again with O_DIRECT, at a bounded
//     rate, checking each round's sha256, and prints "op START_UNIXNANO DURATION_NS" for
//     every read; it stops when its stdin closes.

// restartAppEnv selects the application a re-executed benchmark runs.
const restartAppEnv = "BLOBFS_BENCH_RESTART_APP"

// Settings of the applications, in their environment.
const (
	probeContentEnv = "BLOBFS_BENCH_PROBE_CONTENT"
	streamFileEnv   = "BLOBFS_BENCH_STREAM_FILE"
	streamSHA256Env = "BLOBFS_BENCH_STREAM_SHA256"
	streamRateEnv   = "BLOBFS_BENCH_STREAM_RATE" // bytes per second
)

// streamChunk is the size of each read of the streamer.
const streamChunk = 128 << 10

// RestartAppMain runs one of the restart benchmark's applications and exits
// when this process was started as one (the benchmark starts its own
// executable again with restartAppEnv set); otherwise it returns at once.
// Call it first thing in main, and in TestMain of tests that run the
// restart benchmark.
func RestartAppMain() {
	var err error
	switch app := os.Getenv(restartAppEnv); app {
	case "":
		return
	case "probe":
		err = probeApp(os.Stdin, os.Stdout, []byte(os.Getenv(probeContentEnv)))
	case "stream":
		err = streamApp()
	default:
		err = fmt.Errorf("unknown application %q in %s", app, restartAppEnv)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "restart benchmark application:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func probeApp(in io.Reader, out io.Writer, want []byte) error {
	var mu sync.Mutex
	report := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	var wg sync.WaitGroup
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		idx, path, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return fmt.Errorf("probe: bad request %q, want \"INDEX PATH\"", sc.Text())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := os.ReadFile(path)
			switch {
			case err != nil:
				report("err %s %s", idx, strings.ReplaceAll(err.Error(), "\n", " "))
			case !bytes.Equal(got, want):
				report("err %s %s holds %q, want %q", idx, path, got, want)
			default:
				report("ok %s %d", idx, time.Now().UnixNano())
			}
		}()
	}
	wg.Wait()
	return sc.Err()
}

func streamApp() error {
	path, want := os.Getenv(streamFileEnv), os.Getenv(streamSHA256Env)
	rate, err := strconv.ParseInt(os.Getenv(streamRateEnv), 10, 64)
	if err != nil || rate <= 0 {
		return fmt.Errorf("stream: %s=%q is not a positive rate", streamRateEnv, os.Getenv(streamRateEnv))
	}
	var stop atomic.Bool
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
	}()
	// O_DIRECT: every read goes to the server, none is answered from the
	// page cache or the kernel's read-ahead, so that a pause of the server
	// is seen whole (a buffered reader far enough behind the kernel's
	// read-ahead may not notice a short one).
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	interval := time.Duration(float64(time.Second) * streamChunk / float64(rate))
	// Page-aligned, as O_DIRECT may require.
	buf, err := unix.Mmap(-1, 0, streamChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	next := time.Now()
	for round := 0; !stop.Load(); round++ {
		h := sha256.New()
		for off := int64(0); !stop.Load(); {
			time.Sleep(time.Until(next))
			next = next.Add(interval)
			start := time.Now()
			n, err := f.ReadAt(buf, off)
			fmt.Fprintf(out, "op %d %d\n", start.UnixNano(), time.Since(start).Nanoseconds())
			out.Flush()
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("round %d, read at %d: %w", round, off, err)
			}
			h.Write(buf[:n])
			off += int64(n)
			if n == 0 || errors.Is(err, io.EOF) {
				if got := hex.EncodeToString(h.Sum(nil)); got != want {
					return fmt.Errorf("round %d: read %d bytes with sha256 %s, want %s", round, off, got, want)
				}
				break
			}
		}
	}
	return nil
}

// --- the benchmark's side ----------------------------------------------

// startRestartApp starts this executable again as application kind.
func startRestartApp(kind string, env ...string) (cmd *exec.Cmd, stdin io.WriteCloser, stdout io.ReadCloser, stderr *tailBuffer, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	// No arguments: RestartAppMain runs before any flag parsing.
	cmd = exec.Command(self)
	cmd.Env = append(os.Environ(), restartAppEnv+"="+kind)
	cmd.Env = append(cmd.Env, env...)
	stderr = &tailBuffer{max: 4 << 10}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if stdin, err = cmd.StdinPipe(); err != nil {
		return nil, nil, nil, nil, err
	}
	if stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, nil, err
	}
	return cmd, stdin, stdout, stderr, nil
}

// prober is a running probe application.
type prober struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *tailBuffer
	results chan probeResult
}

type probeResult struct {
	index int
	at    time.Time
	err   error
}

func startProber(content string) (*prober, error) {
	cmd, stdin, stdout, stderr, err := startRestartApp("probe", probeContentEnv+"="+content)
	if err != nil {
		return nil, fmt.Errorf("start probe: %w", err)
	}
	p := &prober{cmd: cmd, stdin: stdin, stderr: stderr, results: make(chan probeResult, 1024)}
	go func() {
		defer close(p.results)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			idx, detail, _ := strings.Cut(rest, " ")
			i, err := strconv.Atoi(idx)
			if err != nil {
				continue
			}
			switch kind {
			case "ok":
				ns, _ := strconv.ParseInt(detail, 10, 64)
				p.results <- probeResult{index: i, at: time.Unix(0, ns)}
			case "err":
				p.results <- probeResult{index: i, err: errors.New(detail)}
			}
		}
	}()
	return p, nil
}

// read asks for a read of path, reported under index.
func (p *prober) read(index int, path string) error {
	_, err := fmt.Fprintf(p.stdin, "%d %s\n", index, path)
	return err
}

// collect waits for n results and returns the completion time of each
// index's read; the first failed read is an error.
func (p *prober) collect(ctx context.Context, n int, within time.Duration) (map[int]time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	got := make(map[int]time.Time, n)
	for len(got) < n {
		select {
		case r, ok := <-p.results:
			if !ok {
				return got, fmt.Errorf("probe application ended after %d of %d reads: %s", len(got), n, p.stderr)
			}
			if r.err != nil {
				return got, fmt.Errorf("read through mount %d: %v", r.index, r.err)
			}
			got[r.index] = r.at
		case <-ctx.Done():
			return got, fmt.Errorf("only %d of %d reads through the mounts completed within %v", len(got), n, within)
		}
	}
	return got, nil
}

// close ends the prober: it exits once its reads are done; one still
// blocked on a dead mount after a short wait is killed.
func (p *prober) close() {
	p.stdin.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// streamer is a running stream application.
type streamer struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *tailBuffer
	mu      sync.Mutex
	ops     []readOp // guarded by mu
	started chan struct{}
	done    chan struct{}
}

// readOp is one read call of the streamer.
type readOp struct{ start, end time.Time }

func startStreamer(path, sha string, rate int64) (*streamer, error) {
	cmd, stdin, stdout, stderr, err := startRestartApp("stream", streamFileEnv+"="+path,
		streamSHA256Env+"="+sha, fmt.Sprintf("%s=%d", streamRateEnv, rate))
	if err != nil {
		return nil, fmt.Errorf("start stream: %w", err)
	}
	s := &streamer{cmd: cmd, stdin: stdin, stderr: stderr, started: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		var once sync.Once
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var start, d int64
			if _, err := fmt.Sscanf(sc.Text(), "op %d %d", &start, &d); err == nil {
				t := time.Unix(0, start)
				s.mu.Lock()
				s.ops = append(s.ops, readOp{t, t.Add(time.Duration(d))})
				s.mu.Unlock()
				once.Do(func() { close(s.started) })
			}
		}
	}()
	return s, nil
}

// waitStarted waits for the first read.
func (s *streamer) waitStarted(within time.Duration) error {
	select {
	case <-s.started:
		return nil
	case <-s.done:
		s.cmd.Wait()
		return fmt.Errorf("the streaming reader ended before its first read: %s", s.stderr)
	case <-time.After(within):
		return fmt.Errorf("the streaming reader made no read within %v", within)
	}
}

// stop ends the streamer and reports whether it saw an error.
func (s *streamer) stop(within time.Duration) error {
	s.stdin.Close()
	exited := make(chan error, 1)
	go func() { <-s.done; exited <- s.cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			return fmt.Errorf("the streaming reader failed (%v): %s", err, s.stderr)
		}
		return nil
	case <-time.After(within):
		s.cmd.Process.Kill()
		return fmt.Errorf("the streaming reader did not stop within %v (a read hung)", within)
	}
}

// stall returns the longest read in progress at any moment of [from, to]:
// how long the application saw no progress around that interval. ok is
// false when the streamer made no read then.
func (s *streamer) stall(from, to time.Time) (d time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range s.ops {
		if op.start.After(to) || op.end.Before(from) {
			continue
		}
		d, ok = max(d, op.end.Sub(op.start)), true
	}
	return d, ok
}
