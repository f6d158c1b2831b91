package fusefs

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobfs/blobfs/fusefs/meta"
)

// listCache remembers directory listings for Options.ListTimeout so that
// lookups and getattrs of the names in a freshly listed directory (the
// `ls -l` pattern) cost no request, and so that a lookup in a directory this
// mount has just created or listed needs no request to say "no such name".
//
// Listings are updated in place by this mount's own changes (create, mkdir,
// unlink, rename, commit), and so are listings still on their way from the
// store (listFetch); changes by other writers show up once the entry
// expires. Memory is bounded by maxEntries names over all listings: the
// oldest listings are dropped first.
//
// A listing is complete (the whole directory) or partial: the first pages
// of a larger directory, kept from a probe's page or fed page by page by a
// directory pass in progress (startPass, dirstream.go). A partial listing
// answers for the names it holds, and says "no such name" only for names
// its pages have gone past (covers). A listing fed by a pass does not
// expire while a page of it is on its way: its timeout counts from the
// pass's last activity (a page landing, the reader reading), so a pass
// that outlasts the timeout keeps what it fetched, and its listing lives
// on for the timeout after the reader is done.
type listCache struct {
	ttl        time.Duration
	maxEntries int
	// now is the clock listings expire by: time.Now, or a test's own
	// (the walks' waits on timers keep real time).
	now func() time.Time

	mu    sync.Mutex
	dirs  map[string]*listing // guarded by mu
	total int                 // names in all listings; guarded by mu
	// large remembers, for a while, directories too big to list for a
	// single lookup; guarded by mu and bounded by maxLarge.
	large map[string]time.Time
	// missed remembers, for ttl, directories a lookup could not answer
	// from a listing (secondMiss); guarded by mu and bounded by maxLarge.
	missed map[string]time.Time
	// fetching holds, by directory, the listings of it on their way from
	// the store; guarded by mu. This mount's changes to a directory made
	// meanwhile are recorded in each, and replayed onto the listing when
	// it arrives (putFetched): its pages may have been read before or
	// after any of them.
	fetching map[string][]*listFetch
	// walks are the tree walks in progress (treewalk.go), at most
	// maxWalks; passed remembers when each directory was last read (by
	// a pass or from the cache), which is what starts a walk, for
	// walkWindow and bounded by maxLarge; cond is broadcast when a walk
	// progresses or ends. walkAhead is Options.WalkAhead. Guarded by mu.
	walks     []*treeWalk
	passed    map[string]time.Time
	cond      *sync.Cond
	walkAhead int
}

// A listFetch is taken before a listing of a directory is fetched and
// handed back with it to putFetched, or to endFetch when no listing came.
type listFetch struct {
	dir   string
	start time.Time // when the fetch began (see refreshGrace)
	// listing is the listing a pass feeds page by page (startPass); nil
	// for a fetch stored whole by putFetched, and once the pass no longer
	// feeds it (dropped, spoiled, evicted). Guarded by listCache.mu.
	listing *listing
	// changes are this mount's changes to dir since start, in order;
	// guarded by listCache.mu.
	changes []listChange
	// spoiled: a change that cannot be replayed onto a listing (the
	// directory or one above it renamed or removed, an invalidation), or
	// more changes than maxFetchChanges. The listing is then not cached.
	spoiled bool
}

// listChange is one change to a name: set to e, or removed.
type listChange struct {
	name    string
	e       *meta.Entry
	removed bool
}

// maxFetchChanges bounds the changes recorded for one listing in flight.
const maxFetchChanges = 100_000

// beginFetch registers a listing of dir about to be fetched.
func (c *listCache) beginFetch(dir string) *listFetch {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &listFetch{dir: dir, start: c.now()}
	c.fetching[dir] = append(c.fetching[dir], f)
	return f
}

// endFetch unregisters f; no listing is stored.
func (c *listCache) endFetch(f *listFetch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFetchLocked(f)
}

func (c *listCache) endFetchLocked(f *listFetch) {
	fs := c.fetching[f.dir]
	for i, g := range fs {
		if g == f {
			fs = append(fs[:i], fs[i+1:]...)
			break
		}
	}
	if len(fs) == 0 {
		delete(c.fetching, f.dir)
	} else {
		c.fetching[f.dir] = fs
	}
}

// putFetched replays onto entries, a listing of f.dir fetched since
// beginFetch returned f, this mount's changes to the directory since then,
// and stores a copy of the result. It reports whether the copy was kept:
// not when a change could not be replayed (entries then lack it).
func (c *listCache) putFetched(entries map[string]*meta.Entry, f *listFetch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFetchLocked(f)
	if f.spoiled {
		return false
	}
	for _, ch := range f.changes {
		if ch.removed {
			delete(entries, ch.name)
		} else {
			entries[ch.name] = ch.e
		}
	}
	return c.putLocked(f.dir, copyEntries(entries), c.now().Sub(f.start), "")
}

// putPartialFetched is putFetched for the first page of a directory that
// has more: the listing kept answers for its names and, for the names
// before the page's last key, that they do not exist; a pass that starts
// while it is fresh goes on from it (start: where the listing continues).
// It never replaces a listing a pass is feeding, nor a complete one still
// fresh.
func (c *listCache) putPartialFetched(entries map[string]*meta.Entry, start *passStart, f *listFetch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFetchLocked(f)
	if f.spoiled || start.merger.last == "" {
		return false
	}
	if l := c.freshLocked(f.dir); l != nil && (l.complete || l.pass != nil) {
		return false
	}
	for _, ch := range f.changes {
		if ch.removed {
			delete(entries, ch.name)
		} else {
			entries[ch.name] = ch.e
		}
	}
	if !c.putLocked(f.dir, copyEntries(entries), c.now().Sub(f.start), start.merger.last) {
		return false
	}
	c.dirs[f.dir].resume = start
	return true
}

// passStart is where a pass starts that goes on from a partial listing:
// the entries up to where it got, in name order, and the store's listing
// from there on.
type passStart struct {
	items  []meta.Item
	marker string // the next page's
	merger pageMerger
}

// startPass begins a listing of dir that a directory pass feeds page by
// page (passPage, passListed, endPass). A fresh partial listing that a
// pass may go on from (putPartialFetched) becomes the pass's, and start
// says where the pass begins; otherwise the pass starts from the top and
// its listing replaces what is cached of dir. It returns a nil fetch, and
// the pass goes uncached, when listings are not cached or another pass
// feeds dir's listing already.
func (c *listCache) startPass(dir string) (f *listFetch, start *passStart) {
	if c.ttl <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l != nil && l.pass != nil {
		return nil, nil
	}
	f = &listFetch{dir: dir, start: c.now()}
	c.fetching[dir] = append(c.fetching[dir], f)
	if l != nil && !l.complete && l.resume != nil {
		// Its entries, as this mount's changes since left them, up
		// to where the listing got; later pages bring the rest.
		start, l.resume = l.resume, nil
		// The blobs the page's merger holds (their prefix may still
		// come) are left to it: a name this mount has set meanwhile
		// (a commit) is in the listing too, and would show twice.
		start.merger.held = slices.Clone(start.merger.held)
		held := map[string]bool{}
		for i, h := range start.merger.held {
			held[h.Name] = true
			if e := l.entries[h.Name]; e != nil {
				start.merger.held[i].Entry = e // this mount's newer view
			}
		}
		for _, name := range l.sortedLocked() {
			if name < l.last && !held[name] {
				start.items = append(start.items, meta.Item{Name: name, Entry: l.entries[name]})
			}
		}
	} else {
		c.dropLocked(dir)
		l = &listing{entries: map[string]*meta.Entry{}}
		c.dirs[dir] = l
	}
	l.pass, l.expiry = f, c.now().Add(c.ttl)
	f.listing = l
	return f, start
}

// passFetching marks a page of f's listing as on its way (on) or landed:
// meanwhile the listing does not expire.
func (c *listCache) passFetching(f *listFetch, on bool) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.passListingLocked(f); l != nil {
		l.fetching = on
		l.expiry = c.now().Add(c.ttl)
	}
}

// passPage adds a page's entries to f's listing, the listing having now
// gone past last, and replays onto them this mount's changes to those
// names since the pass began (the page may predate them).
func (c *listCache) passPage(f *listFetch, items []meta.Item, last string) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.passListingLocked(f)
	if l == nil {
		return
	}
	if !c.makeRoomLocked(len(items), l) {
		c.dropLocked(f.dir) // too large to cache; the pass goes on
		c.detachPassLocked(f)
		return
	}
	var names map[string]bool
	if len(f.changes) > 0 {
		names = make(map[string]bool, len(items))
	}
	for _, it := range items {
		if _, had := l.entries[it.Name]; !had {
			c.countLocked(1)
		}
		l.entries[it.Name] = it.Entry
		if names != nil {
			names[it.Name] = true
		}
	}
	for _, ch := range f.changes {
		if !names[ch.name] {
			continue // applied in place when it was made
		}
		if ch.removed {
			if _, had := l.entries[ch.name]; had {
				delete(l.entries, ch.name)
				c.countLocked(-1)
			}
		} else {
			l.entries[ch.name] = ch.e
		}
	}
	l.last = last
	l.fetching = false
	l.sorted, l.subdirs = nil, 0
	l.expiry = c.now().Add(c.ttl)
}

// passListed completes f's listing: the store's listing ended, and local
// holds the names that exist only here (mergeLocal). The listing stays
// with the pass until endPass.
func (c *listCache) passListed(f *listFetch, local map[string]*meta.Entry) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.passListingLocked(f)
	if l == nil {
		return
	}
	for name, e := range local {
		if _, ok := l.entries[name]; !ok {
			l.entries[name] = e
			c.countLocked(1)
		}
	}
	l.complete, l.last, l.fetching = true, "", false
	l.sorted, l.subdirs = nil, 0
	l.took = c.now().Sub(f.start)
	l.expiry = c.now().Add(c.ttl)
	c.endFetchLocked(f) // changes now apply to the listing in place
}

// touchPass records the reader's activity: f's listing lives on for the
// timeout from now.
func (c *listCache) touchPass(f *listFetch) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.passListingLocked(f); l != nil {
		l.expiry = c.now().Add(c.ttl)
	}
}

// endPass ends f's pass (read to its end, rewound or released): its
// listing, complete or as far as it got, lives for the timeout from now.
func (c *listCache) endPass(f *listFetch) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.passListingLocked(f); l != nil {
		l.pass, l.fetching = nil, false
		l.expiry = c.now().Add(c.ttl)
	}
	c.detachPassLocked(f)
}

// passListingLocked returns the listing f feeds, or nil (detaching f)
// when it no longer does: the listing was dropped or replaced, or a
// change spoiled it.
func (c *listCache) passListingLocked(f *listFetch) *listing {
	l := f.listing
	if l == nil {
		return nil
	}
	if c.dirs[f.dir] != l {
		c.detachPassLocked(f)
		return nil
	}
	if f.spoiled && !l.complete {
		c.dropLocked(f.dir)
		c.detachPassLocked(f)
		return nil
	}
	return l
}

func (c *listCache) detachPassLocked(f *listFetch) {
	if l := f.listing; l != nil && l.pass == f {
		l.pass, l.fetching = nil, false
	}
	f.listing = nil
	c.endFetchLocked(f)
}

// recordLocked adds a change of name in dir to the listings of dir in
// flight.
func (c *listCache) recordLocked(dir string, ch listChange) {
	for _, w := range slices.Clone(c.walks) {
		if !w.covers(dir) {
			continue // the walked directory's listing takes changes in place
		}
		if l := c.dirs[dir]; l != nil && l.walk == w {
			continue // built and put already: changed in place
		}
		if w.nchanges >= maxFetchChanges {
			c.endWalkLocked(w)
			continue
		}
		w.changes[dir] = append(w.changes[dir], ch)
		w.nchanges++
	}
	for _, f := range c.fetching[dir] {
		if len(f.changes) >= maxFetchChanges {
			f.spoiled, f.changes = true, nil
		}
		if !f.spoiled {
			f.changes = append(f.changes, ch)
		}
	}
}

// spoilLocked marks the listings in flight of dir, and with tree of every
// directory below it, as not to be cached.
func (c *listCache) spoilLocked(dir string, tree bool) {
	for _, w := range slices.Clone(c.walks) {
		// A directory in the walked tree changed in a way that cannot
		// be replayed onto its listing (removed, renamed): the walk
		// leaves it out from now on. One at or above the walk's root:
		// the walk ends.
		switch {
		case w.covers(dir):
			w.skipLocked(dir)
		case dir == w.root || tree && (dir == "" || strings.HasPrefix(w.root, dir+"/")):
			c.endWalkLocked(w)
		}
	}
	for d, fs := range c.fetching {
		if d == dir || tree && (dir == "" || strings.HasPrefix(d, dir+"/")) {
			for _, f := range fs {
				f.spoiled, f.changes = true, nil
			}
		}
	}
}

const (
	maxLarge    = 10_000
	largeMemory = time.Minute
)

func (c *listCache) markLarge(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.large) >= maxLarge {
		clear(c.large)
	}
	c.large[dir] = c.now().Add(largeMemory)
}

// worthListing reports whether a whole page of dir is worth fetching for
// the cache: listings are cached at all, and dir is not known to be larger
// than a page.
func (c *listCache) worthListing(dir string) bool {
	return c.ttl > 0 && !c.isLarge(dir)
}

func (c *listCache) isLarge(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.large[dir]
	if ok && c.now().After(t) {
		delete(c.large, dir)
		return false
	}
	return ok
}

// secondMiss records a lookup in dir that no cached listing could answer,
// and reports whether another one came less than ttl before it. The first
// name looked up in a directory is probed (a Stat and a one-name List, in
// parallel); a directory looked up in again is listed whole, which answers
// the lookups after it. A single lookup (a path walked through its
// parents, a stat) then never pays for listing a big parent: on Azurite,
// whose listings scan the whole container, listing a root of 21 names in a
// container of 9,000 blobs took 16-51 ms against a probe's 4-17 ms; a
// directory read file by file pays one probe more.
func (c *listCache) secondMiss(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if t, ok := c.missed[dir]; ok && now.Sub(t) < c.ttl {
		delete(c.missed, dir)
		return true
	}
	if len(c.missed) >= maxLarge {
		clear(c.missed)
	}
	c.missed[dir] = now
	return false
}

type listing struct {
	expiry     time.Time
	refreshing bool          // a refresh was started (claimRefresh)
	took       time.Duration // how long fetching this listing took
	entries    map[string]*meta.Entry
	// complete: entries are the whole directory. Otherwise last is the
	// last key the listing's pages reached, relative to the directory (a
	// subdirectory's ends in "/"), and entries are the names up to it
	// (covers).
	complete bool
	last     string
	// pass is the fetch of the directory pass feeding this listing
	// (startPass) until the pass ends; fetching: a page of it is on its
	// way, and the listing does not expire meanwhile.
	pass     *listFetch
	fetching bool
	// resume: a pass may go on from this partial listing, at the page
	// after the one it holds.
	resume *passStart
	sorted []string // entries' names in order; nil until asked for, and after a change
	// subdirs counts the entries that are directories, plus one; 0 until
	// asked for and after a listing is (re)filled; set and remove keep it.
	subdirs int
	// walk is the tree walk that built this listing; it keeps the
	// listing fresh while it is in use (keptByWalk).
	// prefetched is how many names the walk built it with, while no
	// walker has used it yet (they count as ahead of the walker).
	walk       *treeWalk
	prefetched int
}

func newListCache(ttl time.Duration, maxEntries, walkAhead int) *listCache {
	c := &listCache{ttl: ttl, maxEntries: maxEntries, now: time.Now, dirs: map[string]*listing{}, large: map[string]time.Time{}, missed: map[string]time.Time{},
		fetching: map[string][]*listFetch{}, passed: map[string]time.Time{}, walkAhead: walkAhead}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// notePassed records that dir is being read: a walker that then opens one
// of its first subdirectories starts a tree walk (maybeStartWalk).
func (c *listCache) notePassed(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.passed) >= maxLarge {
		clear(c.passed)
	}
	c.passed[dir] = c.now()
}

// ListCacheEntryBytes is what one name of a cached listing costs, on
// average, for the budget (SetListCacheBytes): its entry, shared with a
// directory pass that lists it, and its map slot (a directory of 1,000,000
// names being listed took 241 bytes an entry in all, pass included:
// blobfs-dirbench -per-entry).
const ListCacheEntryBytes = 200

// DefaultListCacheBytes is the budget of every listing cache of a process
// together, when SetListCacheBytes is not called: about 1,340,000 names.
const DefaultListCacheBytes = 256 << 20

// listBudget is the memory budget shared by the listing caches of every
// mount of the process (the CSI driver serves all the mounts of a node in
// one), counted in names; a cache over it drops its oldest listings.
var listBudget = struct {
	used, limit atomic.Int64
}{}

func init() { listBudget.limit.Store(DefaultListCacheBytes / ListCacheEntryBytes) }

// SetListCacheBytes sets the budget of every listing cache of the process
// together, in bytes (ListCacheEntryBytes a name).
func SetListCacheBytes(n int64) { listBudget.limit.Store(max(n/ListCacheEntryBytes, 1)) }

// ListCacheNames returns how many names the listing caches of the process
// hold, and how many their budget allows.
func ListCacheNames() (held, limit int64) { return listBudget.used.Load(), listBudget.limit.Load() }

// roomLocked reports whether n more names fit both this cache's own bound
// and the process's budget.
func (c *listCache) roomLocked(n int) bool {
	return c.total+n <= c.maxEntries && listBudget.used.Load()+int64(n) <= listBudget.limit.Load()
}

// makeRoomLocked drops this cache's oldest listings, other than keep,
// until n more names fit, and reports whether they do. It drops nothing
// when all it holds would not be enough (the process's budget taken by
// other mounts).
func (c *listCache) makeRoomLocked(n int, keep *listing) bool {
	for !c.roomLocked(n) {
		over := max(c.total+n-c.maxEntries, int(listBudget.used.Load()+int64(n)-listBudget.limit.Load()))
		droppable := c.total
		if keep != nil {
			droppable -= len(keep.entries)
		}
		if over > droppable || !c.evictOldestLocked(keep) {
			return false
		}
	}
	return true
}

// countLocked records n names more (or fewer) in this cache.
func (c *listCache) countLocked(n int) {
	c.total += n
	listBudget.used.Add(int64(n))
}

// sweep drops the listings that have expired: a mount nobody uses would
// otherwise keep them, and their part of the process's budget, until its
// next lookup.
func (c *listCache) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for dir := range c.dirs {
		c.freshLocked(dir)
	}
}

// clear drops every listing: the filesystem is closing.
func (c *listCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range slices.Clone(c.walks) {
		c.endWalkLocked(w)
	}
	for dir := range c.dirs {
		c.dropLocked(dir)
	}
}

// put stores a complete listing of dir.
func (c *listCache) put(dir string, entries map[string]*meta.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(dir, entries, 0, "")
}

// putLocked stores a listing that took took to fetch, complete when last
// is "" and partial up to last otherwise, and reports whether it was kept.
func (c *listCache) putLocked(dir string, entries map[string]*meta.Entry, took time.Duration, last string) bool {
	if c.ttl <= 0 {
		return false
	}
	c.dropLocked(dir)
	if !c.makeRoomLocked(len(entries), nil) {
		return false
	}
	c.dirs[dir] = &listing{expiry: c.now().Add(c.ttl), entries: entries, took: took, complete: last == "", last: last}
	c.countLocked(len(entries))
	return true
}

// lookup answers whether name is in dir. ok is false when there is no fresh
// listing of dir that knows: none, or a partial one that has not reached
// name.
func (c *listCache) lookup(dir, name string) (e meta.Entry, found, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil {
		return meta.Entry{}, false, false
	}
	c.usedLocked(l)
	if p := l.entries[name]; p != nil {
		e, found = *p, true
	}
	if found || l.complete {
		return e, found, true
	}
	return meta.Entry{}, false, l.covers(name)
}

// covers reports whether a partial listing's pages went past every key
// name could take: the blob name and the prefix name+"/" (which holds
// every name below it). Stores list in byte order, except that Azurite
// (and possibly Azure) compare UTF-16 code units, which order characters
// from U+E000 on differently; names with those never count as passed.
func (l *listing) covers(name string) bool {
	return l.last != "" && name+"/" < l.last && byteOrderSafe(name) && byteOrderSafe(l.last)
}

// byteOrderSafe reports whether s has no character at or above U+E000
// (UTF-8 lead bytes 0xEE and up), below which byte order and UTF-16 order
// agree.
func byteOrderSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0xee {
			return false
		}
	}
	return true
}

// holdsStoreNames reports whether dir has a fresh listing with a name that
// came from the store (not only files created here and not committed).
func (c *listCache) holdsStoreNames(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil {
		return false
	}
	for _, e := range l.entries {
		if !e.Pending {
			return true
		}
	}
	return false
}

// subdirCount returns how many subdirectories dir's listing holds, if
// dir is listed: a directory's nlink is 2 plus that.
func (c *listCache) subdirCount(dir string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil || !l.complete {
		return 0, false
	}
	if l.subdirs == 0 {
		n := 0
		for _, e := range l.entries {
			if e.Kind == meta.KindDir {
				n++
			}
		}
		l.subdirs = n + 1
	}
	return l.subdirs - 1, true
}

// snapshot appends to items a fresh complete listing of dir in name
// order, or returns ok=false.
func (c *listCache) snapshot(dir string, items []meta.Item) (_ []meta.Item, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil || !l.complete {
		return items, false
	}
	c.usedLocked(l)
	for _, name := range l.sortedLocked() {
		items = append(items, meta.Item{Name: name, Entry: l.entries[name]})
	}
	return items, true
}

// sortedLocked returns l's names in order, sorting them once per change.
func (l *listing) sortedLocked() []string {
	if l.sorted == nil {
		l.sorted = make([]string, 0, len(l.entries))
		for n := range l.entries {
			l.sorted = append(l.sorted, n)
		}
		sort.Strings(l.sorted)
	}
	return l.sorted
}

// claimRefresh reports whether dir's listing, still fresh, is in the last
// quarter of its life with no refresh started yet, and marks it refreshing.
// A directory in use is listed again in the background before its listing
// expires (see FS.refreshListing), so that its lookups do not stall on a
// whole listing once per ListTimeout. A refresh that takes longer than the
// quarter left is covered by refreshGrace.
func (c *listCache) claimRefresh(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil || !l.complete || l.pass != nil || l.refreshing || l.expiry.Sub(c.now()) > c.ttl/4 ||
		l.keptByWalk(c.now(), c.ttl) {
		// A walk keeps it as one listing in progress: listing the
		// directory again would only compete with the walk's pages.
		return false
	}
	l.refreshing = true
	return true
}

// refreshGrace is how long past its expiry a listing whose refresh is on
// its way still answers: twice as long as fetching it took, up to half the
// timeout. A refresh started a quarter of the timeout before expiry lands
// after it when listing takes longer than that (on Azurite, listing 1,000
// names of a busy container took 250-300 ms, against the 250 ms left of
// the default 1 s); each lapse cost a probe of the next name looked up,
// and that lookup stalled on it. Refreshing earlier instead lists a
// directory in use more often, which on such a store is the larger cost.
// Answers from a listing in its grace are up to that grace older than the
// timeout alone allows.
func refreshGrace(ttl, took time.Duration) time.Duration {
	return min(2*took, ttl/2)
}

// following returns up to max entries of dir's fresh listing that come
// after name, in name order; none when dir has no fresh listing.
func (c *listCache) following(dir, name string, max int) []meta.Item {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l == nil || !l.complete {
		return nil
	}
	sorted := l.sortedLocked()
	i, found := sort.Find(len(sorted), func(i int) int { return strings.Compare(name, sorted[i]) })
	if found {
		i++
	}
	var out []meta.Item
	for ; i < len(sorted) && len(out) < max; i++ {
		out = append(out, meta.Item{Name: sorted[i], Entry: l.entries[sorted[i]]})
	}
	return out
}

// set records name in dir's listing if one is cached.
func (c *listCache) set(dir, name string, e meta.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &e // shared, never changed: a change replaces it
	c.recordLocked(dir, listChange{name: name, e: p})
	if l := c.dirs[dir]; l != nil {
		old, had := l.entries[name]
		if !had {
			c.countLocked(1)
			l.sorted = nil
		}
		l.countSubdirLocked(old, -1)
		l.countSubdirLocked(p, 1)
		l.entries[name] = p
	}
}

// countSubdirLocked keeps subdirs, once counted, up to date as entry e
// comes (delta 1) or goes (-1): recounting a large directory on every
// change made each create in it cost a pass over all its names (the
// kernel asks for the directory's attributes after each one).
func (l *listing) countSubdirLocked(e *meta.Entry, delta int) {
	if e != nil && e.Kind == meta.KindDir && l.subdirs != 0 {
		l.subdirs += delta
	}
}

// remove drops name from dir's listing if one is cached.
func (c *listCache) remove(dir, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLocked(dir, listChange{name: name, removed: true})
	if l := c.dirs[dir]; l != nil {
		if old, had := l.entries[name]; had {
			delete(l.entries, name)
			c.countLocked(-1)
			l.sorted = nil
			l.countSubdirLocked(old, -1)
		}
	}
}

// invalidateTree drops the listings of dir and of every directory below it.
func (c *listCache) invalidateTree(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spoilLocked(dir, true)
	for d := range c.dirs {
		if d == dir || dir == "" || strings.HasPrefix(d, dir+"/") {
			c.dropLocked(d)
		}
	}
}

func (c *listCache) invalidate(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spoilLocked(dir, false)
	c.dropLocked(dir)
}

func (c *listCache) freshLocked(dir string) *listing {
	l := c.dirs[dir]
	if l == nil {
		return nil
	}
	if now := c.now(); now.After(l.expiry) && !l.fetching && !(l.refreshing && now.Before(l.expiry.Add(refreshGrace(c.ttl, l.took)))) &&
		!l.keptByWalk(now, c.ttl) {
		c.dropLocked(dir)
		return nil
	}
	return l
}

func (c *listCache) dropLocked(dir string) {
	if l := c.dirs[dir]; l != nil {
		if w := l.walk; w != nil && l.prefetched > 0 {
			w.ahead -= l.prefetched
			l.prefetched = 0
		}
		c.countLocked(-len(l.entries))
		delete(c.dirs, dir)
	}
}

// evictOldestLocked drops the listing that expires first, other than
// keep, and reports whether there was one.
func (c *listCache) evictOldestLocked(keep *listing) bool {
	var oldest string
	var t time.Time
	first := true
	for d, l := range c.dirs {
		if l != keep && (first || l.expiry.Before(t)) {
			oldest, t, first = d, l.expiry, false
		}
	}
	if first {
		return false
	}
	c.dropLocked(oldest)
	return true
}
