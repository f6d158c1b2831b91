package fusefs

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// walkCountingStore counts List requests by kind: by directory (with a
// delimiter) and flat (a tree walk's), and lists in small pages.
type walkCountingStore struct {
	pagedStore
	byDir, flat atomic.Int64
	mu          sync.Mutex
	listed      []string // the prefixes listed by directory
}

// dirsListed returns the directories below t listed by directory from
// the i-th such listing on, each once ("t/" itself and the probes of a
// single name left out).
func (s *walkCountingStore) dirsListed(from int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.listed[min(from, len(s.listed)):] {
		if p != "t/" && !slices.Contains(out, p) && !strings.Contains(p, ".") && !strings.Contains(p, "/f0") {
			out = append(out, p)
		}
	}
	return out
}

func (s *walkCountingStore) listings() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.listed)
}

func (s *walkCountingStore) List(ctx context.Context, opts blobstore.ListOptions) (blobstore.ListPage, error) {
	if opts.Delimiter == "" {
		s.flat.Add(1)
	} else {
		s.byDir.Add(1)
		s.mu.Lock()
		s.listed = append(s.listed, opts.Prefix)
		s.mu.Unlock()
	}
	return s.pagedStore.List(ctx, opts)
}

// fillWalkTree writes a tree below t/ with every shape a flat listing
// must turn back into directories, and returns every path below t with
// "/" after directories.
func fillWalkTree(t *testing.T, s blobstore.Store, dirs, files int) []string {
	t.Helper()
	marker := map[string]string{blobstore.MetaIsFolder: "true"}
	var blobs, markers []string
	put := func(name string, md map[string]string) {
		putBlob(t, s, name, []byte(name), md)
		blobs = append(blobs, name)
		if md != nil {
			markers = append(markers, strings.TrimPrefix(name, "t/"))
		}
	}
	put("t/a.txt", nil) // a file of the walked directory itself
	for d := range dirs {
		dir := fmt.Sprintf("t/d%02d", d)
		if d%3 == 0 {
			put(dir, marker) // a marker with children
		}
		for f := range files {
			put(fmt.Sprintf("%s/f%03d", dir, f), nil)
		}
		put(dir+"/sub/deep/x", nil) // directories only implied by a name
	}
	put("t/d01/both", nil) // a blob that is also a prefix: a directory
	put("t/d01/both/y", nil)
	put("t/d01/both-x", nil) // names between "both" and "both/"
	put("t/d01/both.txt", nil)
	put("t/d02/empty", marker) // a marker alone: an empty directory
	put("t/d02/emptz", nil)
	put("t/zz", nil) // after every directory

	// What a walk must show: every blob's path, and every directory on
	// the way, once.
	want := map[string]bool{}
	for _, b := range blobs {
		rel := strings.TrimPrefix(b, "t/")
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			want[strings.Join(parts[:i], "/")+"/"] = true
		}
		want[rel] = true
	}
	for _, m := range markers {
		if want[m] {
			delete(want, m)
			want[m+"/"] = true
		}
	}
	delete(want, "d01/both")
	var out []string
	for p := range want {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// walkTree walks dir as find does (getdents with d_type, no stat) and
// returns every path below it, with "/" after directories.
func walkTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	sort.Strings(out)
	return out
}

// TestTreeWalk: a walk of a tree through the mount shows what a walk
// directory by directory shows, and, once it has descended into the
// first subdirectory, costs flat pages of the whole tree instead of a
// listing per directory.
func TestTreeWalk(t *testing.T) {
	const dirs, files, page = 12, 20, 7
	mem := blobstore.NewMemory()
	want := fillWalkTree(t, mem, dirs, files)
	for _, c := range []struct {
		name      string
		walkAhead int
	}{{"by directory", -1}, {"tree walk", 0}} {
		t.Run(c.name, func(t *testing.T) {
			s := &walkCountingStore{pagedStore: pagedStore{Store: mem, page: page, delay: time.Millisecond}}
			mnt, _ := mountStore(t, s, Options{WalkAhead: c.walkAhead})
			got := walkTree(t, join(mnt, "t"))
			if !slices.Equal(got, want) {
				t.Fatalf("walk shows\n%v\nwant\n%v", got, want)
			}
			byDir, flat := s.byDir.Load(), s.flat.Load()
			t.Logf("%s: %d listings by directory, %d flat pages (%d names in pages of %d)", c.name, byDir, flat, len(want), page)
			if c.walkAhead < 0 {
				if flat != 0 || byDir < 2*dirs {
					t.Errorf("without walks: %d listings by directory, %d flat; want one or more per directory, none flat", byDir, flat)
				}
				return
			}
			// t's lookup and pass, its first subdirectory's (it may
			// start before the walk's first page lands), and the
			// flat pages of the tree.
			names := int64(dirs*(files+4) + 10)
			if own := s.dirsListed(0); len(own) > 1 || flat == 0 || flat > names/page+2 {
				t.Errorf("with a walk: %d flat pages (want 1 to %d), and the walker listed %q on its own (at most the first subdirectory)", flat, names/page+2, own)
			}
			// Walked again at once: everything from the cache.
			byDir, flat = s.byDir.Load(), s.flat.Load()
			if got := walkTree(t, join(mnt, "t")); !slices.Equal(got, want) {
				t.Fatalf("second walk shows\n%v\nwant\n%v", got, want)
			}
			if d, f := s.byDir.Load()-byDir, s.flat.Load()-flat; d > 2 || f > names/page+2 {
				t.Errorf("second walk: %d listings by directory, %d flat pages", d, f)
			}
		})
	}
}

// TestTreeWalkSeesOwnChanges: files created and removed, and a directory
// renamed, by this mount while a walk is listing the tree show in the
// walk's listings as they are now, whether the walk's pages listed those
// names before or after the change.
func TestTreeWalkSeesOwnChanges(t *testing.T) {
	const dirs, files = 10, 20
	mem := blobstore.NewMemory()
	fillWalkTree(t, mem, dirs, files)
	s := &walkCountingStore{pagedStore: pagedStore{Store: mem, page: 5, delay: 20 * time.Millisecond}}
	mnt, _ := mountStore(t, s, Options{ListTimeout: time.Minute})
	root := join(mnt, "t")
	if _, err := os.ReadDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(join(root, "d00")); err != nil { // the walk starts
		t.Fatal(err)
	}
	// The walk is on its way (pages of 5 names, 20 ms each): change
	// directories it has not reached yet, and one it may have.
	if err := os.WriteFile(join(root, "d07/new.txt"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(join(root, "d08/f001")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(join(root, "d09"), join(root, "d09-renamed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(join(root, "d01/f000")); err != nil {
		t.Fatal(err)
	}
	from := s.listings()
	got := walkTree(t, root)
	has := func(p string) bool { return slices.Contains(got, p) }
	for _, p := range []string{"d07/new.txt", "d09-renamed/", "d09-renamed/f000", "d09-renamed/sub/deep/x", "d08/f000"} {
		if !has(p) {
			t.Errorf("walk lacks %s", p)
		}
	}
	for _, p := range []string{"d08/f001", "d09/", "d09/f000", "d01/f000"} {
		if has(p) {
			t.Errorf("walk shows %s, removed or renamed during the walk", p)
		}
	}
	// The walk answered (the directory renamed during it may be listed
	// on its own).
	if own, flat := s.dirsListed(from), s.flat.Load(); flat == 0 || len(own) > 1 {
		t.Errorf("the walker listed %q on its own (at most the renamed directory), with %d flat pages: the walk did not answer", own, flat)
	}
	if t.Failed() {
		t.Logf("walk: %v", got)
	}
}

// TestTreeWalkStaysWithinWalkAhead: a walker that descends and then stops
// reading leaves the walk paused at WalkAhead names ahead of it; once it
// walks on, the walk goes on, and the whole tree is shown.
func TestTreeWalkStaysWithinWalkAhead(t *testing.T) {
	const dirs, files, page, ahead = 20, 20, 10, 60
	mem := blobstore.NewMemory()
	want := fillWalkTree(t, mem, dirs, files)
	s := &walkCountingStore{pagedStore: pagedStore{Store: mem, page: page}}
	mnt, fsys := mountStore(t, s, Options{WalkAhead: ahead, ListTimeout: time.Minute})
	root := join(mnt, "t")
	if _, err := os.ReadDir(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(join(root, "d00")); err != nil {
		t.Fatal(err)
	}
	// The walk pauses once it is WalkAhead names ahead (walkMayGoOn),
	// with no page on its way: what it fetched by then is all it fetches
	// while its walker stays away. A walk that never pauses lists the
	// whole tree and ends, and fails here.
	waitFor(t, "the walk to pause ahead of its walker", func() bool {
		running, paused := fsys.lists.Walks()
		return running == 1 && paused == 1
	})
	// Ahead of the walker: up to WalkAhead names in built directories,
	// plus those of the directories being built, plus one page.
	if flat, most := s.flat.Load(), int64((2*ahead+files)/page+2); flat > most {
		t.Errorf("the walk fetched %d pages while its walker paused; want at most %d", flat, most)
	}
	if got := walkTree(t, root); !slices.Equal(got, want) {
		t.Fatalf("walk shows\n%v\nwant\n%v", got, want)
	}
	if flat := s.flat.Load(); flat < int64(len(want)/page/2) {
		t.Errorf("the walk fetched only %d pages of the tree: it did not go on", flat)
	}
}

// TestTreeWalkListingsExpire: once a walk has ended, the listings it built
// expire as any other does, however busy the walker keeps them: a name
// another writer adds shows within the listing timeout of its last use.
func TestTreeWalkListingsExpire(t *testing.T) {
	const ttl = 300 * time.Millisecond
	mem := blobstore.NewMemory()
	fillWalkTree(t, mem, 6, 10)
	s := &walkCountingStore{pagedStore: pagedStore{Store: mem, page: 20}}
	mnt, _ := mountStore(t, s, Options{ListTimeout: ttl, EntryTimeout: -1, NegativeTimeout: -1, AttrTimeout: -1})
	root := join(mnt, "t")
	walkTree(t, root) // the walk lists the tree and ends
	if s.flat.Load() == 0 {
		t.Fatal("no walk")
	}
	putBlob(t, mem, "t/d04/late", []byte("x"), nil) // another writer
	deadline := time.Now().Add(ttl + 2*time.Second)
	for {
		// The walker stays busy in the walked tree.
		if _, err := os.Stat(join(root, "d04/f001")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(join(root, "d04/late")); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a name another writer added is not seen %v after, with the walk over and the listing timeout %v", ttl+2*time.Second, ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
