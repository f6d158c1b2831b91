package fusefs

import (
	"context"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/listing"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// smallDirPage is the listing page size that a lookup spends to learn a
// whole directory at once.
const smallDirPage = 5000

// warmListing lists a directory in one request when it fits one page, so
// that the lookups of its names that follow (opening files by name, `cp`
// into it, stat of many names) cost nothing more: one request for the
// directory instead of a Stat and a List per name. It reports whether the
// listing is now cached; a directory found larger is remembered and probed
// name by name instead.
func (fs *FS) warmListing(ctx context.Context, dirPath string) bool {
	if !fs.lists.WorthListing(dirPath) {
		return false
	}
	prefix := ""
	if dirPath != "" {
		prefix = dirPath + "/"
	}
	fetch := fs.lists.BeginFetch(dirPath)
	page, err := fs.store.List(ctx, blobstore.ListOptions{Prefix: prefix, Delimiter: "/", MaxResults: smallDirPage})
	if err != nil {
		fs.lists.EndFetch(fetch)
		return false
	}
	// A listing that lacks a change this mount made meanwhile, which
	// could not be replayed onto it, is not cached; the caller then
	// probes the name.
	return fs.keepListing(dirPath, prefix, page, fetch)
}

// keepListing caches page, the first page of a listing of dirPath fetched
// since fetch began. It reports whether it was the whole directory, now
// cached. A directory with more pages is remembered as large (markLarge),
// and the page kept as a partial listing: a lookup of a name it holds, or
// of one before its end, costs no request (stat of a file in a large
// directory on a fresh mount: two requests, the probe of the directory,
// instead of four), and a readdir pass that starts while it is fresh goes
// on from it (`ls` of a large directory: the lookup's page is the pass's
// first).
func (fs *FS) keepListing(dirPath, prefix string, page blobstore.ListPage, fetch *listing.Fetch) bool {
	entries, more := listing.PageEntries(prefix, page)
	fs.mergeLocal(dirPath, entries)
	if more != nil {
		fs.lists.MarkLarge(dirPath)
		fs.lists.PutPartialFetched(entries, &listing.PassStart{Marker: page.NextMarker, Merger: *more}, fetch)
		return false
	}
	return fs.lists.PutFetched(entries, fetch)
}

// listSweepInterval is how often expired listings are dropped.
const listSweepInterval = 5 * time.Second

// sweepListings drops expired listings every listSweepInterval until the
// filesystem closes.
func (fs *FS) sweepListings() {
	defer fs.bg.Done()
	t := time.NewTicker(listSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-fs.ctx.Done():
			return
		case <-t.C:
			fs.lists.Sweep()
		}
	}
}

// refreshListing lists dirPath again in the background (claimRefresh).
func (fs *FS) refreshListing(dirPath string) {
	fs.bg.Add(1)
	go func() {
		defer fs.bg.Done()
		ctx, cf := context.WithTimeout(fs.ctx, time.Minute)
		defer cf()
		fs.warmListing(ctx, dirPath)
	}()
}

// mergeLocal adds the children of dirPath that exist only here: files
// created and not committed yet.
func (fs *FS) mergeLocal(dirPath string, entries map[string]*meta.Entry) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var dirNode *node
	if dirPath == "" {
		dirNode = fs.nodes.get(fuse.FUSE_ROOT_ID)
	} else {
		// Walk down the table; a directory not in it has no local children.
		dirNode = fs.nodes.get(fuse.FUSE_ROOT_ID)
		for _, part := range strings.Split(dirPath, "/") {
			if dirNode = fs.nodes.child(dirNode.id, part); dirNode == nil {
				return
			}
		}
	}
	if dirNode.children == 0 {
		return
	}
	for k, n := range fs.nodes.byName {
		if k.parent != dirNode.id || n.inStore {
			continue
		}
		if _, ok := entries[k.name]; !ok {
			entries[k.name] = &meta.Entry{Kind: n.kind, Size: n.size, Mtime: n.mtime, Pending: true, Attrs: n.attrs}
		}
	}
}

func (fs *FS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n, _, st := fs.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n.kind != meta.KindDir {
		return fuse.ENOTDIR
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	h := fs.newHandleLocked(n, nil, false, journal.IOCached, journal.OpenReply{})
	out.Fh = h.id
	return fuse.OK
}

func modeOf(k meta.Kind) uint32 {
	switch k {
	case meta.KindDir:
		return syscall.S_IFDIR
	case meta.KindSymlink:
		return syscall.S_IFLNK
	}
	return syscall.S_IFREG
}

// dirEntries returns h's pass and its entries, the first of them at
// position off unless the pass has ended before it. Offset 0 starts a new
// pass; so does any offset on a handle without one (restored after a
// restart: the new pass skips to off). The caller holds h.dirMu.
func (fs *FS) dirEntries(ctx context.Context, h *handle, off uint64) (*dirStream, []meta.Item, fuse.Status) {
	if off == 0 || h.dir == nil {
		path, ok := fs.pathOf(h.n)
		if !ok {
			return nil, nil, fuse.ENOENT
		}
		if h.dir != nil {
			h.dir.close()
		}
		h.dir = fs.newDirStream(path)
	}
	if off > uint64(maxPassLen) {
		return h.dir, nil, fuse.OK // past any pass's end
	}
	items, err := h.dir.await(ctx, int(off))
	if err != nil {
		return nil, nil, toStatus(err)
	}
	if int(off) >= len(items) {
		return h.dir, nil, fuse.OK
	}
	return h.dir, items[off:], fuse.OK
}

// maxPassLen bounds the offsets a pass honours: an offset past it (made up,
// not one a pass handed out) reads as the end.
const maxPassLen = 1 << 40

func (fs *FS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	ctx, cf := fs.readContext(in.Unique, in.Pid)
	defer cf()
	h.dirMu.Lock()
	defer h.dirMu.Unlock()
	s, items, st := fs.dirEntries(ctx, h, in.Offset)
	if !st.Ok() {
		return st
	}
	n := 0
	for _, it := range items {
		if !out.AddDirEntry(fuse.DirEntry{Name: it.Name, Mode: modeOf(it.Entry.Kind), Off: in.Offset + uint64(n) + 1}) {
			break
		}
		n++
	}
	s.read(int(in.Offset)+n, len(items) == 0)
	return fuse.OK
}

// ReadDirPlus hands out names with their attributes, so that `ls -l` needs
// no request per entry. Every entry with a node id is a kernel reference.
func (fs *FS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	ctx, cf := fs.readContext(in.Unique, in.Pid)
	defer cf()
	h.dirMu.Lock()
	defer h.dirMu.Unlock()
	s, items, st := fs.dirEntries(ctx, h, in.Offset)
	if !st.Ok() {
		return st
	}
	count := 0
	defer func() { s.read(int(in.Offset)+count, len(items) == 0) }()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if h.n.parent == 0 && h.n.id != fuse.FUSE_ROOT_ID {
		return fuse.ENOENT // removed while listing
	}
	for _, it := range items {
		e := out.AddDirLookupEntry(fuse.DirEntry{Name: it.Name, Mode: modeOf(it.Entry.Kind), Off: in.Offset + uint64(count) + 1})
		if e == nil {
			break
		}
		count++
		if it.Name == "." || it.Name == ".." {
			// The kernel takes no reference for these; node id 0 says so.
			*e = fuse.EntryOut{}
			continue
		}
		var n *node
		if !it.Entry.Pending {
			n = fs.bindEntryLocked(h.n.id, it.Name, *it.Entry)
		} else {
			n = fs.nodes.bind(h.n.id, it.Name, it.Entry.Kind)
		}
		fs.nodes.ref(n)
		fs.fillEntry(n, e)
	}
	return fuse.OK
}

func (fs *FS) ReleaseDir(in *fuse.ReleaseIn) {
	fs.mu.Lock()
	h := fs.dropHandleLocked(in.Fh)
	fs.mu.Unlock()
	if h != nil {
		h.dirMu.Lock()
		if h.dir != nil {
			h.dir.close()
			h.dir = nil
		}
		h.dirMu.Unlock()
	}
}

func (fs *FS) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fuse.OK // directory changes are synchronous
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]*meta.Entry) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
