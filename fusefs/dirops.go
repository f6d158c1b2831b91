package fusefs

import (
	"context"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// dirItem is one name in a directory handle's snapshot.
type dirItem struct {
	name  string
	entry dirEntry
}

// listDir lists a whole directory from the store, page by page, and merges
// in the files created here and not yet committed. The result is cached.
func (fs *FS) listDir(ctx context.Context, dirPath string) ([]string, map[string]dirEntry, error) {
	if names, entries, ok := fs.lists.snapshot(dirPath); ok {
		return names, entries, nil
	}
	prefix := ""
	if dirPath != "" {
		prefix = dirPath + "/"
	}
	fetch := fs.lists.beginFetch(dirPath)
	entries := map[string]dirEntry{}
	opts := blobstore.ListOptions{Prefix: prefix, Delimiter: "/"}
	for {
		page, err := fs.store.List(ctx, opts)
		if err != nil {
			fs.lists.endFetch(fetch)
			return nil, nil, err
		}
		addPage(entries, prefix, page)
		if page.NextMarker == "" {
			break
		}
		opts.Marker = page.NextMarker
	}
	fs.mergeLocal(dirPath, entries)
	fs.lists.putFetched(entries, fetch)
	names := make([]string, 0, len(entries))
	for name := range entries {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, entries, nil
}

// addPage adds one listing page's names to entries.
func addPage(entries map[string]dirEntry, prefix string, page blobstore.ListPage) {
	for _, b := range page.Blobs {
		name := strings.TrimPrefix(b.Name, prefix)
		if checkName(name) != fuse.OK {
			// Not representable as a file name (e.g. "a//b", or a
			// marker "dir/" some tools write): skip, never mangle.
			continue
		}
		e := entryFromAttrs(b)
		if old, ok := entries[name]; ok && old.kind == kindDir {
			continue // a prefix of the same name wins
		}
		entries[name] = e
	}
	for _, p := range page.Prefixes {
		name := strings.TrimSuffix(strings.TrimPrefix(p, prefix), "/")
		if checkName(name) != fuse.OK {
			continue
		}
		e := dirEntry{kind: kindDir}
		if old, ok := entries[name]; ok && old.kind == kindDir {
			e.mtime, e.attrs = old.mtime, old.attrs // the marker's
		}
		entries[name] = e
	}
}

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
	if !fs.lists.worthListing(dirPath) {
		return false
	}
	prefix := ""
	if dirPath != "" {
		prefix = dirPath + "/"
	}
	fetch := fs.lists.beginFetch(dirPath)
	page, err := fs.store.List(ctx, blobstore.ListOptions{Prefix: prefix, Delimiter: "/", MaxResults: smallDirPage})
	if err != nil {
		fs.lists.endFetch(fetch)
		return false
	}
	// A listing that lacks a change this mount made meanwhile, which
	// could not be replayed onto it, is not cached; the caller then
	// probes the name.
	return fs.keepListing(dirPath, prefix, page, fetch)
}

// keepListing caches page, the first page of a listing of dirPath fetched
// since fetch began, when it is the whole directory; a directory with more
// pages is remembered as large instead (markLarge). It reports whether a
// listing was cached.
func (fs *FS) keepListing(dirPath, prefix string, page blobstore.ListPage, fetch *listFetch) bool {
	if page.NextMarker != "" {
		fs.lists.endFetch(fetch)
		fs.lists.markLarge(dirPath)
		return false
	}
	entries := map[string]dirEntry{}
	addPage(entries, prefix, page)
	fs.mergeLocal(dirPath, entries)
	return fs.lists.putFetched(entries, fetch)
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
func (fs *FS) mergeLocal(dirPath string, entries map[string]dirEntry) {
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
			entries[k.name] = dirEntry{kind: n.kind, size: n.size, mtime: n.mtime, pending: true, attrs: n.attrs}
		}
	}
}

func copyEntries(m map[string]dirEntry) map[string]dirEntry {
	out := make(map[string]dirEntry, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (fs *FS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	n, _, st := fs.node(in.NodeId)
	if !st.Ok() {
		return st
	}
	if n.kind != kindDir {
		return fuse.ENOTDIR
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	h := fs.newHandleLocked(n, nil, false)
	out.Fh = h.id
	return fuse.OK
}

// loadDir fills the handle's snapshot when the stream starts (offset 0,
// also after rewinddir). Offsets are positions in the snapshot, so a
// listing that changes meanwhile never makes the stream skip or repeat.
func (fs *FS) loadDir(h *handle, off uint64) fuse.Status {
	if h.dirLoaded && off != 0 {
		return fuse.OK
	}
	path, ok := fs.pathOf(h.n)
	if !ok {
		return fuse.ENOENT
	}
	ctx, cf := fs.reqContext()
	defer cf()
	names, entries, err := fs.listDir(ctx, path)
	if err != nil {
		fs.log.Warn("list failed", "path", path, "err", err)
		return toStatus(err)
	}
	items := make([]dirItem, 0, len(names)+2)
	items = append(items, dirItem{name: ".", entry: dirEntry{kind: kindDir}}, dirItem{name: "..", entry: dirEntry{kind: kindDir}})
	for _, name := range names {
		items = append(items, dirItem{name: name, entry: entries[name]})
	}
	h.dirItems, h.dirLoaded = items, true
	return fuse.OK
}

func modeOf(k nodeKind) uint32 {
	switch k {
	case kindDir:
		return syscall.S_IFDIR
	case kindSymlink:
		return syscall.S_IFLNK
	}
	return syscall.S_IFREG
}

func (fs *FS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	h.dirMu.Lock()
	defer h.dirMu.Unlock()
	if st := fs.loadDir(h, in.Offset); !st.Ok() {
		return st
	}
	for i := int(in.Offset); i < len(h.dirItems); i++ {
		it := h.dirItems[i]
		if !out.AddDirEntry(fuse.DirEntry{Name: it.name, Mode: modeOf(it.entry.kind), Off: uint64(i + 1)}) {
			break
		}
	}
	return fuse.OK
}

// ReadDirPlus hands out names with their attributes, so that `ls -l` needs
// no request per entry. Every entry with a node id is a kernel reference.
func (fs *FS) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	h := fs.handle(in.Fh)
	if h == nil {
		return fuse.EBADF
	}
	h.dirMu.Lock()
	defer h.dirMu.Unlock()
	if st := fs.loadDir(h, in.Offset); !st.Ok() {
		return st
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if h.n.parent == 0 && h.n.id != fuse.FUSE_ROOT_ID {
		return fuse.ENOENT // removed while listing
	}
	for i := int(in.Offset); i < len(h.dirItems); i++ {
		it := h.dirItems[i]
		e := out.AddDirLookupEntry(fuse.DirEntry{Name: it.name, Mode: modeOf(it.entry.kind), Off: uint64(i + 1)})
		if e == nil {
			break
		}
		if it.name == "." || it.name == ".." {
			// The kernel takes no reference for these; node id 0 says so.
			*e = fuse.EntryOut{}
			continue
		}
		n := fs.nodes.bind(h.n.id, it.name, it.entry.kind)
		if !(n.file != nil && n.file.hasSpill.Load()) && !it.entry.pending {
			fs.applyEntryLocked(n, it.entry)
		}
		fs.nodes.ref(n)
		fs.fillEntry(n, e)
	}
	return fuse.OK
}

func (fs *FS) ReleaseDir(in *fuse.ReleaseIn) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.dropHandleLocked(in.Fh)
}

func (fs *FS) FsyncDir(_ <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fuse.OK // directory changes are synchronous
}
