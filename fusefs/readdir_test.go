package fusefs

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/listing"
)

// pagedStore lists in pages of at most page names (0: as the store does),
// each List taking delay more: a store with small pages, slow if asked. It
// counts the List requests.
type pagedStore struct {
	blobstore.Store
	page  int
	delay time.Duration
	lists atomic.Int64
}

func (s *pagedStore) List(ctx context.Context, opts blobstore.ListOptions) (blobstore.ListPage, error) {
	s.lists.Add(1)
	if s.page > 0 && (opts.MaxResults == 0 || opts.MaxResults > s.page) {
		opts.MaxResults = s.page
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return blobstore.ListPage{}, ctx.Err()
		}
	}
	return s.Store.List(ctx, opts)
}

// dent is one entry of a getdents64 reply.
type dent struct {
	name string
	off  int64
	typ  uint8
}

// getdents makes one getdents64 call with a buffer of size bytes.
func getdents(t testing.TB, fd, size int) []dent {
	t.Helper()
	d, err := getdentsErr(fd, size)
	if err != nil {
		t.Fatalf("getdents: %v", err)
	}
	return d
}

func getdentsErr(fd, size int) ([]dent, error) {
	buf := make([]byte, size)
	n, err := unix.Getdents(fd, buf)
	if err != nil {
		return nil, err
	}
	var out []dent
	for b := buf[:n]; len(b) > 0; {
		reclen := int(binary.LittleEndian.Uint16(b[16:18]))
		name := b[19:reclen]
		if i := slices.Index(name, 0); i >= 0 {
			name = name[:i]
		}
		out = append(out, dent{name: string(name), off: int64(binary.LittleEndian.Uint64(b[8:16])), typ: b[18]})
		b = b[reclen:]
	}
	return out, nil
}

// readToEnd calls getdents with size-byte buffers until it returns nothing.
func readToEnd(t testing.TB, fd, size int) []dent {
	t.Helper()
	var all []dent
	for {
		d := getdents(t, fd, size)
		if len(d) == 0 {
			return all
		}
		all = append(all, d...)
	}
}

func openDir(t testing.TB, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func seekDir(t testing.TB, fd int, off int64) {
	t.Helper()
	if _, err := unix.Seek(fd, off, io.SeekStart); err != nil {
		t.Fatalf("seekdir %d: %v", off, err)
	}
}

func tellDir(t testing.TB, fd int) int64 {
	t.Helper()
	off, err := unix.Seek(fd, 0, io.SeekCurrent)
	if err != nil {
		t.Fatalf("telldir: %v", err)
	}
	return off
}

func names(ds []dent) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.name
	}
	return out
}

// readdirDir is the directory the readdir cases list: files, and every
// kind of entry the layout has, some of them both a blob and a prefix, so
// that small pages split them.
type readdirDir struct {
	// kinds maps every name to its d_type.
	kinds map[string]uint8
}

const readdirFiles = 40

// fillReaddirDir writes the directory dir into s.
func fillReaddirDir(t testing.TB, s blobstore.Store, dir string) readdirDir {
	t.Helper()
	type blob struct {
		name string
		data string
		md   map[string]string
	}
	marker := map[string]string{blobstore.MetaIsFolder: "true"}
	blobs := []blob{
		{name: "sub", md: map[string]string{blobstore.MetaIsFolder: "true", blobstore.MetaMode: "40700"}}, // a marker with children
		{name: "sub/x"},
		{name: "implicit/y"},                          // a prefix alone
		{name: "empty", md: marker},                   // a marker alone
		{name: "a", data: "file and dir"},             // a blob and a prefix: a directory
		{name: "a-b"}, {name: "a.txt"}, {name: "a/z"}, // names between "a" and "a/"
		{name: "link", data: "f000", md: map[string]string{blobstore.MetaIsSymlink: "true"}},
		{name: "private", data: "p", md: map[string]string{blobstore.MetaMode: "100600"}},
	}
	kinds := map[string]uint8{"sub": unix.DT_DIR, "implicit": unix.DT_DIR, "empty": unix.DT_DIR, "a": unix.DT_DIR,
		"a-b": unix.DT_REG, "a.txt": unix.DT_REG, "link": unix.DT_LNK, "private": unix.DT_REG}
	for i := range readdirFiles {
		name := fmt.Sprintf("f%03d", i)
		blobs = append(blobs, blob{name: name, data: name})
		kinds[name] = unix.DT_REG
	}
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(16)
	for _, b := range blobs {
		g.Go(func() error {
			_, err := s.Put(ctx, dir+"/"+b.name, []byte(b.data), blobstore.PutOptions{Metadata: b.md})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	return readdirDir{kinds: kinds}
}

// checkOnce checks that a pass showed ".", ".." and every name of d
// exactly once, with its type, except the names in changed (created or
// removed during the pass), which may show at most once.
func (d readdirDir) checkOnce(t testing.TB, got []dent, changed map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, e := range got {
		seen[e.name]++
		if k, ok := d.kinds[e.name]; ok && e.typ != k {
			t.Errorf("%q: d_type %d, want %d", e.name, e.typ, k)
		}
	}
	for name, n := range seen {
		_, known := d.kinds[name]
		switch {
		case n > 1:
			t.Errorf("%q listed %d times in one pass", name, n)
		case !known && !changed[name] && name != "." && name != "..":
			t.Errorf("%q listed, but no such name", name)
		}
	}
	for name := range d.kinds {
		if seen[name] == 0 && !changed[name] {
			t.Errorf("%q missing from the pass", name)
		}
	}
	if seen["."] != 1 || seen[".."] != 1 {
		t.Errorf(`"." and ".." listed %d and %d times`, seen["."], seen[".."])
	}
	if t.Failed() {
		t.Logf("pass: %v", names(got))
	}
}

// readdirCase is one readdir behaviour, checked through a fresh mount
// whose store lists in small pages.
type readdirCase func(t *testing.T, mnt, dir string, d readdirDir, s blobstore.Store)

var readdirCases = []struct {
	name string
	run  readdirCase
}{
	{"WholePass", readdirWholePass},
	{"OneEntryAtATime", readdirOneEntryAtATime},
	{"ResumeAfterPause", readdirResumeAfterPause},
	{"SeekToTelldir", readdirSeekToTelldir},
	{"Rewind", readdirRewind},
	{"RewindMidPass", readdirRewindMidPass},
	{"TwoPassesInterleaved", readdirTwoPassesInterleaved},
	{"ChangesDuringWalk", readdirChangesDuringWalk},
	{"AttributesFromListing", readdirAttributesFromListing},
}

// TestReaddir runs the readdir cases on every backend, with pages of one
// name (every blob and its prefix in pages of their own) and of a few,
// all smaller than what one READDIRPLUS holds.
func TestReaddir(t *testing.T) {
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		for _, page := range []int{1, 7} {
			for i, c := range readdirCases {
				t.Run(fmt.Sprintf("%s/page%d", c.name, page), func(t *testing.T) {
					dir := fmt.Sprintf("p%d-c%d", page, i)
					d := fillReaddirDir(t, s, dir)
					mnt, _ := mountStore(t, &pagedStore{Store: s, page: page}, Options{ListTimeout: 200 * time.Millisecond})
					c.run(t, mnt, dir, d, s)
				})
			}
		}
	})
}

func readdirWholePass(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	got := readToEnd(t, fd, 4096)
	d.checkOnce(t, got, nil)
	for i, e := range got {
		if e.off != int64(i+1) {
			t.Fatalf("entry %d (%q): d_off %d, want %d", i, e.name, e.off, i+1)
		}
	}
}

func readdirOneEntryAtATime(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	var got []dent
	for {
		// Room for one entry of these names, not two.
		e := getdents(t, fd, 40)
		if len(e) > 1 {
			t.Fatalf("%d entries in 40 bytes", len(e))
		}
		if len(e) == 0 {
			break
		}
		got = append(got, e...)
	}
	d.checkOnce(t, got, nil)
}

func readdirResumeAfterPause(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	got := getdents(t, fd, 200)
	got = append(got, getdents(t, fd, 200)...)
	// Past the listing cache's timeout (200 ms) and the kernel's.
	time.Sleep(1500 * time.Millisecond)
	got = append(got, readToEnd(t, fd, 200)...)
	d.checkOnce(t, got, nil)
}

func readdirSeekToTelldir(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	// marks[i] is telldir after the first read entries.
	var all []dent
	marks := map[int]int64{0: 0}
	for {
		e := getdents(t, fd, 300)
		if len(e) == 0 {
			break
		}
		all = append(all, e...)
		marks[len(all)] = tellDir(t, fd)
		if marks[len(all)] != all[len(all)-1].off {
			t.Fatalf("telldir after %q = %d, want its d_off %d", all[len(all)-1].name, marks[len(all)], all[len(all)-1].off)
		}
	}
	d.checkOnce(t, all, nil)
	// Back to each offset telldir gave, and to each d_off: the same
	// entries follow, to the end. (Offset 0 starts a new pass, whose
	// order may differ.)
	delete(marks, 0)
	for read, mark := range marks {
		seekDir(t, fd, mark)
		if rest := names(readToEnd(t, fd, 300)); !slices.Equal(rest, names(all[read:])) {
			t.Fatalf("after seekdir(%d): %v, first time %v", mark, rest, names(all[read:]))
		}
	}
	for i := len(all) - 1; i >= 0; i -= 7 {
		seekDir(t, fd, all[i].off)
		if rest := names(readToEnd(t, fd, 300)); !slices.Equal(rest, names(all[i+1:])) {
			t.Fatalf("after seekdir(%d): %v, first time %v", all[i].off, rest, names(all[i+1:]))
		}
	}
}

func readdirRewind(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	once := readToEnd(t, fd, 1024)
	d.checkOnce(t, once, nil)
	seekDir(t, fd, 0)
	again := readToEnd(t, fd, 1024)
	d.checkOnce(t, again, nil)
	time.Sleep(300 * time.Millisecond) // past the listing's timeout: listed anew
	seekDir(t, fd, 0)
	d.checkOnce(t, readToEnd(t, fd, 1024), nil)
}

func readdirRewindMidPass(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	getdents(t, fd, 300)
	getdents(t, fd, 300)
	seekDir(t, fd, 0)
	d.checkOnce(t, readToEnd(t, fd, 300), nil)
}

func readdirTwoPassesInterleaved(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd1 := openDir(t, join(mnt, dir))
	fd2 := openDir(t, join(mnt, dir))
	var got1, got2 []dent
	for done1, done2 := false, false; !done1 || !done2; {
		if !done1 {
			e := getdents(t, fd1, 200)
			got1, done1 = append(got1, e...), len(e) == 0
		}
		if !done2 {
			e := getdents(t, fd2, 500)
			got2, done2 = append(got2, e...), len(e) == 0
		}
	}
	d.checkOnce(t, got1, nil)
	d.checkOnce(t, got2, nil)
}

// readdirChangesDuringWalk: names created and removed during a walk, by
// this mount and by another writer, before and after the walk's position,
// show at most once; every other name exactly once.
func readdirChangesDuringWalk(t *testing.T, mnt, dir string, d readdirDir, s blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	var got []dent
	for len(got) < 15 {
		got = append(got, getdents(t, fd, 200)...)
	}
	seen := map[string]bool{}
	for _, e := range got {
		seen[e.name] = true
	}
	changed := map[string]bool{}
	// This mount: new names before and after the position, and removals
	// of names already shown and not yet shown.
	for _, name := range []string{"0-new", "f0105", "zz-new"} {
		mustWrite(t, join(mnt, dir, name), []byte(name))
		changed[name] = true
	}
	for _, name := range []string{"f003", "f030", "f031"} {
		if err := os.Remove(join(mnt, dir, name)); err != nil {
			t.Fatal(err)
		}
		changed[name] = true
	}
	if err := os.Mkdir(join(mnt, dir, "zz-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed["zz-dir"] = true
	// Another writer, behind the mount's back.
	ctx := context.Background()
	for _, name := range []string{"0-other", "f0205", "zz-other"} {
		putBlob(t, s, dir+"/"+name, []byte(name), nil)
		changed[name] = true
	}
	for _, name := range []string{"f004", "f035"} {
		if err := s.Delete(ctx, dir+"/"+name, blobstore.Conditions{}); err != nil {
			t.Fatal(err)
		}
		changed[name] = true
	}
	got = append(got, readToEnd(t, fd, 200)...)
	d.checkOnce(t, got, changed)

	// A new pass sees this mount's changes.
	seekDir(t, fd, 0)
	again := map[string]bool{}
	for _, e := range readToEnd(t, fd, 4096) {
		again[e.name] = true
	}
	for _, name := range []string{"0-new", "f0105", "zz-new", "zz-dir"} {
		if !again[name] {
			t.Errorf("%q, created through the mount, missing from the next pass", name)
		}
	}
	for _, name := range []string{"f003", "f030", "f031"} {
		if again[name] {
			t.Errorf("%q, removed through the mount, still in the next pass", name)
		}
	}
}

// readdirAttributesFromListing: what a pass shows through stat, type and
// mode from metadata included, while the pass goes on and after.
func readdirAttributesFromListing(t *testing.T, mnt, dir string, d readdirDir, _ blobstore.Store) {
	fd := openDir(t, join(mnt, dir))
	check := func(name string) {
		st, err := os.Lstat(join(mnt, dir, name))
		if err != nil {
			t.Fatalf("lstat %q: %v", name, err)
		}
		want := map[uint8]os.FileMode{unix.DT_DIR: os.ModeDir, unix.DT_REG: 0, unix.DT_LNK: os.ModeSymlink}[d.kinds[name]]
		if st.Mode().Type() != want {
			t.Errorf("%q: type %v, want %v", name, st.Mode().Type(), want)
		}
		switch name {
		case "private":
			if st.Mode().Perm() != 0o600 {
				t.Errorf("private: mode %v, want 0600 from its metadata", st.Mode())
			}
		case "sub":
			if st.Mode().Perm() != 0o700 {
				t.Errorf("sub: mode %v, want 0700 from its marker", st.Mode())
			}
		case "f007":
			if st.Size() != 4 {
				t.Errorf("f007: size %d, want 4", st.Size())
			}
		}
	}
	for {
		e := getdents(t, fd, 300)
		if len(e) == 0 {
			break
		}
		for _, de := range e {
			if de.name != "." && de.name != ".." {
				check(de.name)
			}
		}
	}
	for name := range d.kinds {
		check(name)
	}
	if target, err := os.Readlink(join(mnt, dir, "link")); err != nil || target != "f000" {
		t.Fatalf("readlink: %q %v", target, err)
	}
}

// TestReaddirFirstEntryBeforeWholeListing: a directory of 20 pages, each
// taking 100 ms to list, returns its first entries after about one page,
// not after all of them: at once when the lookup of the directory just
// fetched its first page (`ls` on a fresh mount), and after one page's
// delay when a pass starts from the top (rewinddir once the listing has
// expired).
func TestReaddirFirstEntryBeforeWholeListing(t *testing.T) {
	const pages, perPage, delay = 20, 50, 100 * time.Millisecond
	mem := blobstore.NewMemory()
	for i := range pages * perPage {
		putBlob(t, mem, fmt.Sprintf("d/f%05d", i), nil, nil)
	}
	slow := &pagedStore{Store: mem, page: perPage, delay: delay}
	mnt, _ := mountStore(t, slow, Options{ListTimeout: 200 * time.Millisecond})

	start := time.Now()
	fd := openDir(t, join(mnt, "d")) // the lookup lists the first page
	for _, from := range []string{"open", "rewinddir"} {
		first := getdents(t, fd, 32<<10)
		firstTook := time.Since(start)
		rest := readToEnd(t, fd, 32<<10)
		allTook := time.Since(start)
		if n := len(first) + len(rest); n != pages*perPage+2 {
			t.Fatalf("from %s: %d entries, want %d", from, n, pages*perPage+2)
		}
		t.Logf("from %s: first getdents (%d entries) after %v; all after %v", from, len(first), firstTook, allTook)
		if allTook < pages*delay {
			t.Fatalf("from %s: all entries after %v: the store's delay (%v a page) was not applied", from, allTook, delay)
		}
		if firstTook > 4*delay {
			t.Fatalf("from %s: first getdents after %v, want about one page's delay (%v); all took %v", from, firstTook, delay, allTook)
		}
		time.Sleep(300 * time.Millisecond) // the listing expires
		seekDir(t, fd, 0)
		start = time.Now()
	}
}

// TestReaddirLookupsCostNoRequest: stat of every name a pass shows, while
// the pass goes on and after it, once the attributes READDIRPLUS gave are
// stale, and of names the pass has gone past that do not exist, costs no
// store request beyond the listing's pages: the listing answers. The
// kernel keeps no names (every stat is a LOOKUP).
func TestReaddirLookupsCostNoRequest(t *testing.T) {
	const files, perPage, attrTimeout = 300, 20, 200 * time.Millisecond
	mem := blobstore.NewMemory()
	for i := range files {
		putBlob(t, mem, fmt.Sprintf("d/f%05d", i), []byte("xy"), map[string]string{blobstore.MetaMode: "100640"})
	}
	paged := &pagedStore{Store: mem, page: perPage}
	mnt, _ := mountStore(t, paged, Options{AttrTimeout: attrTimeout, EntryTimeout: -1, NegativeTimeout: -1, ListTimeout: time.Minute})
	fd := openDir(t, join(mnt, "d"))
	before := mem.Requests()

	stat := func(name string) {
		st, err := os.Lstat(join(mnt, "d", name))
		if err != nil || st.Size() != 2 || st.Mode().Perm() != 0o640 {
			t.Fatalf("lstat %q: %v %v", name, st, err)
		}
	}
	var shown []string
	for {
		e := getdents(t, fd, 4096)
		if len(e) == 0 {
			break
		}
		time.Sleep(attrTimeout + 50*time.Millisecond)
		for _, de := range e {
			if de.name == "." || de.name == ".." {
				continue
			}
			shown = append(shown, de.name)
			stat(de.name)
			// A name the listing has gone past, and not there.
			if _, err := os.Lstat(join(mnt, "d", de.name+"x")); !os.IsNotExist(err) {
				t.Fatalf("lstat of a missing name: %v", err)
			}
		}
	}
	if len(shown) != files {
		t.Fatalf("%d names shown, want %d", len(shown), files)
	}
	time.Sleep(attrTimeout + 50*time.Millisecond)
	for _, name := range shown {
		stat(name)
	}
	after := mem.Requests()
	lists := after[blobstore.OpList] - before[blobstore.OpList]
	others := int64(0)
	for op, n := range after {
		if op != blobstore.OpList {
			others += n - before[op]
		}
	}
	// The pass's pages (the first and the last may be short), and nothing
	// per name.
	if maxLists := int64(files/perPage + 2); lists > maxLists || others > 0 {
		t.Fatalf("stat of %d names during and after a pass cost %d List requests (want at most %d) and %d others (want 0): %v -> %v",
			files, lists, maxLists, others, before, after)
	}
}

// TestStatInLargeDirectoryOnFreshMount: stat of a file in a directory
// larger than a listing page, on a fresh mount, costs the probe of the
// directory (a Stat and a List), which also answers for the names of its
// first page.
func TestStatInLargeDirectoryOnFreshMount(t *testing.T) {
	mem := blobstore.NewMemory()
	ctx := context.Background()
	for i := range 2*listing.FullPage + 10 {
		if _, err := mem.Put(ctx, fmt.Sprintf("d/f%05d", i), []byte("x"), blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name     string
		requests int64
	}{
		{"f00010", 2},         // in the first page
		{"f00010-missing", 2}, // before the first page's end: known absent
		{"f09000", 4},         // past it: probed itself
	} {
		t.Run(c.name, func(t *testing.T) {
			mnt, _ := mountStore(t, mem, Options{})
			before := mem.Requests()
			_, err := os.Stat(join(mnt, "d", c.name))
			if strings.HasSuffix(c.name, "-missing") != os.IsNotExist(err) {
				t.Fatalf("stat: %v", err)
			}
			after := mem.Requests()
			total := int64(0)
			for op, n := range after {
				total += n - before[op]
			}
			if total != c.requests {
				t.Fatalf("stat cost %d requests, want %d: %v -> %v", total, c.requests, before, after)
			}
		})
	}
}

// TestListingOutlivesSlowPass: a pass that takes longer than the listing
// cache's timeout (a slow store, a reader that pauses) keeps its listing
// for the lookups it answers; a second listing right after the pass ended
// comes from the cache, without a request.
func TestListingOutlivesSlowPass(t *testing.T) {
	const files, perPage, ttl = 400, 40, 300 * time.Millisecond
	mem := blobstore.NewMemory()
	for i := range files {
		putBlob(t, mem, fmt.Sprintf("d/f%05d", i), nil, nil)
	}
	slow := &pagedStore{Store: mem, page: perPage, delay: 50 * time.Millisecond}
	mnt, _ := mountStore(t, slow, Options{ListTimeout: ttl, AttrTimeout: -1, EntryTimeout: -1})
	fd := openDir(t, join(mnt, "d"))
	start := time.Now()
	first := getdents(t, fd, 1024)
	n := len(first)
	for {
		time.Sleep(ttl / 3) // a reader slower than the listing
		e := getdents(t, fd, 1024)
		if len(e) == 0 {
			break
		}
		n += len(e)
	}
	took := time.Since(start)
	if n != files+2 || took < 3*ttl {
		t.Fatalf("%d entries in %v; want %d in more than %v", n, took, files+2, 3*ttl)
	}
	// A name shown at the start, long before.
	listsBefore := slow.lists.Load()
	if _, err := os.Lstat(join(mnt, "d", "f00000")); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(join(mnt, "d"))
	if err != nil || len(entries) != files {
		t.Fatalf("second listing: %d entries, %v", len(entries), err)
	}
	if l := slow.lists.Load() - listsBefore; l != 0 {
		t.Fatalf("a lookup and a second listing right after a %v pass cost %d List requests, want 0 (the listing's timeout is %v)", took, l, ttl)
	}
}

// TestReaddirAcrossRestart: a walk through a directory of many pages goes
// on across restarts of the serving process, one of them while a
// READDIRPLUS waits for a page; a seekdir to an offset from before a
// restart still works. The directory does not change, so the restored
// handle's new pass resumes exactly.
func TestReaddirAcrossRestart(t *testing.T) {
	h := newRestartHarness(t)
	local := h.localStore()
	d := fillReaddirDir(t, local, "d")
	const env = "BLOBFS_TEST_LIST_PAGE=3 BLOBFS_TEST_LIST_DELAY=100ms"
	h.start(env)
	fd := openDir(t, join(h.mnt, "d"))
	var got []dent
	got = append(got, getdents(t, fd, 200)...)
	mark, read := tellDir(t, fd), len(got)
	got = append(got, getdents(t, fd, 200)...)

	h.kill()
	h.start(env)
	got = append(got, getdents(t, fd, 200)...)

	// Killed while a READDIRPLUS waits on the store: this process's
	// store never answers a listing (a fresh process lists from the
	// start), and says when one came.
	h.kill()
	held := join(t.TempDir(), "list")
	h.start(env + " BLOBFS_TEST_HOLD_LISTS=" + held)
	next := make(chan error, 1)
	var during []dent
	go func() {
		var err error
		during, err = getdentsErr(fd, 200)
		next <- err
	}()
	waitFor(t, "the READDIRPLUS in the server, waiting on the store", func() bool {
		_, err := os.Stat(held)
		return err == nil
	})
	h.kill()
	h.start(env)
	select {
	case err := <-next:
		if err != nil {
			t.Fatalf("getdents across a kill: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the READDIRPLUS taken by the killed server was never answered")
	}
	got = append(got, during...)
	got = append(got, readToEnd(t, fd, 200)...)
	d.checkOnce(t, got, nil)

	seekDir(t, fd, mark)
	if again := readToEnd(t, fd, 200); !slices.Equal(names(again), names(got[read:])) {
		t.Fatalf("seekdir to an offset from before the restarts: %v, first time %v", names(again), names(got[read:]))
	}
}

// TestReadDirWithoutPlus drives READDIR (which a kernel that does not
// use READDIRPLUS sends) directly, with replies of a few entries from
// pages of three names: each name once, with its type.
func TestReadDirWithoutPlus(t *testing.T) {
	mem := blobstore.NewMemory()
	d := fillReaddirDir(t, mem, "d")
	fsys, err := New(&pagedStore{Store: mem, page: 3}, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	var entry fuse.EntryOut
	if st := fsys.Lookup(nil, &fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, "d", &entry); !st.Ok() {
		t.Fatalf("lookup: %v", st)
	}
	var open fuse.OpenOut
	if st := fsys.OpenDir(nil, &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: entry.NodeId}}, &open); !st.Ok() {
		t.Fatalf("opendir: %v", st)
	}
	defer fsys.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: entry.NodeId}, Fh: open.Fh})
	var got []dent
	buf := make([]byte, 160)
	for off := uint64(0); ; {
		list := fuse.NewDirEntryList(buf, off)
		in := &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: entry.NodeId}, Fh: open.Fh, Offset: off, Size: uint32(len(buf))}
		if st := fsys.ReadDir(nil, in, list); !st.Ok() {
			t.Fatalf("readdir at %d: %v", off, st)
		}
		ents, err := fuse.ParseDirEntries(list.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) == 0 {
			break
		}
		for _, e := range ents {
			got = append(got, dent{name: e.Name, off: int64(e.Off), typ: uint8(e.Mode >> 12)})
		}
		off = ents[len(ents)-1].Off
	}
	d.checkOnce(t, got, nil)
}

// TestCreateInLargeDirectory: creating a file in a large listed directory
// costs what it costs in an empty one. The kernel asks for the directory's
// attributes after each create, and its link count (2 plus its
// subdirectories) was counted again over the whole listing after every
// change: with 100,000 names, 3.3 ms a create instead of 0.33.
func TestCreateInLargeDirectory(t *testing.T) {
	const names, rounds, perRound = 50000, 6, 25
	mem := blobstore.NewMemory()
	ctx := context.Background()
	for i := range names {
		if _, err := mem.Put(ctx, fmt.Sprintf("large/e%06d", i), nil, blobstore.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mem.Put(ctx, "small/e0", nil, blobstore.PutOptions{})
	mnt, _ := mountStore(t, mem, Options{ListTimeout: time.Hour, AttrTimeout: time.Hour})
	for _, d := range []string{"large", "small"} {
		if ents, err := os.ReadDir(join(mnt, d)); err != nil || len(ents) == 0 {
			t.Fatalf("listing %s: %d names, %v", d, len(ents), err)
		}
	}
	create := func(dir string, round int) time.Duration {
		start := time.Now()
		for i := range perRound {
			if err := os.WriteFile(join(mnt, dir, fmt.Sprintf("new-%d-%d", round, i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	// Interleaved, the best round of each: the machine's noise hits both.
	best := map[string]time.Duration{}
	for r := range rounds {
		for _, d := range []string{"large", "small"} {
			if took := create(d, r); best[d] == 0 || took < best[d] {
				best[d] = took
			}
		}
	}
	if ratio := float64(best["large"]) / float64(best["small"]); ratio > 2 {
		t.Fatalf("a create in a listed directory of %d names took %.1f× one in an empty directory (%v against %v for %d files); want about the same",
			names, ratio, best["large"], best["small"], perRound)
	}
}
