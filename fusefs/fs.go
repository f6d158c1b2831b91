package fusefs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/listing"
	"github.com/blobfs/blobfs/fusefs/memory"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/blobfs/blobfs/fusefs/upload"
)

// FS is the blobfs filesystem: a fuse.RawFileSystem over one container.
// It can be driven by any FUSE transport; Mount serves it on /dev/fuse.
//
// The storage layout is blobfuse2's, so containers are interchangeable:
// directories are name prefixes plus zero-length marker blobs with metadata
// hdi_isfolder=true, symlinks are blobs with is_symlink=true whose content is
// the target.
type FS struct {
	fuse.RawFileSystem // ENOSYS for the operations not implemented here

	store blobstore.Store
	// blockMD5 is blobstore.ChecksBlockMD5(store): a streamed block's
	// MD5 is worth computing in the pass that hashes it into the blob's
	// (blockStream.send).
	blockMD5 bool
	opts     Options
	log      *slog.Logger
	spillDir string
	spills   spillPool // emptied spill files, reused (spillpool.go)
	// spillLock holds this filesystem's flock on the spill directory
	// (spillrecover.go): exclusive while it recovers orphans, shared
	// after. orphansDone is closed once recovery has ended.
	spillLock   *os.File
	orphansDone chan struct{}
	// noSpillRecords: the cache directory keeps no extended attributes,
	// so spill files carry no record (spillrecover.go).
	noSpillRecords atomic.Bool
	blocks         *cache.BlockCache
	lists          *listing.Cache
	// prefetcher fetches the next small files of a directory read file
	// by file (fileprefetch.go).
	prefetcher filePrefetcher
	// directIOMmap: the kernel agreed to FUSE_DIRECT_IO_ALLOW_MMAP, so
	// large read-only files may be opened with FOPEN_DIRECT_IO (set by
	// the Session, see directRead).
	directIOMmap atomic.Bool
	// up stages files' blocks while they are written, lends the buffers
	// of blocks being uploaded (up.Buffers: at most 2 × UploadConcurrency
	// at once over all files, within the process's memory budget), and
	// counts the bytes still to upload (Stats).
	up *upload.Uploader
	// chunks serves random reads (cache.ChunkCache). readBytes counts the
	// bytes READs returned from the store's content, src.Fetched the bytes
	// downloaded for reads (blocks, read-ahead, prefetch, chunks, disk
	// fills): their ratio is the read amplification (Stats).
	chunks *cache.ChunkCache
	// src is where the block and chunk caches read: the disk cache, then
	// the store.
	src *cache.Sources
	// disk is the disk cache under the block and chunk caches; nil
	// without one. passthrough opens files it holds whole so that the
	// kernel reads them itself (passthrough.go).
	disk        *cache.DiskTier
	passthrough passthrough
	// sums checks whole reads against the blobs' Content-MD5
	// (fusefs/contentsum); nil with Options.NoContentCheck.
	sums *contentsum.Checks
	// writeBackPending sums the sizes of the files whose write-back
	// upload has not ended; writeBackSlots bounds those uploading
	// (writeback.go). keptFiles counts the files whose data went to
	// lost+found because it could not be uploaded (Stats.KeptFiles).
	writeBackPending atomic.Int64
	writeBackSlots   chan struct{}
	keptFiles        atomic.Int64
	// reusedBytes counts the bytes commits named in the blob's committed
	// block list instead of uploading them again (upload.Stream).
	reusedBytes atomic.Int64
	readBytes   atomic.Int64
	// ctx lives as long as the filesystem; background work uses it.
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup
	// bgClosed: Close is waiting for bg, which may take no more
	// (startBackground); guarded by bgMu.
	bgMu     sync.Mutex
	bgClosed bool

	// adoptInit is the INIT request of a mount restored from a state
	// region: the mount is live and must be adopted, not mounted.
	adoptInit []byte
	// reads are the read-only requests a killed caller may end early
	// (callerdeath.go).
	reads readRequests
	// crashHook, set by tests only, is called at the crash points of
	// requests (crashPoint).
	crashHook func(where string)

	mu         sync.Mutex
	nodes      *nodeTable         // guarded by mu
	handles    map[uint64]*handle // guarded by mu
	nextHandle uint64             // guarded by mu
	intents    *journal.IntentLog // guarded by mu; see exactlyonce.go
}

var _ fuse.RawFileSystem = (*FS)(nil)

// New returns a filesystem over store. Options are validated here.
func New(store blobstore.Store, opts Options) (*FS, error) {
	if store == nil {
		return nil, errors.New("fusefs: nil store")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	spillDir := filepath.Join(opts.CacheDir, "spill")
	if err := os.MkdirAll(spillDir, 0o700); err != nil {
		return nil, fmt.Errorf("spill directory: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fs := &FS{
		RawFileSystem:  fuse.NewDefaultRawFileSystem(),
		store:          store,
		blockMD5:       blobstore.ChecksBlockMD5(store),
		opts:           opts,
		log:            slog.New(newAuthWarnLimiter(opts.Logger.Handler())),
		spillDir:       spillDir,
		spills:         newSpillPool(spillDir),
		lists:          listing.NewCache(opts.ListTimeout, 1_000_000, opts.WalkAhead),
		writeBackSlots: make(chan struct{}, writeBackSlots),
		ctx:            ctx,
		cancel:         cancel,
		nodes:          newNodeTable(),
		handles:        map[uint64]*handle{},
		nextHandle:     1,
		intents:        journal.NewIntentLog(),
		orphansDone:    make(chan struct{}),
	}
	fs.lists.StartWalks(store, ctx, &fs.bg, fs.log, fs.mergeLocal)
	fs.src = &cache.Sources{Store: store, Log: fs.log}
	fs.up = &upload.Uploader{Store: store, BlockMD5: fs.blockMD5, BlockSize: opts.UploadBlockSize, WriteBack: opts.WriteBack, Buffers: memory.NewUploads(2*opts.UploadConcurrency, opts.UploadBlockSize), Ctx: ctx, Log: fs.log}
	fs.blocks = cache.NewBlockCache(fs.src, opts.ReadBlockSize, opts.BlockCacheBytes-cache.ChunkCapacity(opts.BlockCacheBytes, opts.ReadBlockSize), opts.MaxReadAheadBlocks)
	fs.passthrough.devFD.Store(-1)
	fs.chunks = cache.NewChunkCache(fs.src, cache.ChunkCapacity(opts.BlockCacheBytes, opts.ReadBlockSize))
	if opts.DiskCache != nil {
		ns := opts.StoreID
		if ns == "" {
			ns = fmt.Sprintf("mount %p", fs)
		}
		fs.disk = cache.NewDiskTier(opts.DiskCache, ns)
		fs.src.Disk = fs.disk
	}
	if !opts.NoContentCheck {
		fs.sums = contentsum.NewChecks(fs.log, func(name, etag string) {
			fs.blocks.DropVersion(name, etag)
			fs.chunks.DropVersion(name, etag)
			fs.disk.Forget(name, etag)
		})
		fs.src.Sums = fs.sums
	}
	if opts.State != nil {
		if err := fs.attachState(opts.State); err != nil {
			cancel()
			return nil, fmt.Errorf("state region: %w", err)
		}
	}
	// After the restore, which says which spill files are still in use;
	// before serving, which makes new ones.
	fs.recoverOrphans(ctx)
	fs.bg.Add(1)
	go fs.sweepListings()
	return fs, nil
}

// Options returns the options in effect, defaults filled in.
func (fs *FS) Options() Options { return fs.opts }

// CacheStats returns the block cache's hits and misses since the mount
// began: reads answered from memory, and reads that had to fetch.
func (fs *FS) CacheStats() (hits, misses uint64) { return fs.blocks.Stats() }

// Stats is what a mount holds that the store does not have yet, and what
// it keeps in memory and on disk: the gauges of its metrics.
type Stats struct {
	// DirtyFiles and DirtyBytes: open files with changes the store does
	// not have, and their sizes.
	DirtyFiles int
	DirtyBytes int64
	// UploadingBytes: bytes still to upload: blocks a file being written
	// sequentially has sent and the store has not acknowledged yet, and
	// what the commits under way (at close, fsync, rename, write-back)
	// have still to send.
	UploadingBytes int64
	// SpillBytes: disk space the spill files of open files take.
	SpillBytes int64
	// CacheBytes: memory of the read block cache.
	CacheBytes int64
	// CacheHits and CacheMisses as CacheStats.
	CacheHits, CacheMisses uint64
	// ReadBytes: bytes READs returned from the store's content.
	// FetchedBytes: bytes downloaded for reads (blocks, read-ahead,
	// prefetched files, random reads' chunks). FetchedBytes/ReadBytes is
	// the read amplification.
	ReadBytes, FetchedBytes int64
	// DiskReadBytes: bytes the block and chunk caches took from the disk
	// cache instead of the store. PassthroughOpens: opens the kernel
	// serves from a disk cache file itself (their reads are in neither
	// count).
	DiskReadBytes    int64
	PassthroughOpens int64
	// WriteBackBytes: sizes of the closed files whose upload runs in the
	// background (Options.WriteBack). KeptFiles: files whose data could
	// not be uploaded and is kept in the cache directory's lost+found.
	WriteBackBytes int64
	KeptFiles      int64
	// ContentVerified: whole reads of blobs that matched their
	// Content-MD5. ContentMismatches: those that did not, and failed.
	ContentVerified, ContentMismatches int64
	// ReusedBytes: bytes that commits did not upload again, the full
	// blocks of the file's previous commit named in the new block list.
	ReusedBytes int64
}

// Stats returns the mount's Stats now. It costs a stat of each open file's
// spill file: meant for a metrics scrape, not for every request.
func (fs *FS) Stats() Stats {
	var s Stats
	files := fs.openFiles()
	for _, of := range files {
		of.mu.Lock()
		if of.spill != nil {
			if fi, err := of.spill.Stat(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					s.SpillBytes += st.Blocks * 512
				}
			}
			if of.dirty() && !of.unlinked {
				s.DirtyFiles++
				s.DirtyBytes += of.size
			}
		}
		of.mu.Unlock()
	}
	s.UploadingBytes = fs.up.Uploading.Load()
	s.CacheBytes = fs.blocks.Usage() + fs.chunks.Usage()
	s.CacheHits, s.CacheMisses = fs.blocks.Stats()
	s.ReadBytes, s.FetchedBytes = fs.readBytes.Load(), fs.src.Fetched.Load()
	if fs.disk != nil {
		s.DiskReadBytes = fs.disk.Hits()
	}
	s.PassthroughOpens = fs.passthrough.opens.Load()
	s.WriteBackBytes, s.KeptFiles = fs.writeBackPending.Load(), fs.keptFiles.Load()
	s.ContentVerified, s.ContentMismatches = fs.sums.Stats()
	s.ReusedBytes = fs.reusedBytes.Load()
	return s
}

func (fs *FS) String() string { return "blobfs" }

func (fs *FS) SetDebug(bool) {}

// Init is not called by the ProtocolServer transport; the session handles
// INIT itself.
func (fs *FS) Init(*fuse.Server) {}

// reqContext is the context of a request: it ends with the file system
// only. Requests run to their end whatever signal their caller gets (a
// read-only one ends early only when its caller is killed: readContext,
// callerdeath.go), as in libfuse file systems mounted without -o intr.
// The kernel sends a FUSE_INTERRUPT whenever the
// calling thread gets any signal (the Go runtime sends SIGURG to preempt),
// and a request abandoned on it answered EINTR: a change may have reached
// the store all the same, and the retry the Go runtime (and many C
// programs) makes at once then found it done: mkdir failed with EEXIST,
// unlink and rename with ENOENT (39 of 500 os.Mkdir calls of a Go program
// on Azurite). A lookup or read slower than the signals' interval failed
// over and over. A SIGKILLed caller waits for the answer to a change it
// made; the store's per-try timeout and retries bound how long a request
// can take (about 10 minutes for a store that never answers;
// docs/reference.md, "Timeouts and retries").
func (fs *FS) reqContext() (context.Context, context.CancelFunc) {
	return context.WithCancel(fs.ctx)
}

// --- attributes --------------------------------------------------------

func (fs *FS) fillAttr(n *node, a *fuse.Attr) {
	sh := fs.attrOf(n)
	*a = fuse.Attr{Ino: n.id, Owner: fuse.Owner{Uid: sh.uid, Gid: sh.gid}, Blksize: 1 << 20}
	size := n.size
	if n.file != nil {
		if s, ok := n.file.spilledSize(); ok {
			size = s
		}
	}
	a.Mode = meta.KindType(n.kind, n.attrs.Special) | sh.perm
	switch n.kind {
	case meta.KindDir:
		a.Nlink = 2 + uint32(n.subdirs)
		a.Size = 4096
	case meta.KindSpecial:
		a.Nlink = 1
		a.Rdev = n.attrs.Rdev
	default:
		a.Nlink = 1
		a.Size = uint64(size)
	}
	if n.parent == 0 && n.id != fuse.FUSE_ROOT_ID {
		a.Nlink = 0 // unlinked, still open
	}
	a.Blocks = (a.Size + 511) / 512
	mt := n.mtime
	if mt.IsZero() {
		mt = fs.nodes.rootTime
	}
	if n.touched.After(mt) {
		mt = n.touched
	}
	at, ct := n.attrs.Atime, n.attrs.Ctime
	if at.IsZero() {
		at = mt
	}
	if ct.Before(mt) {
		ct = mt // a content change is a status change
	}
	a.SetTimes(&at, &mt, &ct)
}

func (fs *FS) fillEntry(n *node, out *fuse.EntryOut) {
	out.NodeId = n.id
	out.Generation = 1
	out.SetEntryTimeout(fs.opts.EntryTimeout)
	out.SetAttrTimeout(fs.opts.AttrTimeout)
	fs.fillAttr(n, &out.Attr)
}

// applyEntryLocked records what the store (or a listing) says about n,
// unless n's content is held locally and newer, or n's passthrough
// handles read another version: then n keeps the attributes of the
// version they read and gives up its name (supersedeLocked).
func (fs *FS) applyEntryLocked(n *node, e meta.Entry) {
	if n.file != nil && n.file.hasSpill.Load() {
		return
	}
	if n.io.pinnedToOtherVersion(e) {
		fs.supersedeLocked(n)
		return
	}
	n.size, n.mtime, n.etag, n.sum = e.Size, e.Mtime, e.ETag, e.Sum
	n.inStore = !e.Pending
	if !e.Pending || !n.attrsKnown {
		// A pending entry is this mount's own: the node has the
		// attributes it was made with. Times this mount moved in
		// memory only (reads, renames) stay when they are newer.
		at, ct := n.attrs.Atime, n.attrs.Ctime
		n.attrs = e.Attrs
		if n.attrsKnown && at.After(n.attrs.Atime) {
			n.attrs.Atime = at
		}
		if n.attrsKnown && ct.After(n.attrs.Ctime) {
			n.attrs.Ctime = ct
		}
		n.attrsKnown = true
	}
	if e.Target != "" {
		n.target = e.Target
	}
	n.attrExpiry = time.Now().Add(fs.opts.AttrTimeout)
}

func (fs *FS) attrFresh(n *node) bool {
	if n.kind == meta.KindDir {
		return true // directories carry no data to go stale
	}
	if !n.inStore || (n.file != nil && n.file.hasSpill.Load()) {
		return true
	}
	return time.Now().Before(n.attrExpiry)
}

// bindingFresh tells whether n's name can be trusted without asking the
// store again.
func (fs *FS) bindingFresh(n *node) bool {
	if n.kind == meta.KindDir {
		return time.Now().Before(n.attrExpiry)
	}
	return fs.attrFresh(n)
}

// pathOf returns the blob name of n.
func (fs *FS) pathOf(n *node) (string, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.nodes.path(n)
}

// fileState returns what a read from the store needs about n.
func (fs *FS) fileState(n *node) (path, etag string, size int64, inStore, ok bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	path, ok = fs.nodes.path(n)
	return path, n.etag, n.size, n.inStore, ok
}

// storedSum returns the Content-MD5 of n's blob at version etag, if known.
func (fs *FS) storedSum(n *node, etag string) contentsum.Sum {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if n.etag != etag {
		return contentsum.Sum{}
	}
	return n.sum
}

// node returns the node for id and its path.
func (fs *FS) node(id uint64) (*node, string, fuse.Status) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes.get(id)
	if n == nil {
		return nil, "", fuse.Status(syscall.ESTALE)
	}
	p, ok := fs.nodes.path(n)
	if !ok {
		if n.superseded {
			// Its name now has a node for a newer version: the
			// kernel looks the name up again (LOOKUP_REVAL) and
			// retries an open(2) or stat(2) that met this one.
			return n, "", fuse.Status(syscall.ESTALE)
		}
		// Unlinked but still open: reachable by handle only.
		return n, "", fuse.ENOENT
	}
	return n, p, fuse.OK
}

// --- resolving names ---------------------------------------------------

// probe asks the store what path is: a blob, a directory (marker or
// prefix), or nothing. Two requests run in parallel, a Stat of path and a
// listing of "path/"; a name that is both a blob and a prefix is a
// directory.
//
// The listing asks for a whole page (smallDirPage names) rather than one
// name: it is one request either way, and a directory that fits the page
// is then known whole, so the readdir or the lookups in it that usually
// follow cost nothing more. On Azurite, an `ls -l` of 1,000 files cost a
// probe (3-5 ms) before the listing (about 90 ms) that the probe's own
// request now is. A directory found larger than a page is remembered
// (markLarge) and probed with a one-name listing for a while, as a path
// walked through it would otherwise fetch a page it does not use.
func (fs *FS) probe(ctx context.Context, path string) (meta.Entry, error) {
	var (
		attrs   blobstore.Attrs
		statErr error
		page    blobstore.ListPage
	)
	prefix := path + "/"
	pageSize := 1
	var fetch *listing.Fetch
	if fs.lists.WorthListing(path) {
		pageSize, fetch = smallDirPage, fs.lists.BeginFetch(path)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		attrs, statErr = fs.store.Stat(gctx, path)
		if errors.Is(statErr, blobstore.ErrNotFound) {
			return nil
		}
		return statErr
	})
	g.Go(func() error {
		var err error
		page, err = fs.store.List(gctx, blobstore.ListOptions{Prefix: prefix, Delimiter: "/", MaxResults: pageSize})
		return err
	})
	err := g.Wait()
	isDir := len(page.Blobs) > 0 || len(page.Prefixes) > 0
	if fetch != nil {
		if err == nil && isDir {
			fs.keepListing(path, prefix, page, fetch)
		} else {
			fs.lists.EndFetch(fetch) // not a directory: nothing to keep
		}
	}
	if err != nil {
		return meta.Entry{}, err
	}
	if isDir {
		e := meta.Entry{Kind: meta.KindDir}
		if statErr == nil {
			// A marker too: the directory's attributes.
			m := meta.EntryOf(attrs)
			e.Mtime, e.Attrs = m.Mtime, m.Attrs
		}
		return e, nil
	}
	if statErr != nil {
		return meta.Entry{}, statErr
	}
	return meta.EntryOf(attrs), nil
}

// resolve finds name in directory dir and returns its node (no lookup
// reference taken).
func (fs *FS) resolve(ctx context.Context, dir *node, dirPath, name string) (*node, error) {
	fs.mu.Lock()
	if n := fs.nodes.child(dir.id, name); n != nil && fs.bindingFresh(n) {
		fs.mu.Unlock()
		return n, nil
	}
	fs.mu.Unlock()

	path := meta.JoinPath(dirPath, name)
	e, found, ok := fs.lists.Lookup(dirPath, name)
	if !ok {
		if n := fs.listedDir(dir, name, path); n != nil {
			return n, nil
		}
	}
	if !ok && fs.lists.SecondMiss(dirPath) && fs.warmListing(ctx, dirPath) {
		e, found, ok = fs.lists.Lookup(dirPath, name)
	} else if ok && fs.lists.ClaimRefresh(dirPath) {
		fs.refreshListing(dirPath)
	}
	if ok && !found {
		return nil, blobstore.ErrNotFound
	}
	if !ok {
		var err error
		if e, err = fs.probe(ctx, path); err != nil {
			return nil, err
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.bindEntryLocked(dir.id, name, e), nil
}

// bindEntryLocked binds (parent, name) to a node for entry e and records
// e on it. A node whose passthrough handles read another version than e
// keeps that version and gives the name to a new node: the kernel then
// makes a new inode for it, whose opens read e's version.
func (fs *FS) bindEntryLocked(parent uint64, name string, e meta.Entry) *node {
	n := fs.nodes.bind(parent, name, e.Kind)
	if n.io.pinnedToOtherVersion(e) {
		fs.supersedeLocked(n)
		n = fs.nodes.bind(parent, name, e.Kind)
	}
	fs.applyEntryLocked(n, e)
	return n
}

// listedDir renews the binding of directory name in dir, and returns its
// node, when a fresh listing of the directory itself holds names from the
// store: the directory exists as of that listing, which a probe would only
// confirm. A directory in use is listed again in the background every
// ListTimeout (claimRefresh) while its own name, unlisted in a parent
// nobody lists, was probed again each time its binding expired: two
// requests each second for a directory read file by file, each scanning
// the container on Azurite (60 ms of 1.5 s reading 1,000 files there).
// The node keeps its other attributes (a marker blob's mtime).
func (fs *FS) listedDir(dir *node, name, path string) *node {
	if !fs.lists.HoldsStoreNames(path) {
		return nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := fs.nodes.child(dir.id, name)
	if n == nil || n.kind != meta.KindDir {
		return nil
	}
	n.attrExpiry = time.Now().Add(fs.opts.AttrTimeout)
	return n
}

// --- FUSE operations: names and attributes ------------------------------

func (fs *FS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	dir, dirPath, st := fs.node(h.NodeId)
	if !st.Ok() {
		return st
	}
	if dir.kind != meta.KindDir {
		return fuse.ENOTDIR
	}
	if st := meta.CheckName(name); !st.Ok() {
		if st == fuse.Status(syscall.ENAMETOOLONG) {
			return st
		}
		// Such a name cannot exist in the store.
		return fuse.ENOENT
	}
	ctx, cf := fs.readContext(h.Unique, h.Pid)
	defer cf()
	n, err := fs.resolve(ctx, dir, dirPath, name)
	if errors.Is(err, blobstore.ErrNotFound) {
		// A negative entry: the kernel remembers "no such name".
		out.NodeId = 0
		out.SetEntryTimeout(fs.opts.NegativeTimeout)
		if fs.opts.NegativeTimeout == 0 {
			return fuse.ENOENT
		}
		return fuse.OK
	}
	if err != nil {
		if !callerGone(ctx) {
			fs.log.Warn("lookup failed", "path", meta.JoinPath(dirPath, name), "err", err)
		}
		return toStatus(err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.nodes.ref(n)
	fs.fillEntry(n, out)
	return fuse.OK
}

func (fs *FS) Forget(nodeid, nlookup uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.nodes.forget(nodeid, nlookup)
}

func (fs *FS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	fs.mu.Lock()
	n := fs.nodes.get(in.NodeId)
	if n == nil {
		fs.mu.Unlock()
		return fuse.Status(syscall.ESTALE)
	}
	path, attached := fs.nodes.path(n)
	// A node restored from the state region knows only its name: its
	// attributes are asked for once, even while its content is fresh.
	needAttrs := !n.attrsKnown && n.inStore && attached && n.id != fuse.FUSE_ROOT_ID
	if (fs.attrFresh(n) || !attached) && !needAttrs {
		fs.mu.Unlock()
		fs.countSubdirs(n, path)
		return fs.answerAttr(n, out)
	}
	fs.mu.Unlock()

	ctx, cf := fs.readContext(in.Unique, in.Pid)
	defer cf()
	a, err := fs.store.Stat(ctx, path)
	fs.mu.Lock()
	err = fs.applyStatLocked(n, a, err)
	fs.mu.Unlock()
	if err != nil {
		if !errors.Is(err, blobstore.ErrNotFound) && !callerGone(ctx) {
			fs.log.Warn("getattr failed", "path", path, "err", err)
		}
		return toStatus(err)
	}
	fs.countSubdirs(n, path)
	return fs.answerAttr(n, out)
}

// applyStatLocked records what a Stat of n's path returned (a, err): a
// file's size, times and attributes, a directory's attributes (its
// marker's; one without a marker shows the defaults: its existence is not
// in question here, a lookup established it). The caller holds FS.mu.
func (fs *FS) applyStatLocked(n *node, a blobstore.Attrs, err error) error {
	if n.kind == meta.KindDir {
		switch {
		case err == nil:
			n.attrs, n.attrsKnown = meta.ParsePosix(a.Metadata), true
			if t, ok := meta.Mtime(a.Metadata); ok {
				n.mtime = t
			}
		case errors.Is(err, blobstore.ErrNotFound):
			n.attrsKnown = true
		default:
			return err
		}
		return nil
	}
	if err != nil {
		return err
	}
	fs.applyEntryLocked(n, meta.EntryOf(a))
	if !n.attrsKnown {
		// Its content is local and newer; its attributes are the blob's.
		n.attrs, n.attrsKnown = meta.ParsePosix(a.Metadata), true
	}
	return nil
}

// loadAttrs reads the stored attributes of a node that does not have them
// yet (one restored from the state region after a restart knows only its
// name), so that a change starts from what is stored, not from the
// mount's defaults written over it.
func (fs *FS) loadAttrs(ctx context.Context, n *node, path string) error {
	fs.mu.Lock()
	need := !n.attrsKnown && n.inStore && path != "" && n.id != fuse.FUSE_ROOT_ID
	fs.mu.Unlock()
	if !need {
		return nil
	}
	a, err := fs.store.Stat(ctx, path)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.applyStatLocked(n, a, err)
}

// answerAttr fills out with n's attributes as they are now.
func (fs *FS) answerAttr(n *node, out *fuse.AttrOut) fuse.Status {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.fillAttr(n, &out.Attr)
	out.SetTimeout(fs.opts.AttrTimeout)
	return fuse.OK
}

func (fs *FS) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	n, path, st := fs.node(in.NodeId)
	if n == nil {
		return st
	}
	ctx, cf := fs.reqContext()
	defer cf()
	if err := fs.loadAttrs(ctx, n, path); err != nil {
		fs.log.Warn("setattr failed", "path", path, "err", err)
		return toStatus(err)
	}

	mode, setMode := in.GetMode()
	uid, setUID := in.GetUID()
	gid, setGID := in.GetGID()
	size, setSize := in.GetSize()
	atime, setAtime := in.GetATime()
	mtime, setMtime := in.GetMTime()
	fs.mu.Lock()
	cur := fs.attrOf(n)
	fs.mu.Unlock()
	setMode = setMode && mode&0o7777 != cur.perm
	setUID = setUID && uid != cur.uid
	setGID = setGID && gid != cur.gid
	if !setMode && !setUID && !setGID && !setSize && !setAtime && !setMtime {
		return fs.answerAttr(n, out)
	}
	if fs.opts.ReadOnly {
		return fuse.EROFS
	}
	// The kernel (default_permissions) has checked who may change what,
	// and asks to clear set-user-ID and set-group-ID bits where POSIX
	// says so (a write, a chown by someone else than root). Attributes
	// the store cannot keep are refused, never accepted and lost.
	if (setMode || setUID || setGID) && fs.opts.NoAttrWrites ||
		setMode && fs.opts.ForcePerm || (setUID || setGID) && fs.opts.ForceOwner ||
		setMode && n.kind == meta.KindSymlink { // a link's mode is always 0777
		return fuse.EPERM
	}
	if (setAtime || setMtime) && fs.opts.NoAttrWrites && n.kind == meta.KindDir {
		return fuse.OK // directory times were never stored; tar and rsync set them
	}
	if setSize {
		if n.kind != meta.KindFile {
			return fuse.EINVAL
		}
		if err := fs.truncate(ctx, n, int64(size)); err != nil {
			if errors.Is(err, syscall.EFBIG) {
				// Beyond the largest file the spill directory holds:
				// the caller's mistake, answered, not blobfs failing.
				fs.log.Debug("truncate beyond the largest file", "path", path, "size", size, "err", err)
			} else {
				fs.log.Warn("truncate failed", "path", path, "err", err)
			}
			return toStatus(err)
		}
	}
	if setMode || setUID || setGID || setAtime || setMtime {
		now := time.Now()
		fs.mu.Lock()
		// The kernel holds the inode's lock through a setattr, so no
		// other change of these attributes comes meanwhile: a failed
		// store puts the old ones back.
		was, wasKnown := n.attrs, n.attrsKnown
		a := &n.attrs
		if setMode {
			a.Perm, a.HasPerm = mode&0o7777, true
		} else if !a.HasPerm && !fs.opts.NoAttrWrites && !fs.opts.ForcePerm {
			a.Perm, a.HasPerm = cur.perm, true // what it showed, now stored
		}
		if setUID || setGID || !a.HasUID && !fs.opts.NoAttrWrites && !fs.opts.ForceOwner {
			a.UID, a.GID, a.HasUID, a.HasGID = cur.uid, cur.gid, true, true
			if setUID {
				a.UID = uid
			}
			if setGID {
				a.GID = gid
			}
		}
		if setAtime {
			a.Atime = atime
		}
		a.Ctime = now
		n.attrsKnown = true
		fs.mu.Unlock()
		var mt *time.Time
		if setMtime {
			mt = &mtime
		}
		if err := fs.storeAttrs(ctx, n, path, mt); err != nil {
			fs.mu.Lock()
			n.attrs, n.attrsKnown = was, wasKnown
			fs.mu.Unlock()
			fs.log.Warn("setattr failed", "path", path, "err", err)
			return toStatus(err)
		}
		fs.mu.Lock()
		if setMtime {
			n.mtime = mtime
			n.touched = time.Time{}
		}
		fs.mu.Unlock()
		fs.refreshEntry(n, path)
	}
	return fs.answerAttr(n, out)
}

// countSubdirs updates a directory node's count of subdirectories (its
// nlink) from its cached listing, if it has one. It takes FS.mu itself:
// the listing cache's lock is never taken under it.
func (fs *FS) countSubdirs(n *node, path string) {
	if n.kind != meta.KindDir {
		return
	}
	if c, ok := fs.lists.SubdirCount(path); ok {
		fs.mu.Lock()
		n.subdirs = c
		fs.mu.Unlock()
	}
}

// refreshEntry puts n's attributes into its directory's cached listing, so
// that a readdirplus or a lookup answered from the listing shows them.
func (fs *FS) refreshEntry(n *node, path string) {
	if path == "" {
		return
	}
	fs.mu.Lock()
	e := meta.Entry{Kind: n.kind, Size: n.size, Mtime: n.mtime, ETag: n.etag, Sum: n.sum, Target: n.target, Pending: !n.inStore, Attrs: n.attrs}
	fs.mu.Unlock()
	dir, name := meta.SplitPath(path)
	if _, found, ok := fs.lists.Lookup(dir, name); ok && found {
		fs.lists.Set(dir, name, e)
	}
}

// truncate sets a file's size, through its open state if it has one, else
// with a short-lived one committed at once.
func (fs *FS) truncate(ctx context.Context, n *node, size int64) error {
	of := fs.acquireFile(n)
	defer fs.releaseFile(of)
	if err := of.truncate(ctx, size); err != nil {
		return err
	}
	fs.mu.Lock()
	n.mtime = time.Now()
	open := of.refs > 1
	fs.mu.Unlock()
	if open {
		return nil // committed at flush/release of the handles
	}
	return of.commit(ctx)
}

func (fs *FS) StatFs(_ <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	// A container has no fixed capacity: report a large, constant one so
	// that tools checking free space proceed.
	const blocks = 1 << 40
	*out = fuse.StatfsOut{
		Blocks: blocks, Bfree: blocks, Bavail: blocks,
		Files: 1 << 32, Ffree: 1 << 32,
		Bsize: 4096, Frsize: 4096, NameLen: meta.MaxComponent,
	}
	return fuse.OK
}

func (fs *FS) Access(_ <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	if in.Mask&fuse.W_OK != 0 && fs.opts.ReadOnly {
		return fuse.EROFS
	}
	return fuse.OK
}

// Extended attributes: blobfs stores none. ENOSYS makes the kernel stop
// asking (each call then fails with EOPNOTSUPP at once): otherwise it asks
// for security.capability before the first write to every file, one more
// round trip per file written.
func (fs *FS) GetXAttr(_ <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	return 0, fuse.ENOSYS
}

func (fs *FS) ListXAttr(_ <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	return 0, fuse.ENOSYS
}

func (fs *FS) SetXAttr(_ <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return fuse.ENOSYS
}

func (fs *FS) RemoveXAttr(_ <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return fuse.ENOSYS
}

func (fs *FS) Link(_ <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.EPERM // blobs cannot share content
}

func (fs *FS) Fallocate(_ <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return fuse.ENOTSUP
}

func (fs *FS) Tmpfile(_ <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return fuse.ENOTSUP
}

// startBackground counts one more goroutine in bg, unless Close is
// waiting for them already (WaitGroup.Add must not race its Wait).
func (fs *FS) startBackground() bool {
	fs.bgMu.Lock()
	defer fs.bgMu.Unlock()
	if fs.bgClosed {
		return false
	}
	fs.bg.Add(1)
	return true
}

// Close stops background work. Call it after the mount is gone; a file
// whose upload is still being retried gets one last attempt, and its data is
// kept on local disk if that fails too.
func (fs *FS) Close() {
	fs.cancel()
	fs.bgMu.Lock()
	fs.bgClosed = true
	fs.bgMu.Unlock()
	fs.bg.Wait()
	fs.lists.Clear()
	fs.blocks.Close()
	fs.spills.close()
	if fs.spillLock != nil {
		fs.spillLock.Close()
	}
}
