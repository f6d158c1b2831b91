package fusefs

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// fsx, after the file system exerciser of the same name (Avadis
// Tevanian's, grown in BSD, Apple and xfstests): one file, random writes,
// reads, mapped reads and writes, truncates, fsyncs and close/reopen
// cycles, every read checked against an in-memory copy of what the file
// must hold. Through a real mount, with the page cache, the spill file,
// block uploads and the store between the two. After each close, a
// second mount of the same container (no caches) must read exactly the
// copy: close-to-open consistency. The model checker (modelcheck_test.go)
// covers names, handles and crashes over small files; this covers the
// data of one larger file, including mmap, which the model leaves out.
//
// go test ./fusefs -run TestFsx -args -fsx.ops=100000 -fsx.seed=N  (a soak, or a replay)
var (
	fsxOps  = flag.Int("fsx.ops", 0, "operations per backend for TestFsx (0: the default budget)")
	fsxSeed = flag.Uint64("fsx.seed", 0, "seed for TestFsx (0: from the clock, printed)")
)

const (
	fsxMaxLen = 1 << 20 // the file's largest size
	fsxMaxOp  = 64 << 10
)

func TestFsx(t *testing.T) {
	seed := *fsxSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("fsx seed %d (replay: -fsx.seed=%d)", seed, seed)
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		ops := *fsxOps
		if ops == 0 {
			ops = 2000
			if strings.HasSuffix(t.Name(), "/azurite") || strings.HasSuffix(t.Name(), "/faulty") {
				ops = 600
			}
		}
		mnt, _ := mountStore(t, s, Options{})
		other, _ := mountStore(t, s, conflictMountOptions)
		// The operations run in a process of their own, as an
		// application's would: a page fault on a mapping of a file of
		// this mount holds the faulting process's mmap lock until the
		// mount answers, and a server in the same process that needs
		// that lock to grow its heap would never answer.
		cmd := exec.Command(os.Args[0], "-test.run=^TestFsxClient$", "-test.v")
		cmd.Env = append(os.Environ(), fmt.Sprintf("BLOBFS_FSX=%s %s %d %d", mnt, other, seed, ops))
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestFsxClient")) {
			t.Fatalf("fsx client: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if _, result, ok := strings.Cut(l, "fsx: "); ok {
				t.Log(result)
			}
		}
	})
}

// TestFsxClient is TestFsx's application process: it runs only when
// TestFsx starts it, with $BLOBFS_FSX set to "MOUNT OTHER SEED OPS".
func TestFsxClient(t *testing.T) {
	env := os.Getenv("BLOBFS_FSX")
	if env == "" {
		t.Skip("run by TestFsx")
	}
	var mnt, other string
	var seed uint64
	var ops int
	if _, err := fmt.Sscan(env, &mnt, &other, &seed, &ops); err != nil {
		t.Fatalf("BLOBFS_FSX=%q: %v", env, err)
	}
	runFsx(t, mnt, other, seed, ops)
}

type fsx struct {
	t      *testing.T
	rng    *rand.Rand
	mnt    string // written through
	other  string // a second mount, read after each close
	f      *os.File
	model  []byte
	log    []string // the last operations, printed on a divergence
	closes int
}

func runFsx(t *testing.T, mnt, other string, seed uint64, ops int) {
	x := &fsx{t: t, rng: rand.New(rand.NewPCG(seed, 0x5f5)), mnt: mnt, other: other}
	x.open()
	for i := range ops {
		switch r := x.rng.IntN(100); {
		case r < 30:
			x.write()
		case r < 55:
			x.read()
		case r < 65:
			x.mapRead()
		case r < 75:
			x.mapWrite()
		case r < 85:
			x.truncate()
		case r < 92:
			x.fsync()
		default:
			x.reopen()
		}
		if t.Failed() {
			t.Fatalf("after operation %d of seed %d; the last ones:\n%s", i, seed, strings.Join(x.log, "\n"))
		}
	}
	x.reopen()
	if err := x.f.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	t.Logf("fsx: %d operations, %d closes, final size %d", ops, x.closes, len(x.model))
}

func (x *fsx) note(format string, args ...any) {
	x.log = append(x.log, fmt.Sprintf(format, args...))
	if len(x.log) > 30 {
		x.log = x.log[1:]
	}
}

func (x *fsx) open() {
	f, err := os.OpenFile(join(x.mnt, "fsx.dat"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		x.t.Fatalf("open: %v", err)
	}
	x.f = f
}

// span draws an operation's offset and length within the largest file.
func (x *fsx) span() (off, n int) {
	off = x.rng.IntN(fsxMaxLen)
	n = 1 + x.rng.IntN(min(fsxMaxOp, fsxMaxLen-off))
	return off, n
}

func (x *fsx) data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(x.rng.Uint32())
	}
	return b
}

func (x *fsx) write() {
	off, n := x.span()
	b := x.data(n)
	x.note("pwrite %d+%d", off, n)
	if _, err := x.f.WriteAt(b, int64(off)); err != nil {
		x.t.Errorf("pwrite %d+%d: %v", off, n, err)
		return
	}
	x.grow(off + n)
	copy(x.model[off:], b)
}

func (x *fsx) grow(size int) {
	if size > len(x.model) {
		x.model = append(x.model, make([]byte, size-len(x.model))...)
	}
}

// inFile draws a range within the file as it is; false if it is empty.
func (x *fsx) inFile() (off, n int, ok bool) {
	if len(x.model) == 0 {
		return 0, 0, false
	}
	off = x.rng.IntN(len(x.model))
	n = 1 + x.rng.IntN(min(fsxMaxOp, len(x.model)-off))
	return off, n, true
}

func (x *fsx) read() {
	off, n, ok := x.inFile()
	if !ok {
		return
	}
	x.note("pread %d+%d", off, n)
	got := make([]byte, n)
	if _, err := x.f.ReadAt(got, int64(off)); err != nil {
		x.t.Errorf("pread %d+%d: %v", off, n, err)
		return
	}
	x.compare("pread", off, got)
}

// compare reports where got, read at off, differs from the model.
func (x *fsx) compare(what string, off int, got []byte) {
	want := x.model[off : off+len(got)]
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for got[i] == want[i] {
		i++
	}
	x.t.Errorf("%s %d+%d: byte %d (file offset %d) is %#x, want %#x", what, off, len(got), i, off+i, got[i], want[i])
}

// mapRead maps the file shared and read-only and reads a range of it.
func (x *fsx) mapRead() {
	off, n, ok := x.inFile()
	if !ok {
		return
	}
	x.note("mapread %d+%d", off, n)
	var got []byte
	x.mapped("mapread", off, n, unix.PROT_READ, func(m []byte) { got = bytes.Clone(m) })
	if got != nil {
		x.compare("mapread", off, got)
	}
}

// mapWrite extends the file if the range reaches past its end (a mapping
// cannot), maps it shared and writable, writes and msyncs.
func (x *fsx) mapWrite() {
	off, n := x.span()
	b := x.data(n)
	x.note("mapwrite %d+%d (size %d)", off, n, len(x.model))
	if off+n > len(x.model) {
		if err := x.f.Truncate(int64(off + n)); err != nil {
			x.t.Errorf("ftruncate %d before mapwrite: %v", off+n, err)
			return
		}
		x.grow(off + n)
	}
	x.mapped("mapwrite", off, n, unix.PROT_READ|unix.PROT_WRITE, func(m []byte) {
		copy(m, b)
		copy(x.model[off:], b)
	})
}

// mapped maps bytes off..off+n of the file shared with protection prot
// (from the page that holds off), hands fn those n bytes, msyncs a
// writable mapping and unmaps.
func (x *fsx) mapped(what string, off, n, prot int, fn func(m []byte)) {
	page := off &^ (os.Getpagesize() - 1)
	m, err := unix.Mmap(int(x.f.Fd()), int64(page), off+n-page, prot, unix.MAP_SHARED)
	if err != nil {
		x.t.Errorf("%s: mmap %d+%d: %v", what, off, n, err)
		return
	}
	fn(m[off-page:])
	if prot&unix.PROT_WRITE != 0 {
		// The whole mapping: msync wants a page-aligned start.
		if err := unix.Msync(m, unix.MS_SYNC); err != nil {
			x.t.Errorf("%s: msync %d+%d: %v", what, off, n, err)
		}
	}
	if err := unix.Munmap(m); err != nil {
		x.t.Errorf("%s: munmap: %v", what, err)
	}
}

func (x *fsx) truncate() {
	size := x.rng.IntN(fsxMaxLen + 1)
	if x.rng.IntN(2) == 0 {
		size = x.rng.IntN(len(x.model) + 1) // shrink more often than not
	}
	x.note("ftruncate %d (size %d)", size, len(x.model))
	if err := x.f.Truncate(int64(size)); err != nil {
		x.t.Errorf("ftruncate %d: %v", size, err)
		return
	}
	if size < len(x.model) {
		x.model = x.model[:size]
	} else {
		x.grow(size)
	}
}

func (x *fsx) fsync() {
	x.note("fsync")
	if err := x.f.Sync(); err != nil {
		x.t.Errorf("fsync: %v", err)
	}
}

// reopen closes the file, checks its size and content through the other
// mount (close-to-open: everything written before close is in the store)
// and through this one, and opens it again.
func (x *fsx) reopen() {
	x.note("close, check, open")
	if err := x.f.Close(); err != nil {
		x.t.Errorf("close: %v", err)
	}
	x.closes++
	for _, mnt := range []string{x.other, x.mnt} {
		got, err := os.ReadFile(join(mnt, "fsx.dat"))
		if err != nil {
			x.t.Errorf("read whole file after close: %v", err)
			continue
		}
		if len(got) != len(x.model) {
			x.t.Errorf("after close, %s reads %d bytes, want %d", mnt, len(got), len(x.model))
			continue
		}
		x.compare("after close, whole read "+mnt, 0, got)
	}
	x.open()
}
