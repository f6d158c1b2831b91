package fusefs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// The test binary doubles as a serving process for the restart tests: with
// BLOBFS_TEST_SERVE set, it serves the mount whose /dev/fuse descriptor is
// fd 3, journaling into the state region at fd 4, over a local store.
func TestMain(m *testing.M) {
	if os.Getenv("BLOBFS_TEST_LAUNCHER") != "" {
		if err := launcher(); err != nil {
			fmt.Fprintln(os.Stderr, "launcher:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(loneServeEnv) != "" {
		if err := serveAlone(); err != nil {
			fmt.Fprintln(os.Stderr, "serve alone:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if mnt := os.Getenv(unprivEnv); mnt != "" {
		runUnprivCases(mnt)
		os.Exit(0)
	}
	if os.Getenv("BLOBFS_TEST_SERVE") != "" {
		if err := serveChild(); err != nil {
			fmt.Fprintln(os.Stderr, "serve child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func serveChild() error {
	local, err := blobstore.NewLocal(os.Getenv("BLOBFS_TEST_STORE"))
	if err != nil {
		return err
	}
	var store blobstore.Store = local
	if d, err := time.ParseDuration(os.Getenv("BLOBFS_TEST_LATENCY")); err == nil {
		// Slow reads keep requests in flight when the server is killed.
		store = blobstore.NewFaulty(local, blobstore.FaultOptions{Latency: d})
	}
	// Small, slow listing pages (readdir across restarts).
	if page, err := strconv.Atoi(os.Getenv("BLOBFS_TEST_LIST_PAGE")); err == nil {
		delay, _ := time.ParseDuration(os.Getenv("BLOBFS_TEST_LIST_DELAY"))
		store = &pagedStore{Store: store, page: page, delay: delay}
	}
	// Requests held in this process until it is killed.
	if reads, lists := os.Getenv("BLOBFS_TEST_HOLD_READS"), os.Getenv("BLOBFS_TEST_HOLD_LISTS"); reads != "" || lists != "" {
		store = &heldStore{Store: store, reads: reads, lists: lists}
	}
	opts := Options{
		State:     os.NewFile(4, "state"),
		CacheDir:  os.Getenv("BLOBFS_TEST_CACHE"),
		Logger:    childLogger(),
		ReadOnly:  os.Getenv("BLOBFS_TEST_READONLY") != "",
		WriteBack: os.Getenv("BLOBFS_TEST_WRITEBACK") != "",
		StoreID:   "local",
	}
	if os.Getenv("BLOBFS_TEST_NOCACHE") != "" { // the model checker's mounts
		opts.AttrTimeout, opts.EntryTimeout, opts.NegativeTimeout, opts.ListTimeout = -1, -1, -1, -1
		opts.PrefetchFiles = -1
	}
	if dir := os.Getenv("BLOBFS_TEST_DISK_CACHE"); dir != "" {
		if opts.DiskCache, err = cache.OpenDiskCache(dir, 1<<30); err != nil {
			return err
		}
	}
	fsys, err := New(store, opts)
	if err != nil {
		return err
	}
	crashFromEnv(fsys)
	if sock := os.Getenv("BLOBFS_TEST_OPEN_FILES"); sock != "" {
		if err := answerOpenFiles(fsys, sock); err != nil {
			return err
		}
	}
	sess, err := kernel.Serve(os.Getenv("BLOBFS_TEST_MOUNT"), 3, fsys, kernel.MountOptions{Logger: childLogger()})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	go answerHandles(fsys)
	return sess.Wait()
}

// heldStore never answers a ReadAt (when reads is set) or a List (when
// lists is set): it creates the file the field names and waits for the
// request's end. A test that sees the file knows that a request is in the
// serving process, waiting on the store, and stays there until the
// process is killed, however slowly the machine runs.
type heldStore struct {
	blobstore.Store
	reads, lists string
}

func (s *heldStore) hold(ctx context.Context, marker string) error {
	if f, err := os.Create(marker); err == nil {
		f.Close()
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *heldStore) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	if s.reads != "" {
		return 0, s.hold(ctx, s.reads)
	}
	return s.Store.ReadAt(ctx, name, p, off, etag)
}

func (s *heldStore) List(ctx context.Context, opts blobstore.ListOptions) (blobstore.ListPage, error) {
	if s.lists != "" {
		return blobstore.ListPage{}, s.hold(ctx, s.lists)
	}
	return s.Store.List(ctx, opts)
}

// serverHandles is what a serving process says of its handles
// (restartHarness.handles): those open now, by io mode, and the
// passthrough opens so far.
type serverHandles struct {
	Cached, Passthrough int
	PassthroughOpens    int64
}

// answerHandles answers each line on stdin (the launcher's "handles")
// with the serving process's serverHandles, as JSON on one line: the
// RELEASE of a closed file is an event the test cannot see otherwise.
func answerHandles(fsys *FS) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var a serverHandles
		fsys.mu.Lock()
		for _, n := range fsys.nodes.byID {
			a.Cached += n.io.cached
			a.Passthrough += n.io.passthrough
		}
		fsys.mu.Unlock()
		a.PassthroughOpens = fsys.Stats().PassthroughOpens
		b, _ := json.Marshal(a)
		fmt.Println(string(b))
	}
}

// crashFromEnv makes a serving child kill itself where BLOBFS_TEST_CRASH
// names a crash point (FS.crashPoint): after the store changed and before
// the reply, for instance; "op/point/*" names every name's.
// BLOBFS_TEST_CRASH_AFTER=N passes the point N times first.
func crashFromEnv(fsys *FS) {
	where := os.Getenv("BLOBFS_TEST_CRASH")
	if where == "" {
		return
	}
	var passes atomic.Int64
	after, _ := strconv.ParseInt(os.Getenv("BLOBFS_TEST_CRASH_AFTER"), 10, 64)
	fsys.crashHook = func(at string) {
		match := at == where
		if prefix, ok := strings.CutSuffix(where, "*"); ok {
			match = strings.HasPrefix(at, prefix)
		}
		if match && passes.Add(1) > after {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
}

// childLogger logs to stderr when BLOBFS_TEST_SERVE_LOG is set.
func childLogger() *slog.Logger {
	if os.Getenv("BLOBFS_TEST_SERVE_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// launcher holds the mount's descriptor and state region (fds 3 and 4) and
// starts and kills serving processes on command (on stdin: "start", with
// extra environment variables as further words; "kill"; "wait" for the
// serving process to exit by itself; "handles", which the serving process
// answers; it answers "ok", with the answer if any, or an error line). It
// is what a keeper does, minus the socket. It must be a process of its own
// that never opens a file on the mount: fork+exec closes the parent's
// descriptors in the child, and closing a FUSE file sends FLUSH, which
// waits for a server, so a client process cannot start the server its own
// open files wait for.
func launcher() error {
	var (
		mu        sync.Mutex // guards what follows, and stdout
		server    *exec.Cmd
		serverIn  io.WriteCloser // server's stdin
		serverOut *bufio.Reader  // server's stdout
		exited    chan struct{}  // closed when server has exited
		// keep: a serving process that exits by itself (a crash point)
		// is followed at once by a successor, as a keeper does; restarts
		// counts them.
		keep     bool
		restarts int
	)
	// One *os.File each for the whole run: os.NewFile's finalizer closes
	// the descriptor when the File is collected, and a later pipe would
	// then take its number.
	fuseFile, stateFile := os.NewFile(3, "fuse"), os.NewFile(4, "state")
	defer runtime.KeepAlive(fuseFile)
	defer runtime.KeepAlive(stateFile)
	var start func(env []string) error
	start = func(env []string) error {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BLOBFS_TEST_LAUNCHER=", "BLOBFS_TEST_SERVE=1")
		cmd.Env = append(cmd.Env, env...)
		cmd.ExtraFiles = []*os.File{fuseFile, stateFile}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		outReader := bufio.NewReader(out)
		line, _ := outReader.ReadString('\n')
		if strings.TrimSpace(line) != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			return fmt.Errorf("serving process did not start: %q", line)
		}
		server, serverIn, serverOut = cmd, stdin, outReader
		exited = make(chan struct{})
		go func(done chan struct{}) {
			cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			close(done)
			if keep && server == cmd {
				server = nil
				restarts++
				if err := start(nil); err != nil {
					fmt.Fprintln(os.Stderr, "launcher: successor:", err)
				}
			}
		}(exited)
		return nil
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		words := strings.Fields(in.Text())
		if len(words) == 0 {
			continue
		}
		mu.Lock()
		switch words[0] {
		case "start":
			if err := start(words[1:]); err != nil {
				fmt.Println("error", err)
				break
			}
			fmt.Println("ok")
		case "keep":
			keep = true
			fmt.Println("ok")
		case "nokeep":
			keep = false
			fmt.Println("ok")
		case "restarts":
			fmt.Println("ok", restarts)
		case "kill":
			if server != nil {
				cmd, done := server, exited
				server = nil
				mu.Unlock()
				cmd.Process.Signal(syscall.SIGKILL)
				<-done
				mu.Lock()
			}
			fmt.Println("ok")
		case "handles":
			if server == nil {
				fmt.Println("error no serving process")
				break
			}
			fmt.Fprintln(serverIn, "handles")
			line, err := serverOut.ReadString('\n')
			if err != nil {
				fmt.Println("error the serving process did not answer:", err)
				break
			}
			fmt.Println("ok", strings.TrimSpace(line))
		case "wait":
			if server == nil {
				fmt.Println("error no serving process")
				break
			}
			done := exited
			mu.Unlock()
			select {
			case <-done:
				mu.Lock()
				server = nil
				fmt.Println("ok")
			case <-time.After(time.Minute):
				mu.Lock()
				fmt.Println("error the serving process did not exit within a minute")
			}
		}
		mu.Unlock()
	}
	mu.Lock()
	keep = false
	cmd, done := server, exited
	mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		<-done
	}
	return in.Err()
}

// restartHarness mounts with MountFD and gives the descriptor and the state
// region to a launcher process, while serving processes come and go.
type restartHarness struct {
	t                 *testing.T
	mnt, store, cache string
	launcher          *exec.Cmd
	cmds              io.WriteCloser
	answers           *bufio.Reader
}

func newRestartHarness(t *testing.T, env ...string) *restartHarness {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	h := &restartHarness{t: t, store: t.TempDir(), cache: t.TempDir()}
	state, err := NewState()
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	mp, fd, err := kernel.MountFD(t.TempDir(), kernel.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fuse := os.NewFile(uintptr(fd), "fuse")
	defer fuse.Close()
	h.mnt = mp
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BLOBFS_TEST_LAUNCHER=1", "BLOBFS_TEST_STORE="+h.store,
		"BLOBFS_TEST_CACHE="+h.cache, "BLOBFS_TEST_MOUNT="+h.mnt)
	cmd.Env = append(cmd.Env, env...)
	cmd.ExtraFiles = []*os.File{fuse, state}
	cmd.Stderr = os.Stderr
	if h.cmds, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.answers = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.launcher = cmd
	t.Cleanup(func() {
		h.cmds.Close()
		h.launcher.Wait()
		kernel.Unmount(h.mnt, true)
	})
	return h
}

func (h *restartHarness) command(c string) {
	h.t.Helper()
	fmt.Fprintln(h.cmds, c)
	line, err := h.answers.ReadString('\n')
	if f := strings.Fields(line); len(f) == 0 || f[0] != "ok" {
		h.t.Fatalf("launcher %s: %q %v", c, line, err)
	}
}

// restarts is how many serving processes have exited by themselves and
// been followed by a successor since "keep".
func (h *restartHarness) restarts() int {
	h.t.Helper()
	fmt.Fprintln(h.cmds, "restarts")
	line, err := h.answers.ReadString('\n')
	var n int
	if _, e := fmt.Sscanf(line, "ok %d", &n); e != nil {
		h.t.Fatalf("launcher restarts: %q %v", line, err)
	}
	return n
}

// start runs a serving process, with extra environment variables, and
// waits until it serves.
// localStore opens the harness's store directory, to check or seed blobs
// behind the mount's back.
func (h *restartHarness) localStore() *blobstore.Local {
	h.t.Helper()
	s, err := blobstore.NewLocal(h.store)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *restartHarness) start(env ...string) {
	h.t.Helper()
	h.command(strings.Join(append([]string{"start"}, env...), " "))
}

// waitExit waits (up to a minute) for the serving process to exit by
// itself, as one started with BLOBFS_TEST_CRASH does.
func (h *restartHarness) waitExit() {
	h.t.Helper()
	h.command("wait")
}

// kill SIGKILLs the serving process.
func (h *restartHarness) kill() { h.command("kill") }

// handles asks the serving process for its handles.
func (h *restartHarness) handles() serverHandles {
	h.t.Helper()
	fmt.Fprintln(h.cmds, "handles")
	line, err := h.answers.ReadString('\n')
	answer, ok := strings.CutPrefix(strings.TrimSpace(line), "ok ")
	var a serverHandles
	if !ok || json.Unmarshal([]byte(answer), &a) != nil {
		h.t.Fatalf("launcher handles: %q %v", line, err)
	}
	return a
}

// TestServerKilledMountSurvives: the serving process is killed again and
// again while an application reads a file and writes another through open
// descriptors; every operation succeeds (it waits while no one serves) and
// every acknowledged byte reaches the store.
func TestServerKilledMountSurvives(t *testing.T) {
	h := newRestartHarness(t)
	h.start()

	data := pattern(6<<20, 11)
	if err := os.WriteFile(join(h.mnt, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(join(h.mnt, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}

	// A reader holding one descriptor open, rereading the file.
	var readErrs atomic.Int64
	var reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.Open(join(h.mnt, "data"))
		if err != nil {
			readErrs.Add(1)
			t.Errorf("open: %v", err)
			return
		}
		defer f.Close()
		buf := make([]byte, len(data))
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Past the kernel's page cache: O_DIRECT is not available,
			// so drop the cache for this file between passes.
			n, err := f.ReadAt(buf, 0)
			if (err != nil && !errors.Is(err, io.EOF)) || !bytes.Equal(buf[:n], data) {
				readErrs.Add(1)
				t.Errorf("read: %d bytes, %v", n, err)
				return
			}
			reads.Add(1)
			unix_fadviseDontNeed(f)
		}
	}()

	// A writer holding one descriptor open across all the restarts.
	w, err := os.Create(join(h.mnt, "log"))
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	pauses := []time.Duration{}
	for i := range 6 {
		line := []byte(fmt.Sprintf("line %d before kill\n", i))
		if _, err := w.Write(line); err != nil {
			t.Fatalf("write: %v", err)
		}
		want.Write(line)
		h.kill()
		// Operations issued while nobody serves wait, then succeed.
		done := make(chan error, 1)
		began := time.Now()
		go func() {
			line := []byte(fmt.Sprintf("line %d while dead\n", i))
			_, err := w.Write(line)
			if err == nil {
				_, err = os.Stat(join(h.mnt, "dir"))
			}
			if err == nil {
				err = os.WriteFile(join(h.mnt, "dir", fmt.Sprintf("f%d", i)), []byte{byte(i)}, 0o644)
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		h.start()
		if err := <-done; err != nil {
			t.Fatalf("operation across restart %d: %v", i, err)
		}
		pauses = append(pauses, time.Since(began))
		want.WriteString(fmt.Sprintf("line %d while dead\n", i))
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close after restarts: %v", err)
	}
	close(stop)
	wg.Wait()
	if readErrs.Load() != 0 || reads.Load() == 0 {
		t.Fatalf("reader: %d errors, %d passes", readErrs.Load(), reads.Load())
	}
	t.Logf("reader made %d passes; pauses across restarts: %v", reads.Load(), pauses)

	store := h.localStore()
	wantBlob(t, store, "log", want.Bytes())
	for i := range 6 {
		wantBlob(t, store, fmt.Sprintf("dir/f%d", i), []byte{byte(i)})
	}
	// The restored tables still resolve old names and make new ones.
	if err := os.Rename(join(h.mnt, "dir", "f0"), join(h.mnt, "moved")); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, store, "moved", []byte{0})
}

// TestServerKilledMidRequest: the server is killed while it holds a READ it
// has taken from the kernel and not answered (the store has not answered
// it). The kernel queues the READ again for the next server
// (FUSE_NOTIFY_RESEND), and the application gets its bytes.
func TestServerKilledMidRequest(t *testing.T) {
	h := newRestartHarness(t)
	data := pattern(3<<20, 21)
	local := h.localStore()
	putBlob(t, local, "slow", data, nil)
	// This server's store never answers a read, and says when one came.
	held := join(t.TempDir(), "read")
	h.start("BLOBFS_TEST_HOLD_READS=" + held)
	f, err := os.Open(join(h.mnt, "slow"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan error, 1)
	buf := make([]byte, len(data))
	go func() {
		n, err := f.ReadAt(buf, 0)
		if err == nil || errors.Is(err, io.EOF) {
			if !bytes.Equal(buf[:n], data) {
				err = fmt.Errorf("read %d bytes that differ", n)
			} else {
				err = nil
			}
		}
		got <- err
	}()
	// Nothing else reads: the read in the server is the READ's.
	waitFor(t, "the READ in the server, waiting on the store", func() bool {
		_, err := os.Stat(held)
		return err == nil
	})
	h.kill()
	// The READ cannot have been answered: the only server that had it
	// never had its bytes. A read that failed instead (the kernel
	// dropping the request with its server) fails below.
	select {
	case err := <-got:
		t.Fatalf("read finished while no server ran: %v", err)
	default:
	}
	h.start()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the READ taken by the killed server was never answered")
	}
}
