package fusefs

import (
	"context"
	"sync"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/listing"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// A dirStream is one pass of a directory handle over its directory: what
// READDIR and READDIRPLUS hand out between two rewinds (offset 0).
//
// Entries reach the kernel as the pages of the store's listing arrive, not
// once the whole directory is listed. A pass that starts right after a
// lookup of the directory (`ls` on a fresh mount) goes on from the page
// of up to 5,000 names that the lookup fetched (keepListing); one that
// starts from the top asks for a small first page (firstListPage names),
// so that the first getdents waits for one short request; later pages are
// full ones. A fetcher goroutine stays up to one page ahead of the reader,
// so that the next page is on its way while the kernel takes the current
// one, and stops there: a reader that pauses costs no more requests, and
// what is fetched beyond what was read stays within a page.
//
// Offsets: the pass's entries are ".", "..", then the store's names in
// listing order (byte order of the blob names; a directory stands where
// its "name/" prefix does), then the names that exist only here (files
// created and not committed yet). The entry at position i (from 0) has
// d_off i+1: an offset is a position in the pass. Every entry handed out
// stays in the pass until it ends, so a getdents that continues after a
// pause, or a seekdir to any offset a telldir returned, resumes exactly
// where it left off; offset 0 starts a new pass, with a new listing (or
// the cached one, if fresh). A name is handed out at most once per pass
// (appendLocked, appendLocalLocked); names created or removed during the
// pass may or may not show, as POSIX allows, and no other name is lost or
// repeated. A pass keeps, for as long as the handle is open, a name and a
// pointer per entry; the entry itself (about 160 bytes) is shared with the
// listing the pass feeds in the listing cache, which adds its map's slot.
// Measured: about 240 bytes an entry in all while a directory of 1,000,000
// names is open (blobfs-dirbench -per-entry).
//
// A name that is both a blob and a prefix is one directory (a marker blob
// with children, usually): the blob comes first in the listing, so a blob
// is held back until the listing has passed where its prefix would be
// (pageMerger), which is at once unless the name is a prefix of the next
// one, and at worst the next page.
//
// The pass feeds the listing cache as it goes (listCache.startPass): a
// lookup of a name the pass has shown is answered without a request, and
// the listing, complete once the last page is in, lives for ListTimeout
// after the pass ends.
//
// After a restart the new process has the handle but no pass: a READDIR at
// offset n > 0 starts a new listing and skips its first n entries. That
// resumes exactly when the directory did not change meanwhile; otherwise a
// name may be repeated or skipped there.
//
// Locking: a handle's passes are serialised by handle.dirMu (the kernel
// sends one READDIR of a file at a time anyway); mu guards the fields
// below it, shared with the fetcher. mu is never taken under FS.mu.
type dirStream struct {
	fs     *FS
	dir    string // the directory's path, "" for the root
	prefix string // dir + "/", "" for the root
	fetch  *listing.Fetch
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	cond *sync.Cond // broadcast when items grow, or the listing ends or fails
	// items are the pass's entries in order, only ever appended: a reader
	// may keep a slice of them without mu.
	items  []meta.Item
	merger listing.PageMerger
	marker string // where the next page starts
	pages  int    // pages fetched
	// pageLen is the most names a page has brought: the fetcher stays
	// that far ahead of the reader.
	pageLen int
	// done: the store's listing ended and the local names are in items.
	done bool
	// err is the last page's failure; the reader who needs more gets it
	// and the next read tries again.
	err      error
	fetching bool // the fetcher runs
	closed   bool
	// want is one past the last position the reader asked for: the
	// fetcher stays a page ahead of it.
	want int
}

// dotEntry is the entry of "." and "..".
var dotEntry = &meta.Entry{Kind: meta.KindDir}

// newDirStream starts a pass over the directory at dir: from a fresh
// complete listing when the cache has one, else from the store.
func (fs *FS) newDirStream(dir string) *dirStream {
	s := &dirStream{fs: fs, dir: dir}
	if dir != "" {
		s.prefix = dir + "/"
	}
	s.cond = sync.NewCond(&s.mu)
	s.merger.Prefix = s.prefix
	s.items = append(s.items, meta.Item{Name: ".", Entry: dotEntry}, meta.Item{Name: "..", Entry: dotEntry})
	// A walker descending: the tree below may come from one flat
	// listing (fusefs/listing/treewalk.go).
	fs.lists.MaybeStartWalk(dir)
	fs.lists.AwaitWalk(dir)
	fs.lists.NotePassed(dir)
	if items, ok := fs.lists.Snapshot(dir, s.items); ok {
		s.items, s.done = items, true
		return s
	}
	s.ctx, s.cancel = context.WithCancel(fs.ctx)
	var start *listing.PassStart
	s.fetch, start = fs.lists.StartPass(dir)
	if start != nil {
		// The page a lookup of the directory fetched (keepListing).
		// s is not shared yet: no need for mu.
		for _, it := range start.Items {
			s.appendLocked(it)
		}
		s.marker, s.merger = start.Marker, start.Merger
		s.pages, s.pageLen = 1, max(len(start.Items), 1)
	}
	return s
}

// await returns the pass's entries, with at least one at position off
// unless the pass has fewer: it waits for the listing only when the
// entries at hand end before off, or are only "." and "..", and until ctx
// ends (its caller was killed: callerdeath.go); the listing goes on.
func (s *dirStream) await(ctx context.Context, off int) ([]meta.Item, error) {
	need := max(off, 2) // "." and ".." alone are not worth a reply
	s.mu.Lock()
	defer s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.want = max(s.want, need+1) // the fetcher goes on until len(items) > need
	for len(s.items) <= need && !s.done {
		if err := s.err; err != nil {
			s.err = nil // the next read tries again
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.startFetcherLocked()
		s.cond.Wait()
	}
	s.startFetcherLocked()
	return s.items, nil
}

// read records that the reader got the entries before position end, and
// whether it found nothing more (the end of the pass).
func (s *dirStream) read(end int, atEnd bool) {
	s.mu.Lock()
	s.want = max(s.want, end)
	s.startFetcherLocked()
	s.mu.Unlock()
	if atEnd {
		s.fs.lists.EndPass(s.fetch)
	} else {
		s.fs.lists.TouchPass(s.fetch)
	}
}

// close ends the pass: the fetcher stops, and the listing it fed lives on
// for ListTimeout from now.
func (s *dirStream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
	s.fs.lists.EndPass(s.fetch)
}

// startFetcherLocked starts the fetcher if the pass needs a page: the
// listing goes on, no page failed, and the pass is not a page ahead of
// the reader.
func (s *dirStream) startFetcherLocked() {
	if s.fetching || s.done || s.closed || s.err != nil || s.aheadLocked() {
		return
	}
	s.fetching = true
	s.fs.bg.Add(1)
	go s.fetcher()
}

// aheadLocked reports whether the entries at hand beyond what the reader
// asked for make a page.
func (s *dirStream) aheadLocked() bool {
	return s.pages > 0 && len(s.items)-s.want >= max(s.pageLen, 1)
}

// fetcher fetches pages until the listing ends, fails, or is a page ahead
// of the reader.
func (s *dirStream) fetcher() {
	defer s.fs.bg.Done()
	for {
		s.mu.Lock()
		if s.done || s.closed || s.aheadLocked() {
			s.fetching = false
			s.mu.Unlock()
			return
		}
		opts := blobstore.ListOptions{Prefix: s.prefix, Delimiter: "/", Marker: s.marker, MaxResults: listing.FullPage}
		if s.pages == 0 {
			opts.MaxResults = listing.FirstPage
		}
		s.mu.Unlock()

		s.fs.lists.PassFetching(s.fetch, true)
		page, err := s.fs.store.List(s.ctx, opts)
		if err != nil {
			s.fs.lists.PassFetching(s.fetch, false)
			s.mu.Lock()
			if !s.closed {
				if s.ctx.Err() == nil { // else the filesystem is closing
					s.fs.log.Warn("list failed", "path", s.dir, "err", err)
				}
				s.err = err
			}
			s.fetching = false
			s.cond.Broadcast()
			s.mu.Unlock()
			return
		}
		var added []meta.Item
		emit := func(it meta.Item) { added = append(added, it) }
		s.merger.Add(page, emit)
		last := s.merger.Last()
		if page.NextMarker == "" {
			s.merger.Flush(emit)
		} else if s.pages == 0 {
			// Too large for a lookup to list whole: probe names
			// in it one by one meanwhile (warmListing, probe).
			s.fs.lists.MarkLarge(s.dir)
		}
		var local map[string]*meta.Entry
		if page.NextMarker == "" {
			local = map[string]*meta.Entry{}
			s.fs.mergeLocal(s.dir, local)
		}
		s.fs.lists.PassPage(s.fetch, added, last)
		if local != nil {
			s.fs.lists.PassListed(s.fetch, local)
		}

		s.mu.Lock()
		s.pages++
		s.pageLen = max(s.pageLen, len(page.Blobs)+len(page.Prefixes))
		s.marker = page.NextMarker
		for _, it := range added {
			s.appendLocked(it)
		}
		if page.NextMarker == "" {
			s.appendLocalLocked(local)
			s.done = true
		}
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

// appendLocked adds it to the pass. The store lists each name once, in
// pages that follow each other; a page that repeated the last name of the
// one before would show it twice, and is caught here.
func (s *dirStream) appendLocked(it meta.Item) {
	if n := len(s.items); n > 0 && s.items[n-1].Name == it.Name {
		return
	}
	s.items = append(s.items, it)
}

// appendLocalLocked adds, at the end of the pass, the names that exist
// only here (files created and not uploaded yet) and that the pass has not
// shown: the store may have listed one whose upload ended meanwhile, or
// the pass started from a listing that held it. One scan of the pass,
// rather than an index of every name it holds, which cost about 50 bytes
// an entry for as long as the directory was open.
func (s *dirStream) appendLocalLocked(local map[string]*meta.Entry) {
	if len(local) == 0 {
		return
	}
	shown := make(map[string]bool, len(local))
	for _, it := range s.items {
		if _, ok := local[it.Name]; ok {
			shown[it.Name] = true
		}
	}
	for _, name := range sortedKeys(local) {
		if !shown[name] {
			s.items = append(s.items, meta.Item{Name: name, Entry: local[name]})
		}
	}
}
