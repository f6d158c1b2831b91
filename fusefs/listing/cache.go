package listing

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Cache remembers directory listings for Options.ListTimeout so that
// lookups and getattrs of the names in a freshly listed directory (the
// `ls -l` pattern) cost no request, and so that a lookup in a directory this
// mount has just created or listed needs no request to say "no such name".
//
// Listings are updated in place by this mount's own changes (create, mkdir,
// unlink, rename, commit), and so are listings still on their way from the
// store (Fetch); changes by other writers show up once the entry
// expires. Memory is bounded by maxEntries names over all listings: the
// oldest listings are dropped first.
//
// A listing is complete (the whole directory) or partial: the first pages
// of a larger directory, kept from a probe's page or fed page by page by a
// directory pass in progress (StartPass; fusefs/dirstream.go). A partial listing
// answers for the names it holds, and says "no such name" only for names
// its pages have gone past (covers). A listing fed by a pass does not
// expire while a page of it is on its way: its timeout counts from the
// pass's last activity (a page landing, the reader reading), so a pass
// that outlasts the timeout keeps what it fetched, and its listing lives
// on for the timeout after the reader is done.
type Cache struct {
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
	fetching map[string][]*Fetch
	// walks are the tree walks in progress (treewalk.go), at most
	// maxWalks; passed remembers when each directory was last read (by
	// a pass or from the cache), which is what starts a walk, for
	// walkWindow and bounded by maxLarge; cond is broadcast when a walk
	// progresses or ends. walkAhead is Options.WalkAhead. Guarded by mu.
	walks     []*treeWalk
	passed    map[string]time.Time
	cond      *sync.Cond
	walkAhead int

	// walker is what walks list with, set once by StartWalks; nil: no
	// walks.
	walker *walker
}

// walker is how a cache's tree walks reach the store and the mount: the
// store to list, the mount's context and background group (a walk ends
// with the mount, which waits for it), its log, and mergeLocal, which
// adds to a walked directory the names that exist only in the mount.
type walker struct {
	store      blobstore.Store
	ctx        context.Context
	bg         *sync.WaitGroup
	log        *slog.Logger
	mergeLocal func(dir string, entries map[string]*meta.Entry)
}

// StartWalks lets the cache walk trees (maybeStartWalk) with store, until
// ctx ends; bg counts the walks' goroutines. mergeLocal adds the names
// that exist only in the mount to a walked directory's entries.
func (c *Cache) StartWalks(store blobstore.Store, ctx context.Context, bg *sync.WaitGroup, log *slog.Logger, mergeLocal func(dir string, entries map[string]*meta.Entry)) {
	c.walker = &walker{store: store, ctx: ctx, bg: bg, log: log, mergeLocal: mergeLocal}
}

// A Fetch is taken before a listing of a directory is fetched and
// handed back with it to putFetched, or to endFetch when no listing came.
type Fetch struct {
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

// BeginFetch registers a listing of dir about to be fetched.
func (c *Cache) BeginFetch(dir string) *Fetch {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &Fetch{dir: dir, start: c.now()}
	c.fetching[dir] = append(c.fetching[dir], f)
	return f
}

// EndFetch unregisters f; no listing is stored.
func (c *Cache) EndFetch(f *Fetch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFetchLocked(f)
}

func (c *Cache) endFetchLocked(f *Fetch) {
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

// PutFetched replays onto entries, a listing of f.dir fetched since
// beginFetch returned f, this mount's changes to the directory since then,
// and stores a copy of the result. It reports whether the copy was kept:
// not when a change could not be replayed (entries then lack it).
func (c *Cache) PutFetched(entries map[string]*meta.Entry, f *Fetch) bool {
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

// PutPartialFetched is putFetched for the first page of a directory that
// has more: the listing kept answers for its names and, for the names
// before the page's last key, that they do not exist; a pass that starts
// while it is fresh goes on from it (start: where the listing continues).
// It never replaces a listing a pass is feeding, nor a complete one still
// fresh.
func (c *Cache) PutPartialFetched(entries map[string]*meta.Entry, start *PassStart, f *Fetch) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endFetchLocked(f)
	if f.spoiled || start.Merger.last == "" {
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
	if !c.putLocked(f.dir, copyEntries(entries), c.now().Sub(f.start), start.Merger.last) {
		return false
	}
	c.dirs[f.dir].resume = start
	return true
}

// PassStart is where a pass starts that goes on from a partial listing:
// the entries up to where it got, in name order, and the store's listing
// from there on.
type PassStart struct {
	Items  []meta.Item
	Marker string // the next page's
	Merger PageMerger
}

// StartPass begins a listing of dir that a directory pass feeds page by
// page (passPage, passListed, endPass). A fresh partial listing that a
// pass may go on from (putPartialFetched) becomes the pass's, and start
// says where the pass begins; otherwise the pass starts from the top and
// its listing replaces what is cached of dir. It returns a nil fetch, and
// the pass goes uncached, when listings are not cached or another pass
// feeds dir's listing already.
func (c *Cache) StartPass(dir string) (f *Fetch, start *PassStart) {
	if c.ttl <= 0 {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.freshLocked(dir)
	if l != nil && l.pass != nil {
		return nil, nil
	}
	f = &Fetch{dir: dir, start: c.now()}
	c.fetching[dir] = append(c.fetching[dir], f)
	if l != nil && !l.complete && l.resume != nil {
		// Its entries, as this mount's changes since left them, up
		// to where the listing got; later pages bring the rest.
		start, l.resume = l.resume, nil
		// The blobs the page's merger holds (their prefix may still
		// come) are left to it: a name this mount has set meanwhile
		// (a commit) is in the listing too, and would show twice.
		start.Merger.held = slices.Clone(start.Merger.held)
		held := map[string]bool{}
		for i, h := range start.Merger.held {
			held[h.Name] = true
			if e := l.entries[h.Name]; e != nil {
				start.Merger.held[i].Entry = e // this mount's newer view
			}
		}
		for _, name := range l.sortedLocked() {
			if name < l.last && !held[name] {
				start.Items = append(start.Items, meta.Item{Name: name, Entry: l.entries[name]})
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

// PassFetching marks a page of f's listing as on its way (on) or landed:
// meanwhile the listing does not expire.
func (c *Cache) PassFetching(f *Fetch, on bool) {
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

// PassPage adds a page's entries to f's listing, the listing having now
// gone past last, and replays onto them this mount's changes to those
// names since the pass began (the page may predate them).
func (c *Cache) PassPage(f *Fetch, items []meta.Item, last string) {
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

// PassListed completes f's listing: the store's listing ended, and local
// holds the names that exist only here (mergeLocal). The listing stays
// with the pass until endPass.
func (c *Cache) PassListed(f *Fetch, local map[string]*meta.Entry) {
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

// TouchPass records the reader's activity: f's listing lives on for the
// timeout from now.
func (c *Cache) TouchPass(f *Fetch) {
	if f == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.passListingLocked(f); l != nil {
		l.expiry = c.now().Add(c.ttl)
	}
}

// EndPass ends f's pass (read to its end, rewound or released): its
// listing, complete or as far as it got, lives for the timeout from now.
func (c *Cache) EndPass(f *Fetch) {
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
func (c *Cache) passListingLocked(f *Fetch) *listing {
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

func (c *Cache) detachPassLocked(f *Fetch) {
	if l := f.listing; l != nil && l.pass == f {
		l.pass, l.fetching = nil, false
	}
	f.listing = nil
	c.endFetchLocked(f)
}

// recordLocked adds a change of name in dir to the listings of dir in
// flight.
func (c *Cache) recordLocked(dir string, ch listChange) {
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
func (c *Cache) spoilLocked(dir string, tree bool) {
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

func (c *Cache) MarkLarge(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.large) >= maxLarge {
		clear(c.large)
	}
	c.large[dir] = c.now().Add(largeMemory)
}

// WorthListing reports whether a whole page of dir is worth fetching for
// the cache: listings are cached at all, and dir is not known to be larger
// than a page.
func (c *Cache) WorthListing(dir string) bool {
	return c.ttl > 0 && !c.IsLarge(dir)
}

// IsLarge tells whether dir was found too large to list for a single
// lookup, a while ago: its names are probed one by one.
func (c *Cache) IsLarge(dir string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.large[dir]
	if ok && c.now().After(t) {
		delete(c.large, dir)
		return false
	}
	return ok
}

// SecondMiss records a lookup in dir that no cached listing could answer,
// and reports whether another one came less than ttl before it. The first
// name looked up in a directory is probed (a Stat and a one-name List, in
// parallel); a directory looked up in again is listed whole, which answers
// the lookups after it. A single lookup (a path walked through its
// parents, a stat) then never pays for listing a big parent: on Azurite,
// whose listings scan the whole container, listing a root of 21 names in a
// container of 9,000 blobs took 16-51 ms against a probe's 4-17 ms; a
// directory read file by file pays one probe more.
func (c *Cache) SecondMiss(dir string) bool {
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
	pass     *Fetch
	fetching bool
	// resume: a pass may go on from this partial listing, at the page
	// after the one it holds.
	resume *PassStart
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

func NewCache(ttl time.Duration, maxEntries, walkAhead int) *Cache {
	c := &Cache{ttl: ttl, maxEntries: maxEntries, now: time.Now, dirs: map[string]*listing{}, large: map[string]time.Time{}, missed: map[string]time.Time{},
		fetching: map[string][]*Fetch{}, passed: map[string]time.Time{}, walkAhead: walkAhead}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// NotePassed records that dir is being read: a walker that then opens one
// of its first subdirectories starts a tree walk (maybeStartWalk).
func (c *Cache) NotePassed(dir string) {
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
func (c *Cache) roomLocked(n int) bool {
	return c.total+n <= c.maxEntries && listBudget.used.Load()+int64(n) <= listBudget.limit.Load()
}

// makeRoomLocked drops this cache's oldest listings, other than keep,
// until n more names fit, and reports whether they do. It drops nothing
// when all it holds would not be enough (the process's budget taken by
// other mounts).
func (c *Cache) makeRoomLocked(n int, keep *listing) bool {
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
func (c *Cache) countLocked(n int) {
	c.total += n
	listBudget.used.Add(int64(n))
}

// Sweep drops the listings that have expired: a mount nobody uses would
// otherwise keep them, and their part of the process's budget, until its
// next lookup.
func (c *Cache) Sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for dir := range c.dirs {
		c.freshLocked(dir)
	}
}

// Clear drops every listing: the filesystem is closing.
func (c *Cache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range slices.Clone(c.walks) {
		c.endWalkLocked(w)
	}
	for dir := range c.dirs {
		c.dropLocked(dir)
	}
}

// Put stores a complete listing of dir.
func (c *Cache) Put(dir string, entries map[string]*meta.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(dir, entries, 0, "")
}

// putLocked stores a listing that took took to fetch, complete when last
// is "" and partial up to last otherwise, and reports whether it was kept.
func (c *Cache) putLocked(dir string, entries map[string]*meta.Entry, took time.Duration, last string) bool {
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

// Lookup answers whether name is in dir. ok is false when there is no fresh
// listing of dir that knows: none, or a partial one that has not reached
// name.
func (c *Cache) Lookup(dir, name string) (e meta.Entry, found, ok bool) {
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

// HoldsStoreNames reports whether dir has a fresh listing with a name that
// came from the store (not only files created here and not committed).
func (c *Cache) HoldsStoreNames(dir string) bool {
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

// SubdirCount returns how many subdirectories dir's listing holds, if
// dir is listed: a directory's nlink is 2 plus that.
func (c *Cache) SubdirCount(dir string) (int, bool) {
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

// Snapshot appends to items a fresh complete listing of dir in name
// order, or returns ok=false.
func (c *Cache) Snapshot(dir string, items []meta.Item) (_ []meta.Item, ok bool) {
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

// ClaimRefresh reports whether dir's listing, still fresh, is in the last
// quarter of its life with no refresh started yet, and marks it refreshing.
// A directory in use is listed again in the background before its listing
// expires (see FS.refreshListing), so that its lookups do not stall on a
// whole listing once per ListTimeout. A refresh that takes longer than the
// quarter left is covered by refreshGrace.
func (c *Cache) ClaimRefresh(dir string) bool {
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

// Following returns up to max entries of dir's fresh listing that come
// after name, in name order; none when dir has no fresh listing.
func (c *Cache) Following(dir, name string, max int) []meta.Item {
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

// Set records name in dir's listing if one is cached.
func (c *Cache) Set(dir, name string, e meta.Entry) {
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

// Remove drops name from dir's listing if one is cached.
func (c *Cache) Remove(dir, name string) {
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

// InvalidateTree drops the listings of dir and of every directory below it.
func (c *Cache) InvalidateTree(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spoilLocked(dir, true)
	for d := range c.dirs {
		if d == dir || dir == "" || strings.HasPrefix(d, dir+"/") {
			c.dropLocked(d)
		}
	}
}

func (c *Cache) Invalidate(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spoilLocked(dir, false)
	c.dropLocked(dir)
}

func (c *Cache) freshLocked(dir string) *listing {
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

func (c *Cache) dropLocked(dir string) {
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
func (c *Cache) evictOldestLocked(keep *listing) bool {
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

const (
	// FirstPage is the size of a pass's first page: on Azurite a
	// page costs about 150 ms plus 0.1 ms a name, so 500 names come in
	// 0.25 s against 0.75 s for a full page; one page more in all.
	FirstPage = 500
	// FullPage is the size of the pages after it (the store's largest).
	FullPage = blobstore.MaxListResults
)

// PageMerger turns the pages of one listing into directory entries, in
// listing order. A page's blobs and prefixes come in two lists; merged by
// name they are in the order of the listing, where a blob "a" comes
// before its prefix "a/" and only names that start with "a" and a byte
// below '/' come between them. So a blob is held until a key at or past
// its prefix's place arrives: a prefix of the same name makes both one
// directory (with the marker's attributes, if the blob is a marker); any
// other key lets the blob go as it is.
type PageMerger struct {
	Prefix string
	// held are blobs whose prefix may still come: each is a prefix of
	// the last key, so there are at most as many as its bytes.
	held []meta.Item
	// last is the last key seen, relative to prefix; a prefix's ends in
	// "/". Every name up to it has been listed.
	last string
}

// ForgetMisses forgets which directories lookups could not answer from a
// listing (SecondMiss): as if lookups were rarer than one per timeout.
func (c *Cache) ForgetMisses() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.missed)
}

// Last is the last key seen, relative to Prefix: every name up to it has
// been listed.
func (m *PageMerger) Last() string { return m.last }

// Add merges one page, calling emit for each entry whose kind is settled.
// Names that cannot be file names are skipped, never mangled.
func (m *PageMerger) Add(page blobstore.ListPage, emit func(meta.Item)) {
	blobs, prefixes := page.Blobs, page.Prefixes
	for len(blobs) > 0 || len(prefixes) > 0 {
		if len(prefixes) == 0 || len(blobs) > 0 && blobs[0].Name < prefixes[0] {
			b := blobs[0]
			blobs = blobs[1:]
			key := strings.TrimPrefix(b.Name, m.Prefix)
			m.release(key, emit)
			if meta.CheckName(key) == fuse.OK {
				e := meta.EntryOf(b)
				m.held = append(m.held, meta.Item{Name: key, Entry: &e})
			}
			continue
		}
		key := strings.TrimPrefix(prefixes[0], m.Prefix)
		prefixes = prefixes[1:]
		name := strings.TrimSuffix(key, "/")
		e := meta.Entry{Kind: meta.KindDir}
		for i, h := range m.held {
			if h.Name == name {
				if h.Entry.Kind == meta.KindDir {
					e.Mtime, e.Attrs = h.Entry.Mtime, h.Entry.Attrs // the marker's
				}
				m.held = append(m.held[:i], m.held[i+1:]...)
				break
			}
		}
		m.release(key, emit)
		if meta.CheckName(name) == fuse.OK {
			emit(meta.Item{Name: name, Entry: &e})
		}
	}
}

// release emits the held blobs whose prefix would come before key, and
// records key as the last one seen.
func (m *PageMerger) release(key string, emit func(meta.Item)) {
	kept := m.held[:0]
	for _, h := range m.held {
		if h.Name+"/" < key {
			emit(h)
		} else {
			kept = append(kept, h)
		}
	}
	clear(m.held[len(kept):])
	m.held = kept
	m.last = key
}

// Flush emits the held blobs: the listing ended.
func (m *PageMerger) Flush(emit func(meta.Item)) {
	for _, h := range m.held {
		emit(h)
	}
	m.held = nil
}

func copyEntries(m map[string]*meta.Entry) map[string]*meta.Entry {
	out := make(map[string]*meta.Entry, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// PageEntries merges one listing page into a map of entries. With more
// pages to come it also returns the merger, which says where the listing
// stands (last) and holds the blobs whose prefix may still come: they are
// left out, so that a name is never shown with the wrong kind.
func PageEntries(prefix string, page blobstore.ListPage) (map[string]*meta.Entry, *PageMerger) {
	entries := map[string]*meta.Entry{}
	emit := func(it meta.Item) { entries[it.Name] = it.Entry }
	m := &PageMerger{Prefix: prefix}
	m.Add(page, emit)
	if page.NextMarker != "" {
		return entries, m
	}
	m.Flush(emit)
	return entries, nil
}
