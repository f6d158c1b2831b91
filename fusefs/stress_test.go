package fusefs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// TestConcurrentReadersWriters: writers on different files and on the
// same file (disjoint regions through separate descriptors), then readers
// in parallel, checked against the store.
func TestConcurrentReadersWriters(t *testing.T) {
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		mnt, _ := mountStore(t, s, Options{})
		const files, size = 4, 3 << 20
		want := make([][]byte, files)
		var g errgroup.Group
		for i := range files {
			want[i] = pattern(size, byte(i))
			g.Go(func() error {
				f, err := os.Create(join(mnt, fmt.Sprintf("f%d", i)))
				if err != nil {
					return err
				}
				for off := 0; off < size; off += 128 << 10 {
					if _, err := f.Write(want[i][off:min(off+128<<10, size)]); err != nil {
						return err
					}
				}
				return f.Close()
			})
		}
		// Same file: each goroutine owns a region.
		shared := pattern(size, 99)
		sf, err := os.Create(join(mnt, "shared"))
		if err != nil {
			t.Fatal(err)
		}
		sf.Close()
		const parts = 4
		for p := range parts {
			g.Go(func() error {
				f, err := os.OpenFile(join(mnt, "shared"), os.O_WRONLY, 0)
				if err != nil {
					return err
				}
				lo, hi := p*size/parts, (p+1)*size/parts
				for off := lo; off < hi; off += 64 << 10 {
					end := min(off+64<<10, hi)
					if _, err := f.WriteAt(shared[off:end], int64(off)); err != nil {
						return err
					}
				}
				return f.Close()
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		for i := range files {
			wantBlob(t, s, fmt.Sprintf("f%d", i), want[i])
		}
		wantBlob(t, s, "shared", shared)

		for r := range 8 {
			g.Go(func() error {
				i := r % files
				got, err := os.ReadFile(join(mnt, fmt.Sprintf("f%d", i)))
				if err != nil {
					return err
				}
				if !bytes.Equal(got, want[i]) {
					return fmt.Errorf("reader %d: f%d differs", r, i)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	})
}

// pageBase is random bytes that pages are cut from: generating content
// with copy() keeps multi-GiB runs fast under the race detector.
var pageBase = func() []byte {
	b := make([]byte, 4<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}()

// pageGen makes reproducible content: page i of a file written with seed s.
func pageGen(dst []byte, page int64, seed uint64) {
	start := (uint64(page)*2654435761 + seed*40503) % uint64(len(pageBase)-len(dst))
	copy(dst, pageBase[start:])
	binary.LittleEndian.PutUint64(dst, uint64(page))
	binary.LittleEndian.PutUint64(dst[8:], seed)
}

// integrityRun writes size bytes sequentially, overwrites random pages
// through a second open, and checks the content through the mount and in the
// store, page by page, without holding the file in memory.
func integrityRun(t *testing.T, mnt string, s blobstore.Store, name string, size int64) {
	const page = 64 << 10
	pages := size / page
	seeds := map[int64]uint64{}
	buf := make([]byte, page)
	start := time.Now()
	phase := func(what string) {
		t.Logf("%s (%d MiB): %s took %v", name, size>>20, what, time.Since(start))
		start = time.Now()
	}

	f, err := os.Create(join(mnt, name))
	if err != nil {
		t.Fatal(err)
	}
	for p := range pages {
		pageGen(buf, p, 1)
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	phase("sequential write until durable")
	// Random overwrites: read-modify-write of the stored blob.
	f, err = os.OpenFile(join(mnt, name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(42, uint64(size)))
	for range 64 {
		p := rng.Int64N(pages)
		seeds[p] = 2 + rng.Uint64N(1000)
		pageGen(buf, p, seeds[p])
		if _, err := f.WriteAt(buf, p*page); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	phase("random overwrites until durable")

	expect := func(p int64) []byte {
		seed, ok := seeds[p]
		if !ok {
			seed = 1
		}
		w := make([]byte, page)
		pageGen(w, p, seed)
		return w
	}
	// Through the mount.
	f, err = os.Open(join(mnt, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for p := range pages {
		if _, err := io.ReadFull(f, buf); err != nil {
			t.Fatalf("read page %d: %v", p, err)
		}
		if !bytes.Equal(buf, expect(p)) {
			t.Fatalf("mount: page %d differs", p)
		}
	}
	phase("read back through the mount")
	// In the store, through its own client.
	ctx := context.Background()
	a, err := s.Stat(ctx, name)
	if err != nil || a.Size != size {
		t.Fatalf("stored size %d, want %d (%v)", a.Size, size, err)
	}
	for p := range pages {
		n, err := s.ReadAt(ctx, name, buf, p*page, "")
		if n != page || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("store read page %d: %d %v", p, n, err)
		}
		if !bytes.Equal(buf, expect(p)) {
			t.Fatalf("store: page %d differs", p)
		}
	}
	phase("read back from the store")
}

// TestIntegrityLargeFiles uses files larger than a read block, an upload
// block and the whole block cache.
func TestIntegrityLargeFiles(t *testing.T) {
	small := Options{BlockCacheBytes: 8 << 20, ReadBlockSize: 1 << 20, UploadBlockSize: 1 << 20}
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s := b.New(t)
			opts := small
			size := int64(64 << 20)
			switch b.Name {
			case "local":
				size = 3 << 30 // several GiB
				if testing.Short() || raceDetector {
					size = 256 << 20
				}
				// Default-sized upload blocks: thousands of 1 MiB
				// blocks, each fsynced, only make the run slow.
				opts.UploadBlockSize = 0
			case "azurite":
				size = 256 << 20
			case "faulty":
				size = 32 << 20
			}
			mnt, _ := mountStore(t, s, opts)
			integrityRun(t, mnt, s, "big.bin", size)
		})
	}
}

// TestUploadFailureReachesClose: a failing store makes close and fsync
// report EIO; the data stays, and lands once the store recovers.
func TestUploadFailureReachesClose(t *testing.T) {
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	mnt, _ := mountStore(t, faulty, Options{UploadBlockSize: 1 << 20})
	fail := func() {
		for _, op := range []blobstore.Op{blobstore.OpPut, blobstore.OpStageBlock, blobstore.OpCommitBlocks} {
			faulty.FailNext(op, 1_000_000, fmt.Errorf("injected: %w", blobstore.ErrTransient))
		}
	}
	data := pattern(3<<20, 7)

	// fsync sees the error and, once the store is back, succeeds on the
	// same descriptor.
	f, err := os.Create(join(mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	fail()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, f.Sync(), syscall.EIO)
	faulty.ClearFaults()
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after recovery: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, faulty, "a", data)

	// close sees the error; the data is retried in the background.
	fail()
	f, err = os.Create(join(mnt, "b"))
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	wantErrno(t, f.Close(), syscall.EIO)
	if got := mustRead(t, join(mnt, "b")); !bytes.Equal(got, data) {
		t.Fatal("data not readable through the mount while its upload is failing")
	}
	faulty.ClearFaults()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, err := faulty.Stat(context.Background(), "b")
		if err == nil && a.Size == int64(len(data)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("data never landed after the store recovered: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantBlob(t, faulty, "b", data)
}

// TestReadFailure: a read the store cannot serve is EIO, and the next one,
// after recovery, succeeds.
func TestReadFailure(t *testing.T) {
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	data := pattern(1<<20, 3)
	putBlob(t, faulty, "r", data, nil)
	mnt, _ := mountStore(t, faulty, Options{})
	f, err := os.Open(join(mnt, "r"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	faulty.FailNext(blobstore.OpReadAt, 1_000_000, fmt.Errorf("injected: %w", blobstore.ErrTransient))
	_, err = f.ReadAt(make([]byte, 4096), 0)
	wantErrno(t, err, syscall.EIO)
	faulty.ClearFaults()
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read after recovery differs")
	}
}

// TestListingCostsNoRequestPerEntry: `ls -l` of 10,000 entries is a handful
// of list requests, not one stat per entry.
func TestListingCostsNoRequestPerEntry(t *testing.T) {
	mem := blobstore.NewMemory()
	ctx := context.Background()
	for i := range 10_000 {
		if _, err := mem.Put(ctx, fmt.Sprintf("d/f%05d", i), []byte("x"), blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mnt, _ := mountStore(t, mem, Options{AttrTimeout: time.Minute, EntryTimeout: time.Minute, ListTimeout: time.Minute})
	before := mem.Requests()
	entries, err := os.ReadDir(join(mnt, "d"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		st, err := os.Lstat(join(mnt, "d", e.Name()))
		if err != nil || st.Size() != 1 {
			t.Fatalf("%s: %v %v", e.Name(), st, err)
		}
	}
	after := mem.Requests()
	total := int64(0)
	for op, n := range after {
		total += n - before[op]
	}
	if len(entries) != 10_000 {
		t.Fatalf("%d entries", len(entries))
	}
	if total > 10 {
		t.Fatalf("ls -l of 10,000 entries cost %d store requests (%v -> %v)", total, before, after)
	}
}

// TestHugeDirectory lists 100,000 entries, across many listing pages.
func TestHugeDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	mem := blobstore.NewMemory()
	ctx := context.Background()
	h := sha256.New()
	for i := range 100_000 {
		name := fmt.Sprintf("f%06d", i)
		h.Write([]byte(name))
		if _, err := mem.Put(ctx, "huge/"+name, nil, blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mnt, _ := mountStore(t, mem, Options{})
	entries, err := os.ReadDir(join(mnt, "huge"))
	if err != nil {
		t.Fatal(err)
	}
	g := sha256.New()
	for _, e := range entries {
		g.Write([]byte(e.Name()))
	}
	if len(entries) != 100_000 || !bytes.Equal(h.Sum(nil), g.Sum(nil)) {
		t.Fatalf("listed %d entries (or in the wrong order)", len(entries))
	}
}

// TestSequentialWriteStreamsBlocks: full blocks go up while the file is
// still being written; a later write into a block already sent falls back
// to uploading the whole file, and both land intact.
func TestSequentialWriteStreamsBlocks(t *testing.T) {
	mem := blobstore.NewMemory()
	mnt, _ := mountStore(t, mem, Options{UploadBlockSize: 1 << 20})
	data := pattern(5<<20+123, 5)

	f, err := os.Create(join(mnt, "stream"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for mem.Requests()[blobstore.OpStageBlock] < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("no blocks staged while writing: %v", mem.Requests())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, mem, "stream", data)

	f, err = os.Create(join(mnt, "rewound"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("REWRITE"), 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), data...)
	copy(want[100:], "REWRITE")
	wantBlob(t, mem, "rewound", want)
}

// TestKernelReadAheadRaised: the mount's read-ahead is raised so that the
// kernel sends large READs several at a time.
func TestKernelReadAheadRaised(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mnt, _ := mountStore(t, blobstore.NewMemory(), Options{})
	var st syscall.Stat_t
	if err := syscall.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	major, minor := (st.Dev>>8)&0xfff, (st.Dev&0xff)|((st.Dev>>12)&0xfff00)
	b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", major, minor))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(bytes.TrimSpace(b)); got != "4096" {
		t.Fatalf("read_ahead_kb = %s, want 4096", got)
	}
}

// TestOpenByNameInSmallDirectory: opening many files of a small directory
// by name costs one listing, not a probe per name: a probe (Stat + List)
// of d, one of the first name, then the listing of d answers the rest.
func TestOpenByNameInSmallDirectory(t *testing.T) {
	mem := blobstore.NewMemory()
	for i := range 200 {
		putBlob(t, mem, fmt.Sprintf("d/f%03d", i), []byte(fmt.Sprint(i)), nil)
	}
	mnt, _ := mountStore(t, mem, Options{ListTimeout: time.Minute, AttrTimeout: time.Minute, EntryTimeout: time.Minute})
	before := mem.Requests()
	for i := range 200 {
		if got := mustRead(t, join(mnt, "d", fmt.Sprintf("f%03d", i))); string(got) != fmt.Sprint(i) {
			t.Fatalf("f%03d: %q", i, got)
		}
	}
	after := mem.Requests()
	if meta := metadataRequests(before, after); meta > 5 {
		t.Fatalf("200 opens by name cost %d stat/list requests: %v -> %v", meta, before, after)
	}
	if reads := after[blobstore.OpReadAt] - before[blobstore.OpReadAt]; reads != 200 {
		t.Fatalf("200 small reads cost %d GETs", reads)
	}
}

// A directory whose own listing is fresh is known to exist: when its
// binding expires, looking it up again asks the store nothing. It was
// probed each time (a Stat and a List) while its files were answered from
// its listing: a directory read file by file, in a parent nobody lists,
// cost two requests per ListTimeout.
func TestLookupOfListedDirectoryAsksNothing(t *testing.T) {
	mem := blobstore.NewMemory()
	for i := range 20 {
		putBlob(t, mem, fmt.Sprintf("d/f%02d", i), []byte(fmt.Sprint(i)), nil)
	}
	const short = 50 * time.Millisecond
	dirAsks := &dirProbes{Store: mem, dir: "d"}
	mnt, fsys := mountStore(t, dirAsks, Options{ListTimeout: time.Minute, AttrTimeout: short, EntryTimeout: short, NegativeTimeout: short})
	dir := join(mnt, "d")
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 20 {
		t.Fatalf("readdir: %d entries, %v", len(ents), err)
	}
	for round := range 3 {
		time.Sleep(2 * short) // d's binding expires, d's listing does not
		// As if the root were never listed: its lookups were rarer
		// than one per ListTimeout (secondMiss).
		fsys.lists.Invalidate("")
		fsys.lists.ForgetMisses()
		before := dirAsks.count.Load()
		if got := mustRead(t, join(dir, fmt.Sprintf("f%02d", round))); string(got) != fmt.Sprint(round) {
			t.Fatalf("f%02d: %q", round, got)
		}
		// Only requests about d count: the file's own Stat at open
		// comes whenever its attributes expired (50 ms), which a
		// loaded machine may take between the lookup and the open.
		if asked := dirAsks.count.Load() - before; asked != 0 {
			t.Fatalf("round %d: reading a file of a listed directory asked the store %d times about the directory", round, asked)
		}
	}
	// A name with no listing of its own is still probed.
	if _, err := os.Stat(join(mnt, "nothere")); !os.IsNotExist(err) {
		t.Fatalf("stat of a name not in the store: %v", err)
	}
}

// metadataRequests counts the Stat and List requests between two
// snapshots of Memory.Requests.
// dirProbes counts the requests that ask about directory dir itself: a
// Stat of it or a listing of its names.
type dirProbes struct {
	blobstore.Store
	dir   string
	count atomic.Int64
}

func (s *dirProbes) Stat(ctx context.Context, name string) (blobstore.Attrs, error) {
	if name == s.dir {
		s.count.Add(1)
	}
	return s.Store.Stat(ctx, name)
}

func (s *dirProbes) List(ctx context.Context, opts blobstore.ListOptions) (blobstore.ListPage, error) {
	if opts.Prefix == s.dir+"/" {
		s.count.Add(1)
	}
	return s.Store.List(ctx, opts)
}

func metadataRequests(before, after map[blobstore.Op]int64) int64 {
	return after[blobstore.OpStat] + after[blobstore.OpList] - before[blobstore.OpStat] - before[blobstore.OpList]
}

// TestProbeOfDirectoryListsIt: looking up a directory not listed in its
// parent fetches, in the probe's own listing request, the directory whole
// when it fits a page, so that `ls -l` of it and the lookups of its names
// cost no further request. A directory larger than a page is remembered,
// and its next probe asks for one name only.
func TestProbeOfDirectoryListsIt(t *testing.T) {
	mem := blobstore.NewMemory()
	for i := range 50 {
		putBlob(t, mem, fmt.Sprintf("small/f%02d", i), []byte(fmt.Sprint(i)), nil)
	}
	for i := range smallDirPage + 1 {
		putBlob(t, mem, fmt.Sprintf("big/f%05d", i), nil, nil)
	}
	mnt, fsys := mountStore(t, mem, Options{ListTimeout: time.Minute})

	before := mem.Requests()
	ents, err := os.ReadDir(join(mnt, "small"))
	if err != nil || len(ents) != 50 {
		t.Fatalf("readdir small: %d entries, %v", len(ents), err)
	}
	for _, e := range ents {
		if fi, err := os.Lstat(join(mnt, "small", e.Name())); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("lstat %s: %v", e.Name(), err)
		}
	}
	if _, err := os.Stat(join(mnt, "small", "nothere")); !os.IsNotExist(err) {
		t.Fatalf("stat of a name not in small: %v, want ENOENT", err)
	}
	after := mem.Requests()
	// The probe of "small": one Stat and one List; nothing after it.
	if meta := metadataRequests(before, after); meta != 2 {
		t.Fatalf("ls -l of a directory of 50 names cost %d stat/list requests, want the probe's 2: %v -> %v", meta, before, after)
	}

	// As if this were the first lookup in the root (secondMiss).
	fsys.lists.ForgetMisses()
	if _, err := os.Stat(join(mnt, "big")); err != nil {
		t.Fatalf("stat big: %v", err)
	}
	if !fsys.lists.IsLarge("big") {
		t.Fatal("a directory larger than a page was not remembered as large")
	}
	// Its first page is kept as a partial listing: it answers for its
	// names, and not for the one past it.
	if _, found, ok := fsys.lists.Lookup("big", "f00000"); !ok || !found {
		t.Fatal("the first page of a large directory does not answer for its names")
	}
	if _, _, ok := fsys.lists.Lookup("big", fmt.Sprintf("f%05d", smallDirPage)); ok {
		t.Fatal("the first page of a large directory was cached as its whole listing")
	}
}
