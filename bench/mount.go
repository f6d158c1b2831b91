package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// mount is a live FUSE mount that a figure reads or writes through.
type mount interface {
	// Dir is the mountpoint.
	Dir() string
	// Close unmounts, after the filesystem has uploaded what it holds.
	Close() error
}

// Timeouts of mount handling.
const (
	mountTimeout = time.Minute
	// unmountTimeout bounds how long a client may take to upload what it
	// holds and exit after being asked to unmount.
	unmountTimeout = 5 * time.Minute
)

// procMount is a FUSE client running as a child process: what users run.
type procMount struct {
	dir     string
	cmd     *exec.Cmd
	out     *tailBuffer
	unmount []string // argv that unmounts; empty means SIGTERM
	done    chan struct{}
	waitErr error // set before done is closed
}

// startProc starts argv, which mounts a FUSE filesystem at dir and stays
// in the foreground, and returns once dir shows up in /proc/self/mountinfo.
// env is added to this process's environment minus every AZURE_* and
// RCLONE_* variable, so that the caller's shell cannot change what is
// measured.
func startProc(ctx context.Context, dir string, argv, env, unmount []string) (*procMount, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AZURE_") && !strings.HasPrefix(kv, "RCLONE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out := &tailBuffer{max: 16 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	// Should this process die, the child is told to unmount and exit.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &procMount{dir: dir, cmd: cmd, out: out, unmount: unmount, done: make(chan struct{})}
	go func() {
		m.waitErr = cmd.Wait()
		close(m.done)
	}()
	if err := waitMounted(ctx, dir, m.done); err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w; output: %s", filepath.Base(argv[0]), err, m.out.String())
	}
	return m, nil
}

func (m *procMount) Dir() string { return m.dir }

// Pid is the child's process id.
func (m *procMount) Pid() int { return m.cmd.Process.Pid }

func (m *procMount) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// Close asks the client to unmount (its own unmount command, else
// SIGTERM), waits for it to exit, and as a last resort kills it and
// detaches the mount.
func (m *procMount) Close() error {
	var errs []error
	if !m.exited() {
		asked := false
		if len(m.unmount) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), unmountTimeout)
			out, err := exec.CommandContext(ctx, m.unmount[0], m.unmount[1:]...).CombinedOutput()
			cancel()
			if err == nil {
				asked = true
			} else {
				errs = append(errs, fmt.Errorf("%s: %v: %s", strings.Join(m.unmount, " "), err, strings.TrimSpace(string(out))))
			}
		}
		if !asked {
			m.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-m.done:
		case <-time.After(unmountTimeout):
			m.cmd.Process.Kill()
			<-m.done
			errs = append(errs, errors.New("did not exit after unmount; killed"))
		}
	}
	if mounted, _ := isMounted(m.dir); mounted {
		if err := unix.Unmount(m.dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", m.dir, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmount %s: %w; output: %s", m.dir, err, m.out.String())
	}
	return nil
}

// waitMounted polls /proc/self/mountinfo until dir is a mountpoint, the
// process behind it exits (died is closed), or time runs out.
func waitMounted(ctx context.Context, dir string, died <-chan struct{}) error {
	deadline := time.Now().Add(mountTimeout)
	for {
		ok, err := isMounted(dir)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not mounted after %v", dir, mountTimeout)
		}
		select {
		case <-died:
			return errors.New("exited before mounting")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// isMounted tells whether dir is a mountpoint, from /proc/self/mountinfo.
func isMounted(dir string) (bool, error) {
	mounts, err := mountpoints()
	if err != nil {
		return false, err
	}
	for _, mp := range mounts {
		if mp == dir {
			return true, nil
		}
	}
	return false, nil
}

// mountpoints lists the mountpoints of this process's namespace.
func mountpoints() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		// The fifth field is the mountpoint, with space, tab, newline and
		// backslash escaped as octal.
		if f := strings.Fields(line); len(f) >= 5 {
			mps = append(mps, fusefs.UnescapeMountInfo(f[4]))
		}
	}
	return mps, nil
}

// tailBuffer keeps the last max bytes written to it: a child's output,
// for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if s == "" {
		return "(none)"
	}
	return s
}

// inProcessMount is blobfs served by this process: fusefs.New over a
// store, mounted with kernel.Mount, default options.
type inProcessMount struct {
	fsys *fusefs.FS
	sess *kernel.Session
}

func mountInProcess(dir, cacheDir string, store blobstore.Store, opts fusefs.Options) (*inProcessMount, error) {
	opts.CacheDir = cacheDir
	if opts.Logger == nil {
		opts.Logger = discardLogger
	}
	fsys, err := fusefs.New(store, opts)
	if err != nil {
		return nil, err
	}
	sess, err := kernel.Mount(dir, fsys, kernel.MountOptions{FsName: "blobfs-bench", Logger: opts.Logger})
	if err != nil {
		fsys.Close()
		return nil, err
	}
	return &inProcessMount{fsys: fsys, sess: sess}, nil
}

func (m *inProcessMount) Dir() string { return m.sess.Mountpoint() }

func (m *inProcessMount) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), unmountTimeout)
	defer cancel()
	err := m.fsys.Sync(ctx)
	if uerr := m.sess.Unmount(false); uerr != nil {
		// Busy (a file still open after a failed figure): detach.
		uerr = m.sess.Unmount(true)
		err = errors.Join(err, uerr)
	}
	m.fsys.Close()
	return err
}

// goFuseMount is the reference for the FUSE path: go-fuse's own
// fuse.Server (through its fs API) serving one read-only file from memory.
type goFuseMount struct {
	dir    string
	server *fuse.Server
}

// goFuseRoot is the reference mount's root directory, holding "file".
type goFuseRoot struct {
	fs.Inode
	data []byte
}

var _ = (fs.NodeOnAdder)((*goFuseRoot)(nil))

func (r *goFuseRoot) OnAdd(ctx context.Context) {
	f := &fs.MemRegularFile{Data: r.data, Attr: fuse.Attr{Mode: 0o444}}
	r.AddChild("file", r.NewPersistentInode(ctx, f, fs.StableAttr{}), false)
}

func mountGoFuse(dir string, data []byte) (*goFuseMount, error) {
	// Same request size as blobfs (kernel.MountOptions.MaxWrite's
	// default), mount(2) directly as blobfs does as root.
	server, err := fs.Mount(dir, &goFuseRoot{data: data}, &fs.Options{MountOptions: fuse.MountOptions{
		FsName:      "gofuse-reference",
		Name:        "gofuseref",
		MaxWrite:    1 << 20,
		DirectMount: true,
	}})
	if err != nil {
		return nil, err
	}
	return &goFuseMount{dir: dir, server: server}, nil
}

func (m *goFuseMount) Dir() string { return m.dir }

func (m *goFuseMount) Close() error { return m.server.Unmount() }

// peakRSS is the largest VmHWM (peak resident set) of pid and its
// descendants, in bytes: `blobfs mount` may one day serve from a child
// process.
func peakRSS(pid int) (int64, error) {
	best, err := procStatus(pid, "VmHWM:")
	if err != nil {
		return 0, err
	}
	for _, p := range descendants(pid) {
		if v, err := procStatus(p, "VmHWM:"); err == nil {
			best = max(best, v)
		}
	}
	return best, nil
}

// procStatus reads one "kB" field of /proc/PID/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// procStatTimeout bounds reading one /proc/PID/stat: reading it blocks
// for as long as that process is wedged (one stuck on a dead FUSE mount,
// say), and the machine is shared.
const procStatTimeout = 200 * time.Millisecond

// descendants lists the processes below pid, from the parent pids in
// /proc/*/stat. A process whose stat does not answer in time is skipped;
// the goroutine reading it stays blocked until it answers.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if ppid, ok := parentOf(p); ok {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads the parent pid of p, giving up after procStatTimeout.
func parentOf(p int) (int, bool) {
	ch := make(chan string, 1)
	go func() {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		ch <- string(b)
	}()
	var s string
	select {
	case s = <-ch:
	case <-time.After(procStatTimeout):
		return 0, false
	}
	f := statFields(s) // state ppid ...
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// statFields returns the fields of a /proc/PID/stat text from the third
// (the state) on: the second, the command name, is in parentheses and
// may hold spaces and ')', so they are counted from the last ')'. nil if
// there is none.
func statFields(stat string) []string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(stat[i+1:])
}

// sampleRSS samples pid's resident set every 50 ms until the returned stop
// is called, which returns the largest sample: for a figure's note, beside
// the kernel's high-water mark (peakRSS).
func sampleRSS(pid int) (stop func() int64) {
	var (
		mu      sync.Mutex
		sampled int64
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if v, err := procStatus(pid, "VmRSS:"); err == nil {
				mu.Lock()
				sampled = max(sampled, v)
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		wg.Wait()
		return sampled
	}
}
