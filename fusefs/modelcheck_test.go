package fusefs

// The model-based checker (issue 38): rapid generates sequences of
// operations through two real FUSE mounts of one in-memory container
// (caches off, so that what a mount sees does not depend on timing) and
// through the store's API as a third writer, applies each to the real
// mounts and to the reference model (modelcheck_model_test.go, which
// encodes docs/semantics.md), and compares errnos, bytes read, and after
// every step the whole state: the store's blobs, each mount's listings,
// attributes and content read back through a fresh open, and each
// mount's lost+found.
//
// A divergence fails with rapid's shrunk sequence of actions (each logged
// as it runs) and the seed that replays it:
//
//	go test ./fusefs -run TestModel -rapid.seed=N -rapid.nofailfile -v
//
// (rapid also writes a fail file under fusefs/testdata/rapid, ignored by
// git, and replays every fail file there before anything else: remove
// them, or pass -rapid.nofailfile, once a failure is understood.) Each
// check starts in a fresh directory of the container and waits for the
// kernel's RELEASEs before every step, so that a seed replays the same
// sequence with the same results. The default budget
// (modelDefaultChecks checks of about modelDefaultSteps steps) fits
// `make test`; `make check` runs a long soak with explicit
// -rapid.checks and -rapid.steps, which override the defaults.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"pgregory.net/rapid"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// The budget of TestModel in `go test ./...` unless -rapid.checks or
// -rapid.steps are given. TestModelCrash restarts a serving process at
// every crash: fewer checks.
const (
	modelDefaultChecks      = 50
	modelDefaultSteps       = 40
	modelCrashDefaultChecks = 6
	modelCrashDefaultSteps  = 30
)

// Names the generator uses, relative to a check's directory. Files live
// at P, directories at D, symlinks at L and FIFOs at F, so that a file
// name is never opened as a FIFO (which would block).
var (
	modelFiles    = []string{"a", "b", "d/a", "d/b", "e/a"}
	modelDirs     = []string{"d", "e"}
	modelSymlinks = []string{"l", "d/l"}
	modelFifos    = []string{"p", "e/p"}
	modelAll      = append(append(append(append([]string{}, modelFiles...), modelDirs...), modelSymlinks...), modelFifos...)
)

// modelMount is one of the two mounts.
type modelMount struct {
	dir      string
	fsys     *FS // nil when a child process serves the mount
	cacheDir string
	// openFilesSock answers the count of open files of a mount served
	// by a child process (answerOpenFiles).
	openFilesSock string
}

// modelHarness is shared by every check of one TestModel run.
type modelHarness struct {
	store    blobstore.Store
	mounts   [2]modelMount
	defaults mattrs // what a blob without attributes shows
	fileMode uint32
	checks   int
	// served: mount A is served by child processes that the Crash
	// action kills (TestModelCrash); nil in TestModel.
	served *restartHarness
	// armed is the crash point the serving process of mount A dies at
	// (during a later operation), "" if none; armedRestarts the
	// launcher's count of restarts when it was armed.
	armed         string
	armedRestarts int
	// faulty is mount B's store: FaultsOn has every call fail.
	faulty *blobstore.Faulty
	// flakyA is mount A's store in TestModel (under a retrying layer, as
	// B's): FlakyOn makes it flaky too. nil in TestModelCrash, whose
	// mount A is served by another process.
	flakyA *blobstore.Faulty
	// t and env make the next restartHarness after a lost session.
	t   *testing.T
	env []string
}

// checker is the state of one check: a fresh directory of the container,
// the model, and up to two open handles per mount.
type checker struct {
	h      *modelHarness
	t      *rapid.T
	prefix string
	m      *model
	slots  [4]*realHandle // slot/2 is the mount
	// faults: mount B's store fails every call (FaultsOn). snap is the
	// model before the operation in progress through mount B, which may
	// then fail with EIO and change nothing (mayFault); faulted says it
	// did.
	faults  bool
	snap    *modelSnap
	faulted bool
	// flaky: mount B's store fails some calls before they reach it and
	// loses the answers of others after the store acted, and answers
	// slowly (FlakyOn); its retrying layer must hide all of it.
	flaky bool
	// patience is how long settle waits for RELEASEs: long after
	// FaultsOff, while uploads retried in the background finish.
	patience time.Duration
}

type realHandle struct {
	f *os.File
	m *mhandle
}

func TestModel(t *testing.T) {
	setDefaultFlag("rapid.checks", "RAPID_CHECKS", modelDefaultChecks)
	setDefaultFlag("rapid.steps", "RAPID_STEPS", modelDefaultSteps)
	h := &modelHarness{store: blobstore.NewMemory()}
	h.faulty = blobstore.NewFaulty(h.store, blobstore.FaultOptions{})
	h.flakyA = blobstore.NewFaulty(h.store, blobstore.FaultOptions{})
	h.mounts[0] = mountModel(t, blobstore.NewRetrying(h.flakyA, modelRetries))
	h.mounts[1] = mountModel(t, blobstore.NewRetrying(h.faulty, modelRetries))
	runModel(t, h)
}

// TestModelCrash is TestModel with mount A served by a child process
// (restartHarness: a launcher holds the /dev/fuse descriptor and the state
// region, as a keeper does) over a local-directory store that mount B and
// the store API share, and with the Crash action: the serving process is
// SIGKILLed between operations, or at a crash point during a later one,
// and a successor adopts the mount.
func TestModelCrash(t *testing.T) {
	setDefaultFlag("rapid.checks", "RAPID_CHECKS", modelCrashDefaultChecks)
	setDefaultFlag("rapid.steps", "RAPID_STEPS", modelCrashDefaultSteps)
	dir := memTempDir(t)
	local, err := blobstore.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &modelHarness{store: local}
	sock := filepath.Join(t.TempDir(), "open-files")
	cache := memTempDir(t)
	// Later values of a variable win (os/exec).
	h.t, h.env = t, []string{"BLOBFS_TEST_STORE=" + dir, "BLOBFS_TEST_CACHE=" + cache,
		"BLOBFS_TEST_NOCACHE=1", "BLOBFS_TEST_OPEN_FILES=" + sock}
	h.serveA()
	h.faulty = blobstore.NewFaulty(h.store, blobstore.FaultOptions{})
	h.mounts[1] = mountModel(t, blobstore.NewRetrying(h.faulty, modelRetries))
	runModel(t, h)
}

// modelRetries is the mounts' retrying layer, as production has one over
// the SDK: quick, so that FaultsOn costs little, and with a budget no run
// exhausts, so that FlakyOn's faults are always retried.
var modelRetries = blobstore.RetryPolicy{
	// At FlakyOn's rates an attempt fails about one time in ten: ten in
	// a row, one call in 10^10 (eight in a row came up once in 250
	// sequences at twice the rates).
	MaxAttempts: 10,
	BaseDelay:   100 * time.Microsecond,
	MaxDelay:    2 * time.Millisecond,
	Budget:      1e9,
}

// memTempDir is a temporary directory in memory where there is one: the
// local store and the spill files fsync every change, which costs tens of
// milliseconds on a loaded disk.
func memTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "blobfs-model-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serveA mounts A anew, served by a child process of a new launcher.
func (h *modelHarness) serveA() {
	rh := newRestartHarness(h.t, h.env...)
	for _, e := range h.env {
		if v, ok := strings.CutPrefix(e, "BLOBFS_TEST_STORE="); ok {
			rh.store = v
		}
		if v, ok := strings.CutPrefix(e, "BLOBFS_TEST_CACHE="); ok {
			rh.cache = v
		}
		if v, ok := strings.CutPrefix(e, "BLOBFS_TEST_OPEN_FILES="); ok {
			h.mounts[0].openFilesSock = v
		}
	}
	rh.start()
	rh.command("keep")
	h.served = rh
	h.mounts[0].dir, h.mounts[0].cacheDir = rh.mnt, rh.cache
}

// mountModel mounts store in this process as the checker's mounts are:
// no caches, no prefetch.
func mountModel(t *testing.T, store blobstore.Store) modelMount {
	opts := conflictMountOptions
	opts.CacheDir = memTempDir(t)
	opts.PrefetchFiles = -1
	dir, fsys := mountStore(t, store, opts)
	return modelMount{dir: dir, fsys: fsys, cacheDir: opts.CacheDir}
}

func runModel(t *testing.T, h *modelHarness) {
	umask := syscall.Umask(0)
	syscall.Umask(umask)
	h.fileMode = 0o644 &^ uint32(umask)
	// What a blob written by another tool shows.
	putBlob(t, h.store, "probe", []byte("x"), nil)
	st, err := os.Stat(join(h.mounts[0].dir, "probe"))
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	h.defaults = mattrs{perm: uint32(st.Mode().Perm()), uid: sys.Uid, gid: sys.Gid}
	start := time.Now()
	rapid.Check(t, func(rt *rapid.T) {
		h.checks++
		c := &checker{h: h, t: rt, prefix: fmt.Sprintf("c%05d", h.checks), m: newModel(h.fileMode), patience: 10 * time.Second}
		c.begin()
		rt.Cleanup(c.end)
		rt.Repeat(rapid.StateMachineActions(c))
	})
	t.Logf("%d checks in %v", h.checks, time.Since(start))
}

// answerOpenFiles has a serving child process answer, on the unix socket
// at path, how many files its mount holds open (the checker's
// waitOpenFiles).
func answerOpenFiles(fsys *FS, path string) error {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(conn, fsys.openFileCount())
			conn.Close()
		}
	}()
	return nil
}

func (fs *FS) openFileCount() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	k := 0
	for _, nd := range fs.nodes.byID {
		if nd.file != nil {
			k++
		}
	}
	return k
}

// setDefaultFlag sets a rapid flag to def unless the command line or the
// environment chose a value.
func setDefaultFlag(name, env string, def int) {
	if commandLineFlags()[name] || os.Getenv(env) != "" {
		return
	}
	if err := flag.Set(name, strconv.Itoa(def)); err != nil {
		panic(err)
	}
}

// commandLineFlags are the flags set before any test set one.
var commandLineFlags = sync.OnceValue(func() map[string]bool {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
})

// begin makes the check's directory and its first files: an existing
// file at the top and one in a directory, written by another tool.
func (c *checker) begin() {
	ctx := context.Background()
	if c.h.armed != "" {
		// A crash point armed in an earlier check and never reached:
		// each check starts with a serving process that dies nowhere.
		if c.h.served.restarts() == c.h.armedRestarts {
			c.h.served.kill()
			c.h.served.start()
		}
		c.h.armed = ""
	}
	for i := range c.h.mounts {
		os.RemoveAll(filepath.Join(c.h.mounts[i].cacheDir, "lost+found"))
	}
	c.storePutRaw(ctx, "", nil, folderMeta)
	for _, name := range []string{"a", "d/a"} {
		data := []byte("old " + name + "\n")
		c.storePutRaw(ctx, name, data, nil)
		c.m.storePut(name, data)
	}
	c.storePutRaw(ctx, "d", nil, folderMeta)
	c.m.store["d"] = &mblob{kind: kDir, ver: c.m.nextVer()}
}

func (c *checker) storePutRaw(ctx context.Context, rel string, data []byte, md map[string]string) {
	if _, err := c.h.store.Put(ctx, c.blob(rel), data, blobstore.PutOptions{Metadata: md}); err != nil {
		c.t.Fatalf("put %s: %v", rel, err)
	}
}

// end closes what the check left open and waits until both mounts have
// released it, so that the next check starts from nothing.
func (c *checker) end() {
	if c.faults || c.flaky {
		c.h.faulty.SetOptions(blobstore.FaultOptions{})
		c.setFlakyA(blobstore.FaultOptions{})
		c.faults, c.flaky, c.patience = false, false, 70*time.Second
	}
	for i, s := range c.slots {
		if s != nil {
			s.f.Close()
			c.slots[i] = nil
		}
	}
	for i := range c.h.mounts {
		c.waitOpenFiles(i, 0)
	}
}

func (c *checker) blob(rel string) string {
	if rel == "" {
		return c.prefix
	}
	return c.prefix + "/" + rel
}

func (c *checker) path(mnt int, rel string) string {
	return filepath.Join(c.h.mounts[mnt].dir, c.prefix, rel)
}

func mountName(mnt int) string { return string(rune('A' + mnt)) }

// waitOpenFiles waits until mount mnt holds n open files: the kernel's
// RELEASE follows close(2) without the caller waiting for it, and a file
// is committed (or kept in lost+found) once it arrives.
func (c *checker) waitOpenFiles(mnt, n int) {
	if !pollUntil(c.patience, func() bool { return c.openFilesOf(mnt) == n }) {
		c.t.Fatalf("mount %s holds %d open files, the model %d", mountName(mnt), c.openFilesOf(mnt), n)
	}
}

// openFilesOf is how many files mount mnt holds open; -1 while no process
// serves it.
func (c *checker) openFilesOf(mnt int) int {
	mm := c.h.mounts[mnt]
	if mm.fsys != nil {
		return mm.fsys.openFileCount()
	}
	conn, err := net.Dial("unix", mm.openFilesSock)
	if err != nil {
		return -1
	}
	defer conn.Close()
	k := -1
	fmt.Fscan(conn, &k)
	return k
}

func (c *checker) settle() {
	for i := range c.h.mounts {
		n := 0
		for _, f := range c.m.files {
			if f.mount == i {
				n++
			}
		}
		c.waitOpenFiles(i, n)
	}
	c.patience = 10 * time.Second
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.Errno(0xffff) // not an errno: always a divergence
}

func errStr(e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	if e == 0xffff {
		return "non-errno error"
	}
	return unix.ErrnoName(e)
}

// expect fails the check when the real errno is not the model's. POSIX
// lets rename(2) onto a directory that is not empty fail with EEXIST as
// well as ENOTEMPTY: both are accepted.
func (c *checker) expect(what string, got error, want syscall.Errno) {
	c.t.Helper()
	g := errnoOf(got)
	snap := c.snap
	c.snap, c.faulted = nil, false
	if snap != nil && g == syscall.EIO && want != syscall.EIO {
		c.t.Logf("%s: EIO (allowed: mount B's store fails; nothing changes)", what)
		c.m.restore(snap)
		c.faulted = true
		return
	}
	c.t.Logf("%s: %s", what, errStr(g))
	if want == errENOENTOrOK && (g == 0 || g == syscall.ENOENT) {
		return
	}
	if g != want && !(want == syscall.ENOTEMPTY && g == syscall.EEXIST) {
		// No paths in the message: rapid shrinks only while a replay
		// fails with the same message, and each replay has its own
		// directory.
		c.t.Fatalf("DIVERGENCE %s: got %s, model says %s", what, errStr(g), errStr(want))
	}
}

// Draws.

func (c *checker) drawMount() int { return rapid.IntRange(0, 1).Draw(c.t, "mount") }

func (c *checker) drawSlot(open bool) int {
	var cands []int
	for i, s := range c.slots {
		if (s != nil) == open {
			cands = append(cands, i)
		}
	}
	if len(cands) == 0 {
		c.t.Skip("no such slot")
	}
	return rapid.SampledFrom(cands).Draw(c.t, "slot")
}

func (c *checker) drawData() []byte {
	n := rapid.IntRange(0, 12).Draw(c.t, "len")
	b := byte(rapid.IntRange('A', 'Z').Draw(c.t, "byte"))
	return bytes.Repeat([]byte{b}, n)
}

func slotName(s int) string { return fmt.Sprintf("%s%d", mountName(s/2), s%2) }

func flagString(fl int) string {
	parts := []string{[]string{"O_RDONLY", "O_WRONLY", "O_RDWR"}[fl&syscall.O_ACCMODE]}
	for _, f := range []struct {
		bit  int
		name string
	}{{syscall.O_CREAT, "O_CREAT"}, {syscall.O_EXCL, "O_EXCL"}, {syscall.O_TRUNC, "O_TRUNC"}, {syscall.O_APPEND, "O_APPEND"}} {
		if fl&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	return strings.Join(parts, "|")
}

// Actions (syscalls rather than os functions where os adds checks of its
// own: os.Rename refuses a directory as the target with EEXIST): each applies one operation to the real mount (or the store)
// and to the model, and compares.

func (c *checker) Open(t *rapid.T) {
	c.settle()
	s := c.drawSlot(false)
	mnt := s / 2
	p := rapid.SampledFrom(modelFiles).Draw(t, "path")
	fl := rapid.SampledFrom([]int{syscall.O_RDONLY, syscall.O_WRONLY, syscall.O_RDWR}).Draw(t, "access")
	if rapid.Bool().Draw(t, "creat") {
		fl |= syscall.O_CREAT
		if rapid.Bool().Draw(t, "excl") {
			fl |= syscall.O_EXCL
		}
	}
	if fl&syscall.O_ACCMODE != syscall.O_RDONLY {
		if rapid.Bool().Draw(t, "trunc") {
			fl |= syscall.O_TRUNC
		}
		if rapid.Bool().Draw(t, "append") {
			fl |= syscall.O_APPEND
		}
	}
	c.mayFault(mnt)
	mh, want := c.m.open(mnt, p, fl)
	f, err := os.OpenFile(c.path(mnt, p), fl, 0o644)
	c.expect(fmt.Sprintf("%s open %s %s", slotName(s), p, flagString(fl)), err, want)
	if err == nil {
		mh.desc = p + " " + flagString(fl)
		c.slots[s] = &realHandle{f: f, m: mh}
	}
}

func (c *checker) Close(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	c.slots[s] = nil
	c.mayFault(s / 2)
	want := c.m.close(h.m)
	c.expect(fmt.Sprintf("%s close (%s)", slotName(s), h.m.desc), h.f.Close(), want)
	if c.faulted {
		c.m.closeFailed(h.m)
	}
}

func (c *checker) Fsync(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	c.mayFault(s / 2)
	want := c.m.commit(h.m.f)
	c.expect(fmt.Sprintf("%s fsync (%s)", slotName(s), h.m.desc), h.f.Sync(), want)
}

func (c *checker) Read(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	off := rapid.IntRange(0, 16).Draw(t, "off")
	buf := make([]byte, 32)
	n, err := h.f.ReadAt(buf, int64(off))
	if err == io.EOF {
		err = nil
	}
	what := fmt.Sprintf("%s pread %d (%s)", slotName(s), off, h.m.desc)
	if !h.m.read {
		c.expect(what, err, syscall.EBADF)
		return
	}
	if e := errnoOf(err); c.faults && s/2 == 1 && e == syscall.EIO {
		t.Logf("%s: EIO (allowed: mount B's store fails)", what)
		return
	}
	allowed, mayFail := c.m.readAllowed(h.m)
	if e := errnoOf(err); mayFail && (e == syscall.ENOENT || e == syscall.ESTALE || e == syscall.EIO) {
		t.Logf("%s: %s (allowed: another writer changed the file)", what, errStr(e))
		return
	}
	c.expect(what, err, 0)
	got := buf[:n]
	for _, a := range allowed {
		want := []byte{}
		if off < len(a) {
			want = a[off:min(len(a), off+32)]
		}
		if bytes.Equal(got, want) {
			return
		}
	}
	c.t.Fatalf("DIVERGENCE %s: read %q, model allows %q", what, got, allowed)
}

func (c *checker) Write(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	data := c.drawData()
	off := rapid.IntRange(0, 20).Draw(t, "off")
	if h.m.app || !h.m.write {
		// pwrite on an O_APPEND descriptor appends anyway (Linux);
		// write(2) says what is meant.
		c.mayFault(s / 2)
		want := c.m.write(h.m, 0, data)
		_, err := h.f.Write(data)
		c.expect(fmt.Sprintf("%s write %q (%s)", slotName(s), data, h.m.desc), err, want)
		return
	}
	c.mayFault(s / 2)
	want := c.m.write(h.m, off, data)
	_, err := h.f.WriteAt(data, int64(off))
	c.expect(fmt.Sprintf("%s pwrite %q at %d (%s)", slotName(s), data, off, h.m.desc), err, want)
}

func (c *checker) Ftruncate(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	size := rapid.IntRange(0, 20).Draw(t, "size")
	c.mayFault(s / 2)
	want := c.m.ftruncate(h.m, size)
	c.expect(fmt.Sprintf("%s ftruncate %d (%s)", slotName(s), size, h.m.desc), h.f.Truncate(int64(size)), want)
}

func (c *checker) Truncate(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelFiles).Draw(t, "path")
	size := rapid.IntRange(0, 20).Draw(t, "size")
	c.mayFault(mnt)
	want := c.m.truncatePath(mnt, p, size)
	c.expect(fmt.Sprintf("%s truncate %s %d", mountName(mnt), p, size), os.Truncate(c.path(mnt, p), int64(size)), want)
}

var modelTime0 = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

func (c *checker) drawAttr() attrOp {
	op := attrOp{kind: rapid.SampledFrom([]string{"chmod", "chown", "utime"}).Draw(c.t, "attr")}
	switch op.kind {
	case "chmod":
		op.perm = rapid.SampledFrom([]uint32{0o600, 0o644, 0o640, 0o755}).Draw(c.t, "perm")
	case "chown":
		op.owner = rapid.SampledFrom([]uint32{0, 1000, 4321}).Draw(c.t, "owner")
	case "utime":
		op.mtime = modelTime0.Add(time.Duration(rapid.IntRange(0, 3).Draw(c.t, "time")) * time.Hour).UnixNano()
	}
	return op
}

func (op attrOp) String() string {
	switch op.kind {
	case "chmod":
		return fmt.Sprintf("chmod %#o", op.perm)
	case "chown":
		return fmt.Sprintf("chown %d:%d", op.owner, op.owner)
	}
	return fmt.Sprintf("utime %s", time.Unix(0, op.mtime).UTC().Format(time.TimeOnly))
}

// applyAttr runs op on path (a file, or /proc/self/fd/N for a handle).
func applyAttr(f *os.File, p string, op attrOp) error {
	switch op.kind {
	case "chmod":
		if f != nil {
			return f.Chmod(os.FileMode(op.perm))
		}
		return os.Chmod(p, os.FileMode(op.perm))
	case "chown":
		if f != nil {
			return f.Chown(int(op.owner), int(op.owner))
		}
		return os.Chown(p, int(op.owner), int(op.owner))
	}
	ts := []unix.Timespec{unix.NsecToTimespec(op.mtime), unix.NsecToTimespec(op.mtime)}
	if f != nil {
		p = fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
}

func (c *checker) AttrFd(t *rapid.T) {
	s := c.drawSlot(true)
	h := c.slots[s]
	op := c.drawAttr()
	c.mayFault(s / 2)
	want := c.m.setAttr(s/2, "", h.m, op, c.h.defaults)
	c.expect(fmt.Sprintf("%s f%s (%s)", slotName(s), op, h.m.desc), applyAttr(h.f, "", op), want)
}

func (c *checker) AttrPath(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelFiles).Draw(t, "path")
	op := c.drawAttr()
	c.mayFault(mnt)
	want := c.m.setAttr(mnt, p, nil, op, c.h.defaults)
	c.expect(fmt.Sprintf("%s %s %s", mountName(mnt), op, p), applyAttr(nil, c.path(mnt, p), op), want)
}

func (c *checker) RenameFile(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	src := rapid.SampledFrom(modelFiles).Draw(t, "src")
	dst := rapid.SampledFrom(modelFiles).Draw(t, "dst")
	c.mayFault(mnt)
	want := c.m.renameFile(mnt, src, dst)
	c.expect(fmt.Sprintf("%s rename %s %s", mountName(mnt), src, dst), syscall.Rename(c.path(mnt, src), c.path(mnt, dst)), want)
}

func (c *checker) RenameDir(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	src := rapid.SampledFrom(modelDirs).Draw(t, "src")
	dst := rapid.SampledFrom(modelDirs).Draw(t, "dst")
	c.mayFault(mnt)
	want := c.m.renameDir(mnt, src, dst)
	c.expect(fmt.Sprintf("%s rename %s/ %s/", mountName(mnt), src, dst), syscall.Rename(c.path(mnt, src), c.path(mnt, dst)), want)
}

func (c *checker) Unlink(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelAll).Draw(t, "path")
	c.mayFault(mnt)
	want := c.m.unlink(mnt, p)
	c.expect(fmt.Sprintf("%s unlink %s", mountName(mnt), p), syscall.Unlink(c.path(mnt, p)), want)
}

func (c *checker) Mkdir(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelDirs).Draw(t, "path")
	c.mayFault(mnt)
	want := c.m.mkdir(mnt, p)
	c.expect(fmt.Sprintf("%s mkdir %s", mountName(mnt), p), syscall.Mkdir(c.path(mnt, p), 0o755), want)
}

func (c *checker) Rmdir(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelDirs).Draw(t, "path")
	c.mayFault(mnt)
	want := c.m.rmdir(mnt, p)
	c.expect(fmt.Sprintf("%s rmdir %s", mountName(mnt), p), syscall.Rmdir(c.path(mnt, p)), want)
}

func (c *checker) Symlink(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelSymlinks).Draw(t, "path")
	target := rapid.SampledFrom([]string{"a", "../a", "nowhere"}).Draw(t, "target")
	c.mayFault(mnt)
	want := c.m.mknode(mnt, p, kSymlink, target)
	c.expect(fmt.Sprintf("%s symlink %s -> %s", mountName(mnt), p, target), os.Symlink(target, c.path(mnt, p)), want)
}

func (c *checker) Readlink(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(append(append([]string{}, modelSymlinks...), "a")).Draw(t, "path")
	c.mayFault(mnt)
	wantTarget, want := c.m.readlink(mnt, p)
	got, err := os.Readlink(c.path(mnt, p))
	c.expect(fmt.Sprintf("%s readlink %s", mountName(mnt), p), err, want)
	if err == nil && got != wantTarget {
		t.Fatalf("DIVERGENCE readlink %s: %q, model says %q", p, got, wantTarget)
	}
}

func (c *checker) Mkfifo(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	p := rapid.SampledFrom(modelFifos).Draw(t, "path")
	c.mayFault(mnt)
	want := c.m.mknode(mnt, p, kFifo, "")
	c.expect(fmt.Sprintf("%s mkfifo %s", mountName(mnt), p), syscall.Mkfifo(c.path(mnt, p), 0o644), want)
}

func (c *checker) Link(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	src := rapid.SampledFrom(modelFiles).Draw(t, "src")
	dst := rapid.SampledFrom(modelFiles).Draw(t, "dst")
	c.mayFault(mnt)
	want := c.m.link(mnt, src, dst)
	c.expect(fmt.Sprintf("%s link %s %s", mountName(mnt), src, dst), syscall.Link(c.path(mnt, src), c.path(mnt, dst)), want)
}

func (c *checker) LongName(t *rapid.T) {
	c.settle()
	mnt := c.drawMount()
	name := strings.Repeat("n", 256)
	c.mayFault(mnt)
	if rapid.Bool().Draw(t, "mkdir") {
		c.expect(fmt.Sprintf("%s mkdir <256 bytes>", mountName(mnt)), syscall.Mkdir(c.path(mnt, name), 0o755), syscall.ENAMETOOLONG)
		return
	}
	f, err := os.OpenFile(c.path(mnt, name), os.O_WRONLY|os.O_CREATE, 0o644)
	if err == nil {
		f.Close()
	}
	c.expect(fmt.Sprintf("%s create <256 bytes>", mountName(mnt)), err, syscall.ENAMETOOLONG)
}

func (c *checker) Statfs(t *rapid.T) {
	mnt := c.drawMount()
	var st syscall.Statfs_t
	c.mayFault(mnt)
	c.expect(fmt.Sprintf("%s statfs", mountName(mnt)), syscall.Statfs(c.path(mnt, ""), &st), 0)
}

func (c *checker) StorePut(t *rapid.T) {
	c.settle()
	p := rapid.SampledFrom(modelFiles).Draw(t, "path")
	data := append([]byte("api:"), c.drawData()...)
	t.Logf("store put %s %q", p, data)
	c.storePutRaw(context.Background(), p, data, nil)
	c.m.storePut(p, data)
}

func (c *checker) StoreDelete(t *rapid.T) {
	c.settle()
	p := rapid.SampledFrom(modelFiles).Draw(t, "path")
	t.Logf("store delete %s", p)
	err := c.h.store.Delete(context.Background(), c.blob(p), blobstore.Conditions{})
	if err != nil && !errors.Is(err, blobstore.ErrNotFound) {
		t.Fatalf("store delete %s: %v", p, err)
	}
	c.m.storeDelete(p)
}

// modelCrashPoints are where the Crash action may have mount A's serving
// process die during a later operation (FS.crashPoint: "op/point/"
// followed by a name): after the store changed and before the reply, or
// while a file is loaded or committed.
var modelCrashPoints = []string{
	"create/store/", "create/reply/", "open/reply/",
	"mkdir/store/", "mknod/store/", "symlink/store/",
	"unlink/store/", "rmdir/store/",
	"rename/store/", "rename/copied/", "rename/reply/",
	"load/downloaded/", "commit/store/",
}

// mayFault: the operation about to run goes through mount mnt; while
// mount B's store fails, one through B may fail with EIO, and then it must
// change nothing (expect restores the model) except that a close lets go
// of its handle.
func (c *checker) mayFault(mnt int) {
	c.snap = nil
	if c.faults && mnt == 1 {
		c.snap = c.m.snapshot()
	}
}

// FaultsOn makes every call of mount B's store fail (ErrTransient, before
// it reaches the store) until FaultsOff. The model permits EIO for any
// operation through B meanwhile, with nothing changed; what was
// acknowledged before stays, and nothing is corrupted.
func (c *checker) FaultsOn(t *rapid.T) {
	if c.faults || c.flaky {
		t.Skip("faults are on")
	}
	c.settle()
	t.Logf("B's store fails every call from now")
	c.h.faulty.SetOptions(blobstore.FaultOptions{ErrorRate: 1})
	c.faults = true
}

// FaultsOff: the store answers again. Files whose last close failed are
// uploaded by blobfs's background retry (or, if another writer overtook
// them, kept in lost+found); settle waits for it.
func (c *checker) FaultsOff(t *rapid.T) {
	if !c.faults {
		t.Skip("faults are off")
	}
	t.Logf("B's store answers again")
	c.h.faulty.SetOptions(blobstore.FaultOptions{})
	c.faults = false
	c.m.faultsEnded(1)
	c.patience = 70 * time.Second
	c.settle()
}

// FlakyOn makes the mounts' stores (B's, and A's in TestModel) fail one
// call in twenty before it reaches the store and lose the answer of one in
// twenty after the store acted (a conditional Put that succeeded, then
// retried, finds its own blob; a retried Delete finds nothing), and B's
// answer each call 0.1-2 ms late, until FlakyOff. The retrying layer retries
// every such failure: the model expects exactly what it expects without
// faults.
func (c *checker) FlakyOn(t *rapid.T) {
	if c.faults || c.flaky {
		t.Skip("faults are on")
	}
	seed := rapid.Uint64().Draw(t, "seed") | 1 // 0 would mean a random seed
	t.Logf("the stores are flaky from now (seed %d)", seed)
	c.h.faulty.SetOptions(blobstore.FaultOptions{Seed: seed, ErrorRate: 0.05, LostAnswerRate: 0.05,
		Latency: 100 * time.Microsecond, Jitter: 2 * time.Millisecond})
	// A's without the latency, which made TestModel 60% slower.
	c.setFlakyA(blobstore.FaultOptions{Seed: seed + 2, ErrorRate: 0.05, LostAnswerRate: 0.05})
	c.flaky = true
}

// FlakyOff: the stores answer every call at once again.
func (c *checker) FlakyOff(t *rapid.T) {
	if !c.flaky {
		t.Skip("the store is not flaky")
	}
	t.Logf("the stores are reliable again")
	c.h.faulty.SetOptions(blobstore.FaultOptions{})
	c.setFlakyA(blobstore.FaultOptions{})
	c.flaky = false
}

// setFlakyA sets the faults of mount A's store, where this process serves
// it (TestModel).
func (c *checker) setFlakyA(o blobstore.FaultOptions) {
	if c.h.flakyA != nil {
		c.h.flakyA.SetOptions(o)
	}
}

// CrashNow kills the process serving mount A between two operations
// (TestModelCrash only); the launcher starts a successor, which adopts the
// mount. The model does not change: nothing acknowledged is lost, every
// handle keeps working.
func (c *checker) CrashNow(t *rapid.T) {
	c.crashable(t)
	c.settle()
	t.Logf("A crash: the serving process is killed; a successor adopts the mount")
	c.h.served.kill()
	c.h.served.start()
	c.h.armed = ""
}

// CrashAt arms a crash point: the process serving mount A dies there
// during a later operation through mount A (or a release), and the
// launcher starts a successor at once, as a keeper does; the kernel
// resends what the dead process had taken. The model does not change: a
// change in flight happens exactly once, and its caller gets the answer
// the model gives.
func (c *checker) CrashAt(t *rapid.T) {
	c.crashable(t)
	c.settle()
	point := rapid.SampledFrom(modelCrashPoints).Draw(t, "at")
	t.Logf("A crash armed at %s*: the serving process dies there during a later operation", point)
	c.h.served.kill()
	c.h.armedRestarts = c.h.served.restarts()
	c.h.served.start("BLOBFS_TEST_CRASH=" + point + "*")
	c.h.armed = point
}

func (c *checker) crashable(t *rapid.T) {
	if c.h.served == nil {
		t.Skip("mount A is served in this process")
	}
}

// LoseSession kills mount A's serving process and its launcher (the
// keeper) together (TestModelCrash only): the mount is gone, and so are
// its handles. A new mount on the same cache directory recovers what the
// lost session left (the model's loseSession).
func (c *checker) LoseSession(t *rapid.T) {
	c.losable(t)
	c.settle()
	t.Logf("A's session is lost: the serving process and its keeper die; a new mount on the same cache directory")
	c.h.served.kill()
	c.remountA()
}

// LoseSessionInRename renames a file through mount A and has the serving
// process die after the Copy to the new name, before the Delete of the old
// one, and its keeper with it: the new mount on the same cache directory
// finishes the rename from its record. Exactly one name remains, with the
// content: the rename done, or not (the application was never answered).
func (c *checker) LoseSessionInRename(t *rapid.T) {
	c.losable(t)
	c.settle()
	src := rapid.SampledFrom(modelFiles).Draw(t, "src")
	dst := rapid.SampledFrom(modelFiles).Draw(t, "dst")
	if c.m.mountFile(0, src) != nil || c.m.mountFile(0, dst) != nil {
		t.Skip("a file open at either name") // its commit comes first
	}
	isFile := c.m.storeKind(src) == kFile
	before := c.m.snapshot()
	want := c.m.renameFile(0, src, dst)
	if want != 0 || src == dst || !isFile {
		c.m.restore(before)
		t.Skip("the rename copies nothing")
	}
	t.Logf("A rename %s %s; the serving process dies after the copy, its keeper with it", src, dst)
	from, to := c.path(0, src), c.path(0, dst) // remountA moves mount A
	e := c.loseSessionDuring("rename/copied/", func() error { return syscall.Rename(from, to) })
	t.Logf("A rename %s %s: %s", src, dst, errStr(e))
	// The model is the rename done, then the session lost; else it is
	// the rename never done, then the session lost; else it is the Copy
	// made, then the session lost (which lets mount B commit the source
	// it holds), then the recovery: the old name goes only if it is still
	// what was copied (docs/semantics.md, "Renames across a lost session").
	if d := c.storeDiff(); d != "" {
		c.m.restore(before)
		c.remountedA()
		if c.storeDiff() == "" {
			t.Logf("the rename was undone")
			return
		}
		c.m.restore(before)
		copied := c.m.copyFile(src, dst)
		c.remountedA()
		if c.m.curVer(src) == copied {
			c.m.finishCopy(src)
		}
		if d3 := c.storeDiff(); d3 != "" {
			t.Fatalf("DIVERGENCE store after a rename in a lost session: neither done, nor undone, nor copied with the old name written since:\n%s\n(against the copy: %s)", d, d3)
		}
		t.Logf("the rename was copied; the old name was written since and is kept")
	} else {
		t.Logf("the rename was finished")
	}
}

// LoseSessionInCommit fsyncs a file with unsaved changes through mount A
// and has the serving process die once the commit's upload reached the
// store, before its answer, and its keeper with it. The next mount on the
// same cache directory finds the spill file and its record: the upload it
// would make is already there (the commit nonce says so), so the file has
// its content and nothing goes to lost+found, whether the model is the
// commit done, then the session lost, or the session lost first.
func (c *checker) LoseSessionInCommit(t *rapid.T) {
	c.losable(t)
	c.settle()
	var cands []int
	for s := 0; s < 2; s++ {
		if h := c.slots[s]; h != nil && h.m.f.dirty && !h.m.f.unlinked && !h.m.f.nameLost {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		t.Skip("no file of mount A with unsaved changes")
	}
	s := rapid.SampledFrom(cands).Draw(t, "slot")
	h := c.slots[s]
	before := c.m.snapshot()
	if c.m.commit(h.m.f) != 0 {
		c.m.restore(before)
		t.Skip("the commit conflicts: it uploads nothing")
	}
	t.Logf("%s fsync (%s); the serving process dies once the upload is in the store, its keeper with it", slotName(s), h.m.desc)
	e := c.loseSessionDuring("commit/store/", h.f.Sync)
	t.Logf("%s fsync: %s", slotName(s), errStr(e))
	if d := c.storeDiff(); d != "" {
		c.m.restore(before)
		c.remountedA()
		if d2 := c.storeDiff(); d2 != "" {
			t.Fatalf("DIVERGENCE store after a commit in a lost session: neither done nor done by the next mount:\n%s", d)
		}
	}
}

// loseSessionDuring runs op through mount A with its serving process set
// to die at crash point (the keeper with it), waits for the death, mounts
// A anew on the same cache directory and waits for its recovery; it
// returns op's errno.
func (c *checker) loseSessionDuring(point string, op func() error) syscall.Errno {
	c.h.served.command("nokeep")
	c.h.served.kill()
	c.h.served.start("BLOBFS_TEST_CRASH=" + point + "*")
	done := make(chan error, 1)
	go func() { done <- op() }()
	for c.openFilesOf(0) >= 0 { // until the serving process is dead
		select {
		case err := <-done:
			c.t.Fatalf("DIVERGENCE the operation returned (%s) without reaching the crash point %s", errStr(errnoOf(err)), point)
		case <-time.After(5 * time.Millisecond):
		}
	}
	c.remountA()
	return errnoOf(<-done)
}

func (c *checker) losable(t *rapid.T) {
	c.crashable(t)
}

// remountA: mount A's serving process is dead or about to be; its keeper
// (the launcher) dies, the mount with it; a new one takes its place on the
// same cache directory, and the checker waits for it to recover the lost
// session's files.
func (c *checker) remountA() {
	c.h.armed = ""
	old := c.h.served
	old.launcher.Process.Kill()
	old.launcher.Wait()
	for s := 0; s < 2; s++ {
		if c.slots[s] != nil {
			c.slots[s].f.Close() // ENOTCONN: the handle is gone
			c.slots[s] = nil
		}
	}
	kernel.Unmount(old.mnt, true)
	c.h.served.cmds.Close()
	c.h.serveA()
	c.remountedA()
	spill := filepath.Join(c.h.mounts[0].cacheDir, "spill")
	var left, renames []string
	recovered := pollUntil(30*time.Second, func() bool {
		left, _ = filepath.Glob(filepath.Join(spill, spillPrefix+"*"))
		renames, _ = filepath.Glob(filepath.Join(spill, renamePrefix+"*"))
		return len(left)+len(renames) == 0
	})
	if !recovered {
		c.t.Fatalf("DIVERGENCE the new mount A left files of the lost session: %v %v", left, renames)
	}
}

// remountedA applies a lost session of mount A to the model. Starting the
// new launcher forked this process: the exec closed the child's copies of
// every descriptor, and the kernel sent mount B a FLUSH for each of its
// open files, which commits them (a harness effect, before the new mount
// recovers anything).
func (c *checker) remountedA() {
	if !c.faults {
		for _, f := range c.m.files {
			if f.mount == 1 && f.handles > 0 {
				c.m.commit(f)
			}
		}
	}
	c.m.loseSession(0)
}

// Check compares the whole state after every action.
func (c *checker) Check(t *rapid.T) {
	if c.h.armed != "" && c.h.served.restarts() != c.h.armedRestarts {
		t.Logf("A died at crash point %s*; a successor adopted the mount", c.h.armed)
		c.h.armed = ""
	}
	c.settle()
	c.checkStore()
	c.snap = nil
	for mnt := range c.h.mounts {
		if !(c.faults && mnt == 1) { // B's lookups fail
			c.checkMount(mnt)
		}
		c.checkLostFound(mnt)
	}
}

// checkStore compares the container with the model: every file, symlink
// and FIFO blob and its content, and which directories exist (markers
// themselves are blobfs's business).
func (c *checker) checkStore() {
	if d := c.storeDiff(); d != "" {
		c.t.Fatalf("DIVERGENCE store:\n%s", d)
	}
}

// storeDiff says how the container differs from the model ("": it does
// not).
func (c *checker) storeDiff() string {
	ctx := context.Background()
	got := map[string]string{}
	gotDirs := map[string]bool{}
	var marker string
	for {
		page, err := c.h.store.List(ctx, blobstore.ListOptions{Prefix: c.prefix + "/", Marker: marker})
		if err != nil {
			c.t.Fatalf("list: %v", err)
		}
		for _, b := range page.Blobs {
			rel := strings.TrimPrefix(b.Name, c.prefix+"/")
			for d := parentOf(rel); d != ""; d = parentOf(d) {
				gotDirs[d] = true
			}
			switch {
			case b.Metadata[blobstore.MetaIsFolder] == "true":
				gotDirs[rel] = true
			case b.Metadata[blobstore.MetaIsSymlink] == "true":
				got[rel] = "symlink:" + string(c.blobData(b))
			case isFifoMode(b.Metadata[blobstore.MetaMode]):
				got[rel] = "fifo"
			default:
				got[rel] = "file:" + string(c.blobData(b))
			}
		}
		if marker = page.NextMarker; marker == "" {
			break
		}
	}
	want := map[string]string{}
	wantDirs := map[string]bool{}
	for name, b := range c.m.store {
		for d := parentOf(name); d != ""; d = parentOf(d) {
			wantDirs[d] = true
		}
		switch b.kind {
		case kDir:
			wantDirs[name] = true
		case kSymlink:
			want[name] = "symlink:" + b.target
		case kFifo:
			want[name] = "fifo"
		default:
			want[name] = "file:" + string(b.data)
		}
	}
	if !mapsEqual(got, want) || !mapsEqual(gotDirs, wantDirs) {
		return fmt.Sprintf(" got  %v dirs %v\n want %v dirs %v", got, modelKeys(gotDirs), want, modelKeys(wantDirs))
	}
	return ""
}

func (c *checker) blobData(a blobstore.Attrs) []byte {
	buf := make([]byte, a.Size)
	n, err := c.h.store.ReadAt(context.Background(), a.Name, buf, 0, "")
	if err != nil && err != io.EOF {
		c.t.Fatalf("read blob %s: %v", a.Name, err)
	}
	return buf[:n]
}

func statStr(st os.FileInfo, err error) string {
	if err != nil {
		return errStr(errnoOf(err))
	}
	return fmt.Sprintf("%v size %d", st.Mode(), st.Size())
}

func isFifoMode(s string) bool {
	m, err := strconv.ParseUint(s, 8, 32)
	return err == nil && m&syscall.S_IFMT == syscall.S_IFIFO
}

func mapsEqual[V comparable](a, b map[string]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func modelKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// checkMount compares what mount mnt shows: listings, types, sizes,
// attributes where the model knows them, and content read through a
// fresh open (except of files with changes this mount has not committed:
// closing the reader would commit them).
func (c *checker) checkMount(mnt int) {
	name := mountName(mnt)
	for _, d := range append([]string{""}, modelDirs...) {
		if c.m.view(mnt, d) != kDir {
			continue
		}
		ents, err := os.ReadDir(c.path(mnt, d))
		if err != nil {
			c.t.Fatalf("DIVERGENCE %s readdir %q: %s", name, d, errStr(errnoOf(err)))
		}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		sort.Strings(got)
		if want := c.m.children(mnt, d); strings.Join(got, " ") != strings.Join(want, " ") {
			c.t.Fatalf("DIVERGENCE %s readdir %q: %v, model says %v", name, d, got, want)
		}
	}
	for _, p := range modelAll {
		k := c.m.view(mnt, p)
		st, err := os.Lstat(c.path(mnt, p))
		if k == kNone {
			if !errors.Is(err, syscall.ENOENT) {
				c.t.Fatalf("DIVERGENCE %s stat %s: %s, model says ENOENT", name, p, statStr(st, err))
			}
			continue
		}
		if err != nil {
			c.t.Fatalf("DIVERGENCE %s stat %s: %s, model says a %s", name, p, errStr(errnoOf(err)), k)
		}
		var gotKind mkind
		switch st.Mode().Type() {
		case 0:
			gotKind = kFile
		case os.ModeDir:
			gotKind = kDir
		case os.ModeSymlink:
			gotKind = kSymlink
		case os.ModeNamedPipe:
			gotKind = kFifo
		}
		if gotKind != k {
			c.t.Fatalf("DIVERGENCE %s stat %s: a %s, model says a %s", name, p, st.Mode().Type(), k)
		}
		if k != kFile {
			continue
		}
		data := c.m.viewData(mnt, p)
		if st.Size() != int64(len(data)) {
			c.t.Fatalf("DIVERGENCE %s stat %s: size %d, model says %d", name, p, st.Size(), len(data))
		}
		c.checkAttrs(mnt, p, st)
		if f := c.m.mountFile(mnt, p); f != nil && f.dirty {
			continue
		}
		got, err := os.ReadFile(c.path(mnt, p))
		if err != nil || !bytes.Equal(got, data) {
			c.t.Fatalf("DIVERGENCE %s read back %s: %q (%s), model says %q", name, p, got, errStr(errnoOf(err)), data)
		}
	}
}

// checkAttrs compares mode, owner and explicit mtime of a file no mount
// has open (an open file's attributes follow its commits).
func (c *checker) checkAttrs(mnt int, p string, st os.FileInfo) {
	for _, f := range c.m.files {
		if f.path == p && !f.unlinked {
			return
		}
	}
	a := c.m.store[p].attrs
	sys := st.Sys().(*syscall.Stat_t)
	if a.perm != 0 && uint32(st.Mode().Perm()) != a.perm {
		c.t.Fatalf("DIVERGENCE %s stat %s: mode %#o, model says %#o", mountName(mnt), p, st.Mode().Perm(), a.perm)
	}
	if a.owned && (sys.Uid != a.uid || sys.Gid != a.gid) {
		c.t.Fatalf("DIVERGENCE %s stat %s: owner %d:%d, model says %d:%d", mountName(mnt), p, sys.Uid, sys.Gid, a.uid, a.gid)
	}
	if a.mtime != 0 && st.ModTime().UnixNano() != a.mtime {
		c.t.Fatalf("DIVERGENCE %s stat %s: mtime %v, model says %v", mountName(mnt), p, st.ModTime().UTC(), time.Unix(0, a.mtime).UTC())
	}
}

// checkLostFound compares mount mnt's lost+found with the data the model
// says it keeps (in any order).
func (c *checker) checkLostFound(mnt int) {
	dir := filepath.Join(c.h.mounts[mnt].cacheDir, "lost+found")
	ents, _ := os.ReadDir(dir)
	var got []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			c.t.Fatal(err)
		}
		got = append(got, string(b))
	}
	var want []string
	for _, b := range c.m.lost[mnt] {
		want = append(want, string(b))
	}
	sort.Strings(got)
	sort.Strings(want)
	if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
		c.t.Fatalf("DIVERGENCE %s lost+found: %q, model says %q", mountName(mnt), got, want)
	}
}
