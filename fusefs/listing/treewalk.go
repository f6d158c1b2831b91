package listing

import (
	"context"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// A treeWalk answers a directory walk (find, du, ls -R, os.walk, a data
// loader's scan) with one flat listing of the walked subtree instead of one
// listing per directory.
//
// Why: a store lists a prefix flat (no delimiter) at the speed of its pages,
// 5,000 names each, however the names are spread over directories; listing
// directory after directory pays a round trip (and on Azurite a scan) per
// directory. Measured before this (200 directories of 250 files on
// Azurite): find took 140 s, one flat listing of the same 50,000 blobs 11 s.
//
// When: a walk is taken to start when a directory P was read by a pass, and
// within walkWindow its first or second subdirectory in name order is opened
// (a walker descending in the order it read P). The walk lists P's prefix
// flat, page by page, and builds the listing of every directory below P as
// the pages come; a directory is complete once the listing has left its
// prefix (all names under a prefix are contiguous in any lexicographic
// order), and goes into the listing cache at once. Opening one of them then
// costs no request; a directory the listing has not reached yet waits for
// it while it is near (see awaitWalk), else is listed on its own as before.
// A directory nobody walks costs nothing: only a walker's descent starts a
// walk.
//
// Memory: the walk lists ahead of its walker at most Options.WalkAhead
// names (and at most half the process's listing budget) in directories not
// opened yet, then pauses until the walker opens them (or stops, when the
// walker has been gone for walkIdle). A directory still being built counts
// too: one larger than that ends the walk, and the walker lists it on its
// own, page by page. The next page is asked for while the last one is
// turned into listings.
//
// Freshness: the listings a walk builds are one listing in progress, as a
// directory pass's pages are (listCache.startPass): they stay fresh while
// the walk lists, then for ListTimeout after it ended or after their first
// use, whichever is later (keptByWalk). A name changed by another writer
// during a long walk shows as it was when the walk's page listed it. This
// mount's own changes are replayed onto every listing the walk builds; a
// directory removed or renamed in the walked tree is left out of the walk
// (skipLocked), and one at or above its root ends it.
//
// Locking: a walk's fields are guarded by its listCache's mu; the fetcher
// takes it per page, and never holds it while it takes FS.mu (mergeLocal).
type treeWalk struct {
	root   string // the walked directory's path, "" for the root
	prefix string // root + "/", "" for the root
	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{} // the walker opened a listing: a paused fetcher looks again

	// Guarded by listCache.mu:
	dirs map[string]*walkDir // directories being built, by path
	// putting are the directories completed and on their way into the
	// cache (walkPage to putWalked): a walker waits for them.
	putting   map[string]bool
	changes   map[string][]listChange // this mount's changes since the walk began, by directory
	nchanges  int
	last      string // the last blob name listed (full)
	ahead     int    // names in listings built and not opened yet (prefetched)
	building  int    // names in dirs
	activity  time.Time
	pages     int
	pageTime  time.Duration // total time of the pages
	paused    bool
	ended     bool
	endedAt   time.Time
	started   time.Time
	listedAll bool // the listing reached its end
	// skip are the directories below the root, with a "/" each, that
	// changed during the walk in a way it cannot replay (removed,
	// renamed): the walk builds no listing in them (skipLocked).
	skip []string
}

// maxWalkSkips bounds treeWalk.skip: a walk over a tree being reshaped
// that much ends.
const maxWalkSkips = 1000

// skipLocked leaves dir and everything below it out of w.
func (w *treeWalk) skipLocked(dir string) {
	if w.ended {
		return
	}
	p := dir + "/"
	for path, d := range w.dirs {
		if path == dir || strings.HasPrefix(path, p) {
			w.building -= len(d.entries)
			delete(w.dirs, path)
		}
	}
	if len(w.skip) < maxWalkSkips {
		w.skip = append(w.skip, p)
	} else {
		w.skip = []string{w.prefix} // everything: the walk builds nothing more
	}
}

// skipped reports whether name is in a directory w leaves out.
func (w *treeWalk) skipped(name string) bool {
	for _, p := range w.skip {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// walkDir is a directory the walk is building.
type walkDir struct {
	path    string
	entries map[string]*meta.Entry
	// entered: a name below it was listed, so it is complete once the
	// listing leaves its prefix. A directory known only from its marker
	// blob is complete once the listing has gone past where its names
	// would be.
	entered bool
}

const (
	// walkWindow is how soon after its parent's pass a subdirectory must
	// be opened for a walk to start.
	walkWindow = 10 * time.Second
	// walkIdle ends a paused walk whose walker has gone.
	walkIdle = 10 * time.Second
	// maxWalks bounds the walks of one mount at a time.
	maxWalks = 4
	// DefaultWalkAhead is Options.WalkAhead's default: about 25 MB of
	// listings (see docs/semantics.md for the bytes per name).
	DefaultWalkAhead = 100_000
)

// keptByWalk reports whether l, a listing w built (or the walked
// directory's own), is fresh because of the walk: while the walk lists,
// for ListTimeout after it ended, and, for a listing its walker has not
// used yet, for ListTimeout after the walker's last use of the walk. A
// listing used once lives on for ListTimeout from that use (usedLocked),
// as one a pass made does from the pass's end.
func (l *listing) keptByWalk(now time.Time, ttl time.Duration) bool {
	w := l.walk
	return w != nil && (!w.ended || now.Before(w.endedAt.Add(ttl)) || l.prefetched > 0 && now.Before(w.activity.Add(ttl)))
}

// covers reports whether dir is below w's root.
func (w *treeWalk) covers(dir string) bool {
	return w.root == "" && dir != "" || strings.HasPrefix(dir, w.prefix)
}

// hedge is how long a walker waits for the walk to reach a directory it has
// not reached yet before listing it on its own: two of the walk's pages,
// and before the first page lands, as long as the most that can be: the
// first page costs what the directory's own listing would (one request),
// and on a store that serves one request at a time (Azurite) listing it
// meanwhile would slow both down.
func (w *treeWalk) hedge() time.Duration {
	if w.pages == 0 {
		return maxHedge
	}
	return min(max(2*w.pageTime/time.Duration(w.pages), 200*time.Millisecond), maxHedge)
}

const maxHedge = 3 * time.Second

// MaybeStartWalk is called when a pass over dir begins. It starts a walk
// of dir's parent when dir is one of the parent's first two subdirectories
// and the parent was read within walkWindow, unless a walk covers dir
// already.
func (c *Cache) MaybeStartWalk(dir string) {
	wk := c.walker
	if wk == nil || c.walkAhead <= 0 || dir == "" {
		return
	}
	parent, _ := meta.SplitPath(dir)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ttl <= 0 || len(c.walks) >= maxWalks || c.walkCoveringLocked(dir) != nil {
		return
	}
	if t, ok := c.passed[parent]; !ok || c.now().Sub(t) > walkWindow {
		return
	}
	l := c.freshLocked(parent)
	if l == nil || !l.complete {
		return
	}
	subdirs := 0
	for _, name := range l.sortedLocked() {
		if l.entries[name].Kind != meta.KindDir {
			continue
		}
		if meta.JoinPath(parent, name) == dir {
			break
		}
		if subdirs++; subdirs == 2 {
			return // not a walker descending in order
		}
	}
	w := &treeWalk{root: parent, kick: make(chan struct{}, 1), dirs: map[string]*walkDir{}, putting: map[string]bool{},
		changes: map[string][]listChange{}, activity: c.now(), started: c.now()}
	if parent != "" {
		w.prefix = parent + "/"
	}
	w.ctx, w.cancel = context.WithCancel(wk.ctx)
	w.dirs[parent] = &walkDir{path: parent, entries: map[string]*meta.Entry{}, entered: true}
	l.walk = w // the parent's listing stays fresh while the walk is in use
	c.walks = append(c.walks, w)
	wk.bg.Add(1)
	go c.runWalk(w)
	wk.log.Debug("directory walk: listing the tree flat", "path", parent, "opened", dir)
}

// runWalk lists w's tree page by page, building its directories, until the
// listing ends, fails, or the walk is ended.
func (c *Cache) runWalk(w *treeWalk) {
	wk := c.walker
	defer wk.bg.Done()
	defer c.endWalk(w)
	// The next page is asked for as soon as a page arrives (when the
	// walk has room ahead of its walker), and the page is turned into
	// listings meanwhile: building 5,000 names' listings takes about as
	// long as a page's round trip to a nearby store.
	type fetched struct {
		page blobstore.ListPage
		took time.Duration
		err  error
	}
	fetch := func(marker string) <-chan fetched {
		ch := make(chan fetched, 1)
		wk.bg.Add(1)
		go func() {
			defer wk.bg.Done()
			start := time.Now()
			page, err := wk.store.List(w.ctx, blobstore.ListOptions{Prefix: w.prefix, MaxResults: FullPage, Marker: marker})
			ch <- fetched{page, time.Since(start), err}
		}()
		return ch
	}
	next := fetch("")
	for {
		f := <-next
		if f.err != nil {
			if w.ctx.Err() == nil {
				wk.log.Debug("directory walk: list failed; directories are listed one by one", "path", w.root, "err", f.err)
			}
			return
		}
		more := f.page.NextMarker != ""
		next = nil
		if more && c.walkHasRoom(w) {
			next = fetch(f.page.NextMarker)
		}
		done := c.walkPage(w, f.page, f.took)
		c.fillWalked(w, done)
		if !more {
			return
		}
		if next == nil {
			if !c.walkMayGoOn(w) {
				return
			}
			next = fetch(f.page.NextMarker)
		}
	}
}

// walkHasRoom reports whether w may list more now.
func (c *Cache) walkHasRoom(w *treeWalk) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !w.ended && w.ahead+w.building <= c.walkAheadLimit()
}

// walkAheadLimit is how many names a walk may hold ahead of its walkers:
// Options.WalkAhead, and at most half the process's listing budget.
func (c *Cache) walkAheadLimit() int {
	return int(min(int64(c.walkAhead), listBudget.limit.Load()/2))
}

// walkMayGoOn waits while w is WalkAhead names ahead of its walker, and
// reports whether the walk goes on.
func (c *Cache) walkMayGoOn(w *treeWalk) bool {
	for {
		c.mu.Lock()
		ended := w.ended
		over := w.ahead+w.building > c.walkAheadLimit()
		idle := c.now().Sub(w.activity) > walkIdle
		w.paused = over
		c.mu.Unlock()
		switch {
		case ended:
			return false
		case !over:
			return true
		case idle:
			return false
		}
		c.cond.Broadcast() // walkers waiting for a paused walk list on their own
		select {
		case <-w.kick:
		case <-w.ctx.Done():
			return false
		case <-time.After(time.Second):
		}
	}
}

// walkPage adds one page of w's flat listing, and returns the directories
// it completed (removed from w.dirs); the last page completes them all.
func (c *Cache) walkPage(w *treeWalk, page blobstore.ListPage, took time.Duration) []*walkDir {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.ended {
		return nil
	}
	w.pages++
	w.pageTime += took
	w.activity = c.now()
	var done []*walkDir
	for _, b := range page.Blobs {
		done = w.addBlobLocked(b, done)
	}
	for _, d := range done {
		w.building -= len(d.entries)
	}
	if page.NextMarker == "" {
		for path, d := range w.dirs {
			done = append(done, d)
			delete(w.dirs, path)
		}
		w.building = 0
		w.listedAll = true
	}
	if w.building > c.walkAheadLimit() {
		// One directory larger than the walk may hold: its walker
		// lists it page by page instead.
		c.endWalkLocked(w)
		return nil
	}
	for _, d := range done {
		w.putting[d.path] = true
	}
	c.cond.Broadcast() // walkers look again: the listing may be inside their directory now
	return done
}

// addBlobLocked adds one blob of the flat listing: first completing the
// directories the listing has left, then its name and every directory on
// its path.
func (w *treeWalk) addBlobLocked(b blobstore.Attrs, done []*walkDir) []*walkDir {
	name := b.Name
	w.last = name
	for path, d := range w.dirs {
		if path == w.root {
			continue
		}
		p := path + "/"
		if strings.HasPrefix(name, p) {
			continue
		}
		if d.entered || byteOrderSafe(name) && byteOrderSafe(p) && name > p {
			done = append(done, d)
			delete(w.dirs, path)
		}
	}
	if w.skipped(name) {
		return done
	}
	rel := strings.TrimPrefix(name, w.prefix)
	parts := strings.Split(rel, "/")
	for _, p := range parts {
		if meta.CheckName(p) != fuse.OK {
			return done // a name blobfs does not show (as pageMerger)
		}
	}
	dir := w.root
	for i, p := range parts {
		d := w.dirs[dir] // the root, or made at the step before
		old, had := d.entries[p]
		if !had {
			w.building++
		}
		child := meta.JoinPath(dir, p)
		if i < len(parts)-1 {
			// A directory on the name's path; a blob of the same
			// name listed before is that directory (its marker,
			// or a file that is both, shown as a directory).
			if !had || old.Kind != meta.KindDir {
				d.entries[p] = &meta.Entry{Kind: meta.KindDir}
			}
			cd := w.dirs[child]
			if cd == nil {
				cd = &walkDir{path: child, entries: map[string]*meta.Entry{}}
				w.dirs[child] = cd
			}
			cd.entered = true
			dir = child
			continue
		}
		e := meta.EntryOf(b)
		if had && old.Kind == meta.KindDir {
			continue // its names were listed already
		}
		d.entries[p] = &e
		if e.Kind == meta.KindDir && w.dirs[child] == nil {
			w.dirs[child] = &walkDir{path: child, entries: map[string]*meta.Entry{}}
		}
	}
	return done
}

// fillWalked puts the directories a walk completed into the listing cache,
// with the names that exist only here and this mount's changes since the
// walk began.
func (c *Cache) fillWalked(w *treeWalk, done []*walkDir) {
	for _, d := range done {
		c.walker.mergeLocal(d.path, d.entries)
	}
	if len(done) > 0 {
		c.putWalked(w, done)
	}
}

// putWalked stores the directories w completed.
func (c *Cache) putWalked(w *treeWalk, done []*walkDir) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.ended {
		return // spoiled, too large, or too many changes: its changes are gone
	}
	for _, d := range done {
		delete(w.putting, d.path)
		for _, ch := range w.changes[d.path] {
			if ch.removed {
				delete(d.entries, ch.name)
			} else {
				d.entries[ch.name] = ch.e
			}
		}
		w.nchanges -= len(w.changes[d.path])
		delete(w.changes, d.path)
		if w.skipped(d.path+"/") || d.path == w.root {
			// Changed while it was being built; or the walked
			// directory, whose listing from before the walk is
			// kept fresh by it and takes this mount's changes.
			continue
		}
		if l := c.freshLocked(d.path); l != nil && (l.pass != nil || l.walk == w) {
			// A pass is listing it already; or this walk put it
			// already, and a store listing out of order brought
			// more of its names: its listing, complete, stays.
			continue
		}
		if !c.putLocked(d.path, d.entries, 0, "") {
			continue
		}
		l := c.dirs[d.path]
		l.walk = w
		if t, ok := c.passed[d.path]; !ok || t.Before(w.started) {
			// Not read by the walker yet (one that did not wait
			// for the walk read it on its own): ahead of it.
			l.prefetched = len(d.entries)
			w.ahead += l.prefetched
		}
	}
	c.cond.Broadcast()
}

// endWalk ends w: its listings live on for ListTimeout after its walker's
// last use.
func (c *Cache) endWalk(w *treeWalk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endWalkLocked(w)
}

func (c *Cache) endWalkLocked(w *treeWalk) {
	if w.ended {
		return
	}
	w.ended, w.endedAt = true, c.now()
	w.cancel()
	w.dirs, w.changes, w.putting, w.building = nil, nil, nil, 0
	for i, v := range c.walks {
		if v == w {
			c.walks = append(c.walks[:i], c.walks[i+1:]...)
			break
		}
	}
	c.cond.Broadcast()
}

// walkCoveringLocked returns the walk in progress whose tree holds dir.
func (c *Cache) walkCoveringLocked(dir string) *treeWalk {
	for _, w := range c.walks {
		if !w.ended && w.covers(dir) {
			return w
		}
	}
	return nil
}

// AwaitWalk waits, when a walk in progress covers dir and has not built
// its listing yet, until it has: while the walk's listing is inside dir
// (dir's names are coming), and for up to hedge while it has not reached
// dir. It does not wait for an ended walk, or one paused at WalkAhead
// names ahead of its walkers even after this one's use, or once dir's names
// the walk holds make a page (the pass then streams them itself).
func (c *Cache) AwaitWalk(dir string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.walkCoveringLocked(dir)
	if w == nil {
		return
	}
	w.activity = c.now()
	deadline := time.Now().Add(w.hedge())
	timer := time.AfterFunc(time.Until(deadline), c.cond.Broadcast)
	defer timer.Stop()
	p := dir + "/"
	for {
		if l := c.freshLocked(dir); l != nil && l.complete {
			return
		}
		if w.ended || w.ahead+w.building > c.walkAheadLimit() {
			return // paused: ahead of its walkers by all it may be
		}
		if d := w.dirs[dir]; d != nil && len(d.entries) >= FullPage {
			return
		}
		inside := strings.HasPrefix(w.last, p)
		passed := w.last != "" && !inside && w.dirs[dir] == nil && !w.putting[dir] && byteOrderSafe(w.last) && byteOrderSafe(p) && w.last > p
		if passed || !inside && time.Now().After(deadline) {
			return
		}
		c.cond.Wait()
	}
}

// usedLocked records that the walker opened or looked up in l, a listing
// a walk built: the walk goes on while it is used, and a listing opened no
// longer counts as ahead of the walker.
func (c *Cache) usedLocked(l *listing) {
	w := l.walk
	if w == nil {
		return
	}
	w.activity = c.now()
	if l.prefetched > 0 {
		w.ahead -= l.prefetched
		l.prefetched = 0
		l.expiry = w.activity.Add(c.ttl) // lives on for ListTimeout from its first use
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// Walks counts the tree walks in progress, and those of them paused ahead
// of their walkers (walkMayGoOn).
func (c *Cache) Walks() (running, paused int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.walks {
		if w.paused {
			paused++
		}
	}
	return len(c.walks), paused
}
