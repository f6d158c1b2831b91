package listing

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// fakeClock is a clock that moves only when a test says so: a listing's
// expiry is then tested at its edges, where the real clock, on a loaded
// machine, oversleeps past them.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// useFakeClock makes the caches tell the time by one new fakeClock.
func useFakeClock(caches ...*Cache) *fakeClock {
	clock := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	for _, c := range caches {
		c.now = clock.now
	}
	return clock
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestListCacheRefreshAhead: a listing in the last quarter of its life is
// claimed for a background refresh once; a fresh one is not.
func TestListCacheRefreshAhead(t *testing.T) {
	// The last quarter of a 2 s life starts at 1.5 s.
	c := NewCache(2*time.Second, 1000, 0)
	clock := useFakeClock(c)
	c.Put("d", map[string]*meta.Entry{"a": {Kind: meta.KindFile}})
	if c.ClaimRefresh("d") {
		t.Fatal("a listing just taken was claimed for refresh")
	}
	clock.advance(1499 * time.Millisecond)
	if c.ClaimRefresh("d") {
		t.Fatal("a listing was claimed for refresh before the last quarter of its life")
	}
	clock.advance(time.Millisecond)
	if !c.ClaimRefresh("d") {
		t.Fatal("a listing near its end was not claimed for refresh")
	}
	if c.ClaimRefresh("d") {
		t.Fatal("claimed for refresh twice")
	}
	c.Put("d", map[string]*meta.Entry{"a": {Kind: meta.KindFile}})
	if c.ClaimRefresh("d") {
		t.Fatal("the refreshed listing was claimed at once")
	}
	if c.ClaimRefresh("other") {
		t.Fatal("a directory with no listing was claimed")
	}
	// A directory this mount is changing is refreshed too: its changes
	// are replayed onto the listing fetched meanwhile.
	c.Put("w", map[string]*meta.Entry{})
	c.Set("w", "new", meta.Entry{Kind: meta.KindFile})
	clock.advance(1500 * time.Millisecond)
	if !c.ClaimRefresh("w") {
		t.Fatal("a directory being changed here was not claimed for refresh")
	}
}

// A listing whose refresh is on its way answers past its expiry, for
// twice as long as fetching it took (up to half the timeout), so that a
// refresh slower than the quarter of the timeout it starts ahead does not
// leave lookups without a listing. One not being refreshed expires on time.
func TestListCacheGraceWhileRefreshing(t *testing.T) {
	const ttl = 400 * time.Millisecond
	for _, tt := range []struct {
		took, grace time.Duration
	}{
		{0, 0},
		{50 * time.Millisecond, 100 * time.Millisecond},  // twice the fetch
		{150 * time.Millisecond, 200 * time.Millisecond}, // capped at half
	} {
		if got := refreshGrace(ttl, tt.took); got != tt.grace {
			t.Errorf("refreshGrace(%v, %v) = %v, want %v", ttl, tt.took, got, tt.grace)
		}
	}
	c := NewCache(ttl, 1000, 0)
	clock := useFakeClock(c)
	for _, d := range []string{"refreshed", "idle"} {
		fetch := c.BeginFetch(d)
		fetch.start = fetch.start.Add(-100 * time.Millisecond) // a fetch of 100 ms
		if !c.PutFetched(map[string]*meta.Entry{"a": {Kind: meta.KindFile}}, fetch) {
			t.Fatal("listing not stored")
		}
	}
	// Both expire at 400 ms; the refreshed one's grace is 200 ms.
	clock.advance(300 * time.Millisecond)
	if !c.ClaimRefresh("refreshed") {
		t.Fatal("a listing near its end was not claimed for refresh")
	}
	clock.advance(99 * time.Millisecond)
	for _, d := range []string{"refreshed", "idle"} {
		if _, found, ok := c.Lookup(d, "a"); !ok || !found {
			t.Fatalf("%s: a listing did not answer just before its expiry: found %v ok %v", d, found, ok)
		}
	}
	clock.advance(2 * time.Millisecond) // 401 ms: past expiry, within the grace
	if _, found, ok := c.Lookup("refreshed", "a"); !ok || !found {
		t.Fatalf("a listing being refreshed did not answer just past its expiry: found %v ok %v", found, ok)
	}
	if _, _, ok := c.Lookup("idle", "a"); ok {
		t.Fatal("a listing not being refreshed answered past its expiry")
	}
	clock.advance(197 * time.Millisecond) // 598 ms
	if _, found, ok := c.Lookup("refreshed", "a"); !ok || !found {
		t.Fatalf("a listing being refreshed did not answer at the end of its grace: found %v ok %v", found, ok)
	}
	clock.advance(3 * time.Millisecond) // 601 ms: past the grace, the refresh failed
	if _, _, ok := c.Lookup("refreshed", "a"); ok {
		t.Fatal("a listing answered past its grace")
	}
}

// TestListCacheChangesDuringFetch: this mount's changes to a directory
// made while a listing of it was on its way are replayed onto that listing,
// whether the store's pages saw them or not; a change that cannot be
// replayed (a directory renamed or removed above, an invalidation) keeps
// the listing out of the cache.
func TestListCacheChangesDuringFetch(t *testing.T) {
	c := NewCache(time.Minute, 1000, 0)
	fetch := c.BeginFetch("d")
	c.Set("d", "new", meta.Entry{Kind: meta.KindFile, Size: 7})
	c.Remove("d", "gone")
	c.Set("d", "again", meta.Entry{Kind: meta.KindFile})
	c.Remove("d", "again")
	c.Set("elsewhere", "x", meta.Entry{Kind: meta.KindFile})
	// The store's listing saw "gone" but not "new"; "old" is another
	// writer's, and "again" was created and removed meanwhile.
	fetched := map[string]*meta.Entry{"old": {Kind: meta.KindFile}, "gone": {Kind: meta.KindFile}, "again": {Kind: meta.KindFile}}
	if !c.PutFetched(fetched, fetch) {
		t.Fatal("a listing fetched while this mount changed its directory was not cached")
	}
	items, ok := c.Snapshot("d", nil)
	if !ok || len(items) != 2 || items[0].Name != "new" || items[1].Name != "old" || items[0].Entry.Size != 7 {
		t.Fatalf("listing after replay = %v (ok %v), want [new old] with new of 7 bytes", items, ok)
	}
	if _, found, ok := c.Lookup("elsewhere", "x"); ok || found {
		t.Fatal("a change to another directory landed in a listing")
	}
	// Changes after the listing was stored go to it directly, not to a
	// fetch that has ended.
	c.Set("d", "later", meta.Entry{Kind: meta.KindFile})
	if _, found, _ := c.Lookup("d", "later"); !found {
		t.Fatal("a change after the fetch is missing")
	}
	if n := len(c.fetching); n != 0 {
		t.Fatalf("%d directories still have fetches registered", n)
	}

	for _, change := range []struct {
		name string
		do   func()
	}{
		{"rename of a parent", func() { c.InvalidateTree("") }},
		{"rename of the directory's parent", func() { c.InvalidateTree("p") }},
		{"invalidate", func() { c.Invalidate("p/d") }},
	} {
		fetch := c.BeginFetch("p/d")
		change.do()
		if c.PutFetched(map[string]*meta.Entry{"old": {Kind: meta.KindFile}}, fetch) {
			t.Errorf("%s: a listing taken before the change was cached", change.name)
		}
		if _, _, ok := c.Lookup("p/d", "old"); ok {
			t.Errorf("%s: the stale listing answers lookups", change.name)
		}
	}
	fetch = c.BeginFetch("p/d")
	c.InvalidateTree("p/dd") // a sibling whose name starts the same
	if !c.PutFetched(map[string]*meta.Entry{}, fetch) {
		t.Error("a change to a sibling kept the listing out")
	}
	c.EndFetch(c.BeginFetch("p/d")) // a fetch that brought no listing
	if n := len(c.fetching); n != 0 {
		t.Fatalf("endFetch left %d directories with fetches registered", n)
	}
}

// TestListCacheSecondMiss: the first lookup that misses in a directory is
// probed; another within the listing timeout lists the directory.
func TestListCacheSecondMiss(t *testing.T) {
	c := NewCache(100*time.Millisecond, 1000, 0)
	clock := useFakeClock(c)
	if c.SecondMiss("d") {
		t.Fatal("first miss in d asked for a listing")
	}
	if c.SecondMiss("e") {
		t.Fatal("first miss in e asked for a listing")
	}
	if !c.SecondMiss("d") {
		t.Fatal("second miss in d did not ask for a listing")
	}
	if c.SecondMiss("d") {
		t.Fatal("the miss after a listing was asked for asked again")
	}
	clock.advance(100 * time.Millisecond)
	if c.SecondMiss("e") {
		t.Fatal("a miss after the listing timeout counted as a second one")
	}
}

// TestListCacheBudgetSharedByMounts: the listing caches of a process share
// one budget. A cache over it drops its own oldest listings; one that has
// none to drop keeps no listing until another's expire and are swept; a
// closed filesystem gives its part back.
func TestListCacheBudgetSharedByMounts(t *testing.T) {
	held, limit := ListCacheNames()
	t.Cleanup(func() { SetListCacheBytes(limit * ListCacheEntryBytes) })
	SetListCacheBytes((held + 50) * ListCacheEntryBytes) // room for 50 more names
	names := func(prefix string, n int) map[string]*meta.Entry {
		m := map[string]*meta.Entry{}
		for i := range n {
			m[fmt.Sprintf("%s%03d", prefix, i)] = &meta.Entry{Kind: meta.KindFile}
		}
		return m
	}
	const ttl = 300 * time.Millisecond
	a, b := NewCache(ttl, 1000, 0), NewCache(ttl, 1000, 0)
	clock := useFakeClock(a, b)
	a.Put("one", names("a", 30))
	clock.advance(time.Millisecond) // "one" is the oldest
	a.Put("two", names("b", 15))
	clock.advance(time.Millisecond)
	if h, _ := ListCacheNames(); h != held+45 {
		t.Fatalf("%d names held, want %d", h, held+45)
	}
	// b has nothing of its own to drop: its listing is not kept.
	b.Put("big", names("c", 20))
	if _, _, ok := b.Lookup("big", "c000"); ok {
		t.Fatal("a listing over the process's budget was kept")
	}
	// a drops its own oldest to make room.
	a.Put("three", names("d", 20))
	if _, _, ok := a.Lookup("one", "a000"); ok {
		t.Error("the oldest listing was kept over the budget")
	}
	if _, _, ok := a.Lookup("three", "d000"); !ok {
		t.Error("the newest listing was not kept")
	}
	// a's listings expire and are swept: b's fits.
	clock.advance(ttl + time.Millisecond)
	a.Sweep()
	b.Put("big", names("c", 20))
	if _, _, ok := b.Lookup("big", "c000"); !ok {
		t.Error("no room after the other cache's listings expired")
	}
	b.Clear()
	a.Clear()
	if h, _ := ListCacheNames(); h != held {
		t.Errorf("%d names held after both closed, want %d", h, held)
	}
}

// TestPassFromPartialListingShowsHeldNamesOnce: a pass that goes on from
// a lookup's partial listing leaves the blobs its page's merger still
// holds to the merger, even when this mount has set one of them since (a
// commit): the name would otherwise show twice in the pass.
func TestPassFromPartialListingShowsHeldNamesOnce(t *testing.T) {
	c := NewCache(time.Minute, 1000, 0)
	fetch := c.BeginFetch("d")
	page := blobstore.ListPage{Blobs: []blobstore.Attrs{{Name: "d/a"}, {Name: "d/data"}, {Name: "d/data.csv"}}, NextMarker: "more"}
	entries, merger := PageEntries("d/", page)
	if merger == nil || len(merger.held) != 2 {
		t.Fatalf("merger %+v: want data and data.csv held", merger)
	}
	if !c.PutPartialFetched(entries, &PassStart{Marker: page.NextMarker, Merger: *merger}, fetch) {
		t.Fatal("partial listing not kept")
	}
	c.Set("d", "data", meta.Entry{Kind: meta.KindFile, Size: 7}) // committed here since
	f, start := c.StartPass("d")
	if f == nil || start == nil {
		t.Fatal("the pass did not go on from the partial listing")
	}
	for _, it := range start.Items {
		if it.Name == "data" || it.Name == "data.csv" {
			t.Errorf("start items hold %q, which the merger holds too", it.Name)
		}
	}
	var dataSize int64 = -1
	for _, h := range start.Merger.held {
		if h.Name == "data" {
			dataSize = h.Entry.Size
		}
	}
	if dataSize != 7 {
		t.Errorf("held data has size %d, want this mount's 7", dataSize)
	}
}

// TestListCacheSubdirCount: a directory's count of subdirectories (its
// nlink) follows each change without a recount, and stays right whatever
// the change: a new directory, a file, a name that changes kind, a removal.
func TestListCacheSubdirCount(t *testing.T) {
	c := NewCache(time.Minute, 1000, 0)
	c.Put("d", map[string]*meta.Entry{"a": {Kind: meta.KindDir}, "b": {Kind: meta.KindDir}, "f": {Kind: meta.KindFile}})
	want := func(step string, n int) {
		t.Helper()
		got, ok := c.SubdirCount("d")
		if !ok || got != n {
			t.Fatalf("%s: subdirCount = %d (ok %v), want %d", step, got, ok, n)
		}
	}
	want("listed", 2)
	c.Set("d", "c", meta.Entry{Kind: meta.KindDir})
	want("a directory made", 3)
	c.Set("d", "g", meta.Entry{Kind: meta.KindFile})
	want("a file made", 3)
	c.Set("d", "c", meta.Entry{Kind: meta.KindDir, Size: 1})
	want("a directory's entry replaced", 3)
	c.Set("d", "f", meta.Entry{Kind: meta.KindDir})
	want("a file's name now a directory", 4)
	c.Set("d", "a", meta.Entry{Kind: meta.KindFile})
	want("a directory's name now a file", 3)
	c.Remove("d", "b")
	want("a directory removed", 2)
	c.Remove("d", "g")
	want("a file removed", 2)
	c.Remove("d", "nothing")
	want("a missing name removed", 2)
	// The same after changes made before anyone asked (nothing counted
	// yet), against a count from scratch.
	c.Put("e", map[string]*meta.Entry{"x": {Kind: meta.KindDir}})
	c.Set("e", "y", meta.Entry{Kind: meta.KindDir})
	c.Remove("e", "x")
	if got, ok := c.SubdirCount("e"); !ok || got != 1 {
		t.Fatalf("changes before the first count: subdirCount = %d (ok %v), want 1", got, ok)
	}
}

// TestPageMerger: a listing's pages, however split, give each name once,
// a name that is both a blob and a prefix as one directory with the
// marker's attributes, in listing order.
func TestPageMerger(t *testing.T) {
	// One listing of "d/", in order, as a store gives it.
	type key struct {
		name   string
		prefix bool
		md     map[string]string
	}
	keys := []key{
		{name: "d/a", md: map[string]string{blobstore.MetaIsFolder: "true", blobstore.MetaMode: "40750"}},
		{name: "d/a b"}, {name: "d/a-1"}, {name: "d/a-1-2"}, {name: "d/a."},
		{name: "d/a/", prefix: true},
		{name: "d/b"},
		{name: "d/c"}, {name: "d/c.d"},
		{name: "d/c/", prefix: true},
		{name: "d/e/", prefix: true},
		{name: "d/f"},
	}
	want := []string{"a b", "a-1", "a-1-2", "a", "b", "c.d", "c", "e", "f"}
	kinds := map[string]meta.Kind{"a": meta.KindDir, "c": meta.KindDir, "e": meta.KindDir}
	for size := 1; size <= len(keys); size++ {
		var got []meta.Item
		m := PageMerger{Prefix: "d/"}
		emit := func(it meta.Item) { got = append(got, it) }
		for i := 0; i < len(keys); i += size {
			var page blobstore.ListPage
			for _, k := range keys[i:min(i+size, len(keys))] {
				if k.prefix {
					page.Prefixes = append(page.Prefixes, k.name)
				} else {
					page.Blobs = append(page.Blobs, blobstore.Attrs{Name: k.name, Metadata: k.md})
				}
			}
			m.Add(page, emit)
		}
		m.Flush(emit)
		var gotNames []string
		for _, it := range got {
			gotNames = append(gotNames, it.Name)
			wantKind := kinds[it.Name]
			if wantKind == 0 {
				wantKind = meta.KindFile
			}
			if it.Entry.Kind != wantKind {
				t.Errorf("pages of %d: %q is a %v, want a %v", size, it.Name, it.Entry.Kind, wantKind)
			}
			if it.Name == "a" && (!it.Entry.Attrs.HasPerm || it.Entry.Attrs.Perm != 0o750) {
				t.Errorf("pages of %d: directory a lost its marker's mode: %+v", size, it.Entry.Attrs)
			}
		}
		// "a." is not a valid name (Azure drops trailing dots): skipped.
		if !slices.Equal(gotNames, want) {
			t.Errorf("pages of %d: %v, want %v", size, gotNames, want)
		}
	}
}
