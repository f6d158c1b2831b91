package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/blobfs/blobfs/fusefs/upload"
)

// openFile is the content of a file while handles are open on it, shared by
// all of them (two writers of one file write into one place, as on a local
// disk).
//
// Writes go to a spill file in the cache directory; a WRITE is answered only
// once its bytes are there. A file that already has content in the store is
// read into the spill file on its first write or partial truncate
// (read-modify-write); a file opened with O_TRUNC or created here is not
// read at all. commit uploads the spill file (one Put, or staged blocks in
// parallel for large files) on flush, fsync and release. Reads through any
// handle go to the spill file once it exists, otherwise to the store through
// the block cache.
//
// Consistency: every commit is conditional on what the writer saw when it
// opened the file, so that a change by another writer (another mount, or
// any client of the store) since then is reported (ESTALE at fsync and
// close, the writer's data kept in lost+found) instead of being silently
// overwritten. An open records the blob's ETag, or that there was none
// (openedForWrite); the first commit requires it (If-Match, or
// If-None-Match when there was none), whether the file was truncated at
// open (O_TRUNC), created (O_CREAT, with or without O_EXCL) or is
// rewritten in place. A spill file loaded from a blob that is no longer
// the one seen at open keeps the condition of the open: it loads what is
// there, so that reads stay coherent, and its commit fails. After a
// commit, the next one is conditional on the ETag this mount wrote
// (baseETag), so handles of one mount never conflict with each other.
//
// Streaming: a file written sequentially from empty (a copy, a download, a
// log being created) has each full upload block staged in the background as
// soon as it is written, so that close only uploads the tail and commits.
// A write into a block already staged abandons streaming for this file; the
// commit then uploads the whole spill file.
//
// Locking: mu guards the fields below it. commitMu serialises commits; an
// upload runs without mu so that writes go on meanwhile (gen tells whether
// they did, and the file stays dirty if so). Lock order: mu, then FS.mu;
// never mu while holding FS.mu (attributes read the atomic mirrors instead).
type openFile struct {
	fs *FS
	n  *node // its path may change (rename) while open

	refs int // open handles and background uploads; guarded by FS.mu
	// keptFailed: a commit failed for good and the changes went to
	// lost+found (FS.keepFailed); the name then shows the store's version.
	keptFailed atomic.Bool

	commitMu sync.Mutex

	mu sync.Mutex
	// writeBackQueued: a background upload of this file has started and
	// not ended (writeback.go).
	writeBackQueued bool
	// writeBackReserved is what a FLUSH that left the upload for later
	// counted against the write-back bound (flushNow), until the upload
	// starts and takes it over or the file turns out clean. Counted at the
	// FLUSH, not at the RELEASE that follows it asynchronously: closes in
	// a row would otherwise all see the bound before any RELEASE.
	writeBackReserved int64
	spill             *os.File
	spillPath         string
	size              int64
	gen               uint64 // bumped by every change
	committedGen      uint64
	// baseETag is the If-Match of the next commit: the ETag the spill
	// file was loaded from or this file last committed.
	baseETag string
	// openETag is the blob's ETag that the writers saw at open, or when
	// the spill file was made if no open recorded one; "" if there was
	// none (exclusive) or it is unknown (a spill file restored without
	// its record). The next commit's If-Match while baseETag is empty,
	// and what a lost session's spill file is uploaded on the condition
	// of (spillrecover.go).
	openETag string
	// opened: an open recorded openETag and exclusive (openedForWrite)
	// since the last write handle was released, and the spill file made
	// next takes them instead of the node's current view.
	opened bool
	// openSum and openSize are the content the writers saw at open (the
	// blob's Content-MD5, when it has one), loadedSum and loadedSize the
	// content the spill file was loaded from: a condition that fails
	// because only the blob's metadata changed (a chmod through another
	// mount, or the store API) is not another writer (sameContent).
	openSum, loadedSum   contentsum.Sum
	openSize, loadedSize int64
	// attrsChanged: this mount changed the file's attributes since its
	// last commit; a commit over another client's metadata change keeps
	// this mount's attributes then, and the other's otherwise.
	attrsChanged bool
	// writers counts the open write handles; guarded by FS.mu.
	writers int
	// recorded is the spill file's record as last written.
	recorded string
	baseMeta map[string]string // metadata kept across rewrites
	// exclusive: the writer saw no blob (or opened with O_EXCL): the
	// first commit has If-None-Match.
	exclusive bool
	mtime     *time.Time // set by utimes; written as metadata
	unlinked  bool
	commitErr error // the last failed commit
	// commitNonce names the pending commit (blobstore.MetaCommit): made
	// and journaled before the first attempt, kept by retries, also in a
	// process that adopts the mount, and cleared once one succeeded. The
	// journaling before a commit's first attempt also brings the region
	// and the record up to date with what changed unjournaled since (a
	// rename's new path, a copy's ETag), so it is not to be made ahead.
	commitNonce string

	stream *upload.Stream // staging of full blocks while writing; nil if none
	// streamName is the blob name streaming stages blocks under, set at
	// open; a rename before the commit abandons those blocks.
	streamName atomic.Pointer[string]

	hasSpill  atomic.Bool  // spill != nil; readable without mu
	localSize atomic.Int64 // size, when hasSpill; readable without mu
}

func (of *openFile) setSizeLocked(size int64) {
	of.size = size
	of.localSize.Store(size)
}

func (of *openFile) dirty() bool { return of.gen != of.committedGen }

// spilledSize returns the size held in the spill file, if there is one.
// It takes no lock, so FS.mu holders may call it.
func (of *openFile) spilledSize() (int64, bool) {
	if !of.hasSpill.Load() {
		return 0, false
	}
	return of.localSize.Load(), true
}

// ensureSpillLocked creates the spill file. With load, the blob's current
// content is copied into it first.
func (of *openFile) ensureSpillLocked(ctx context.Context, load bool) error {
	if of.spill != nil {
		return nil
	}
	f, err := of.fs.spills.get()
	if err != nil {
		return fmt.Errorf("create spill file: %w", err)
	}
	of.setSizeLocked(0)
	of.recorded = ""
	path, etag, size, inStore, ok := of.fs.fileState(of.n)
	if !of.opened {
		// No open recorded what it saw (a truncate by name): the change
		// starts from the node as this mount knows it now.
		of.seenLocked(etag, inStore)
	}
	if load {
		if !ok {
			// The file lost its name without this mount unlinking it
			// (an unlink here keeps its content first): another writer
			// deleted its blob, and this mount gave the name to a new
			// file. There is nothing to read, as when the deletion is
			// found by the Stat below.
			of.fs.spills.put(f)
			return fmt.Errorf("%w: its blob was deleted and the name is another file's now", blobstore.ErrNotFound)
		}
		if inStore {
			a, err := of.fs.store.Stat(ctx, path)
			if err == nil {
				size, etag = a.Size, a.ETag
				of.loadedSum, of.loadedSize = contentsum.Of(a.ContentMD5), a.Size
				of.baseMeta = a.Metadata
				of.fs.recordLoading(f, path)
				err = of.fs.download(ctx, path, etag, size, contentsum.Of(a.ContentMD5), f)
			}
			if err != nil {
				of.fs.spills.put(f)
				return err
			}
			of.fs.crashPoint("load", "downloaded", path)
			of.baseETag = etag
			if of.opened && !of.exclusive && of.openETag != "" && etag != of.openETag &&
				of.openSum.Known() && of.openSum == of.loadedSum && of.openSize == of.loadedSize {
				// Only the metadata changed since the open (a chmod
				// through another mount): the content the writers saw
				// is what was loaded, under its new ETag.
				of.fs.log.Debug("metadata changed in the store since it was opened; the content is the one seen at open", "path", path)
			} else if of.opened && (of.openETag != "" || of.exclusive) && etag != of.openETag {
				// Replaced (or created) since the writer opened it:
				// reads see what is there now, but the commit keeps
				// the condition of the open, and fails, rather than
				// write over a change the writer never saw. (An open
				// that knew no ETag leaves the loaded one.)
				of.fs.log.Debug("changed in the store since it was opened; its commit will fail", "path", path, "open", of.openETag, "now", etag)
				of.baseETag = of.openETag
				// The condition stands for the content seen at open,
				// not the one loaded.
				of.loadedSum, of.loadedSize = of.openSum, of.openSize
			}
			of.setSizeLocked(size)
		}
	}
	of.spill, of.spillPath = f, f.Name()
	of.hasSpill.Store(true)
	// Journaled as dirty at once: the change that needed the spill file
	// follows, and a successor must upload it.
	of.journalLocked(true)
	if of.size == 0 && of.gen == of.committedGen {
		if name := of.streamName.Load(); name != nil {
			of.stream = of.fs.up.NewStream(*name)
		}
	}
	return nil
}

// keepContent loads the blob into the spill file of a file that is about
// to lose its name through this mount (unlink, or a rename over it) while
// write handles are open on it and nothing is loaded yet. POSIX keeps the
// file for those handles until its last close, and a write or a truncate
// that keeps some of it must start from its content; once the blob is
// deleted or replaced there is nothing to load that from. The content is
// loaded before, only when writers are open: a file held by readers alone
// costs nothing, a file opened for writing and unlinked costs its
// download at the unlink, written to again or not. (Deferring the Delete
// to the last close instead would leave the name in the store for other
// mounts, and after a crash.) A blob already gone is nothing to keep: a
// later change that needs its content fails as it would have.
func (of *openFile) keepContent(ctx context.Context) error {
	of.fs.mu.Lock()
	writers := of.writers
	of.fs.mu.Unlock()
	if writers == 0 {
		return nil
	}
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill != nil || of.unlinked {
		return nil
	}
	if err := of.ensureSpillLocked(ctx, true); err != nil && !errors.Is(err, blobstore.ErrNotFound) {
		return fmt.Errorf("keep the content of an open file losing its name: %w", err)
	}
	return nil
}

// openedForWrite records what a writer saw when it opened the file: the
// blob's ETag, or (inStore false) that there was none. Its commit is
// conditional on it. A file with a spill file already keeps its own
// condition: the content there is this mount's, loaded or committed by it,
// and a handle opened now writes on top of it.
func (of *openFile) openedForWrite(etag string, inStore bool, sum contentsum.Sum, size int64) {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill != nil {
		return
	}
	of.seenLocked(etag, inStore)
	of.openSum, of.openSize = sum, size
	of.opened = true
}

func (of *openFile) seenLocked(etag string, inStore bool) {
	of.openETag, of.exclusive = "", !inStore
	if inStore {
		of.openETag = etag
	}
}

// writerReleased is called when the last write handle on the file is
// released: what those writers saw no longer matters to a spill file made
// later (by a truncate by name while readers hold the file open).
func (of *openFile) writerReleased() {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill == nil {
		of.opened = false
	}
}

// conditionsLocked returns the condition of the next commit: the blob as
// this file loaded or committed it, else as its writers saw it at open.
// It is unconditional only when that is unknown: a spill file restored
// from a state region without its own record (spillrecover.go).
func (of *openFile) conditionsLocked() blobstore.Conditions {
	switch {
	case of.baseETag != "":
		return blobstore.Conditions{IfMatch: of.baseETag}
	case of.exclusive:
		return blobstore.Conditions{IfNoneMatch: true}
	case of.openETag != "":
		return blobstore.Conditions{IfMatch: of.openETag}
	}
	return blobstore.Conditions{}
}

func (of *openFile) write(ctx context.Context, data []byte, off int64) error {
	of.mu.Lock()
	defer of.mu.Unlock()
	if err := of.ensureSpillLocked(ctx, true); err != nil {
		return err
	}
	if _, err := of.spill.WriteAt(data, off); err != nil {
		return fmt.Errorf("spill write: %w", err)
	}
	of.setSizeLocked(max(of.size, off+int64(len(data))))
	of.mtime = nil // a write makes the file's time now again
	of.changedLocked()
	if st := of.stream; st != nil {
		if off < st.Next() || of.size-st.Next() >= st.BlockSize() && !of.streamNamedLocked(st) {
			st.Abandon()
			of.stream = nil
		} else if err := st.StageFull(of.spill, of.size); err != nil {
			st.Abandon()
			of.stream = nil
		}
	}
	return nil
}

// streamNamedLocked tells whether st stages its blocks under the file's
// name, checked before each full block is handed out: blocks staged for a
// name the file no longer has (renamed while written, or after an early
// commit that left the stream in place) are of no use to its commit.
func (of *openFile) streamNamedLocked(st *upload.Stream) bool {
	path, ok := of.fs.pathOf(of.n)
	return ok && path == st.Name()
}

func (of *openFile) truncate(ctx context.Context, size int64) error {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill == nil && size == 0 {
		// Nothing of the old content survives: no need to read it.
		if err := of.ensureSpillLocked(ctx, false); err != nil {
			return err
		}
		of.baseETag = ""
	} else if err := of.ensureSpillLocked(ctx, true); err != nil {
		return err
	}
	// A truncate to the length the spill file has already (O_TRUNC or
	// create on a fresh one) is skipped: besides a syscall, ext4 turns
	// a truncate to 0 followed by writes into a flush to disk at close
	// (auto_da_alloc), which costs every small file created here a
	// disk write it does not need.
	if size != of.size {
		if err := of.spill.Truncate(size); err != nil {
			return fmt.Errorf("spill truncate: %w", err)
		}
	}
	if st := of.stream; st != nil && size < st.Next() {
		st.Abandon()
		of.stream = nil
	}
	of.setSizeLocked(size)
	of.mtime = nil
	of.changedLocked()
	return nil
}

// readLocal reads from the spill file; ok is false when there is none.
func (of *openFile) readLocal(p []byte, off int64) (n int, ok bool, err error) {
	if !of.hasSpill.Load() {
		return 0, false, nil
	}
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill == nil {
		return 0, false, nil
	}
	if off >= of.size {
		return 0, true, nil
	}
	p = p[:min(int64(len(p)), of.size-off)]
	n, err = of.spill.ReadAt(p, off)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return n, true, err
}

// setAttrs stores the node's attributes (and mtime, when given) for an
// open file. While the file has changes not yet uploaded they go with its
// next commit (handled, nothing else to do); otherwise into the blob's
// metadata at once, conditional on the content the spill file holds.
func (of *openFile) setAttrs(ctx context.Context, path string, mtime *time.Time) (handled bool, err error) {
	of.commitMu.Lock()
	defer of.commitMu.Unlock()
	of.mu.Lock()
	defer of.mu.Unlock()
	of.attrsChanged = true
	if of.dirty() && of.spill != nil && !of.unlinked {
		if mtime != nil {
			of.mtime = mtime
		}
		of.changedLocked()
		of.recordLocked(true) // the attributes, for a successor
		return true, nil
	}
	if path == "" {
		return true, nil // unlinked: nothing to store
	}
	if of.spill == nil {
		// Nothing loaded yet: the blob's metadata is written here, under
		// mu, so that a writer's first change cannot load the blob
		// between this write and the condition moving with it.
		before, a, err := of.fs.setAttrsInStoreFrom(ctx, of.n, path, "", mtime)
		if err != nil {
			return true, err
		}
		if of.opened && !of.exclusive && of.openETag == before {
			// This mount's own metadata change is not another writer:
			// the content the writers saw at open is still the blob's,
			// under the ETag the change gave it. Without this, the
			// first write after a chmod or utime would load the blob,
			// find a new ETag and fail its commit (ESTALE).
			of.openETag = a.ETag
		}
		of.fs.mu.Lock()
		of.fs.applyEntryLocked(of.n, meta.EntryOf(a))
		of.fs.mu.Unlock()
		return true, nil
	}
	a, err := of.fs.setAttrsInStore(ctx, of.n, path, of.baseETag, mtime)
	if err != nil {
		return true, err
	}
	// The store has the time now. A later commit follows a write, which
	// makes the time now again: it drops the key from baseMeta.
	of.mtime = nil
	of.baseETag = a.ETag
	of.baseMeta = a.Metadata
	of.journalLocked(false)
	of.fs.mu.Lock()
	of.n.etag = a.ETag
	if mtime != nil {
		of.n.mtime = *mtime
	}
	of.fs.mu.Unlock()
	return true, nil
}

// changedLocked marks a change; the first one after a commit is journaled,
// so that a successor process knows the spill file must be uploaded.
func (of *openFile) changedLocked() {
	wasClean := !of.dirty()
	of.gen++
	if wasClean && of.spill != nil {
		of.journalLocked(true)
	}
}

// journalLocked records the spill file and upload state in the state
// region, and in the spill file's own record.
func (of *openFile) journalLocked(dirty bool) {
	seen, _ := of.seenContentLocked()
	of.fs.journalFile(of.n, journal.SavedFile{SpillPath: of.spillPath, BaseETag: of.baseETag, Dirty: dirty, Exclusive: of.exclusive,
		CommitNonce: of.commitNonce, SeenSum: seen.sum, SeenSize: seen.size})
	of.recordLocked(dirty)
}

// commit uploads the spill file if the file has changes not in the store.
func (of *openFile) commit(ctx context.Context) error {
	of.commitMu.Lock()
	defer of.commitMu.Unlock()

	of.mu.Lock()
	if !of.dirty() || of.unlinked {
		of.mu.Unlock()
		return nil
	}
	if of.spill == nil {
		// Only metadata changed (utimes on an unopened file's handle):
		// nothing to upload here; setattr wrote it already.
		of.committedGen = of.gen
		of.mu.Unlock()
		return nil
	}
	c := of.planCommitLocked()
	of.mu.Unlock()

	path, ok := of.fs.pathOf(of.n)
	if !ok {
		return of.commitWithoutName(c)
	}
	attrs, streamed, err := of.uploadCommit(ctx, path, &c)
	if err == nil {
		of.fs.crashPoint("commit", "store", path)
	}
	of.mu.Lock()
	if err != nil {
		of.commitErr = err
		of.mu.Unlock()
		if isConflict(err) {
			err = commitConflict{err}
		}
		return fmt.Errorf("upload %q: %w", path, err)
	}
	of.committedLocked(c, attrs, streamed)
	of.mu.Unlock()
	of.fs.committed(of.n, path, attrs, c.size)
	return nil
}

// commitPlan is what one commit uploads and under which condition, taken
// from the open file at its start (planCommitLocked).
type commitPlan struct {
	gen  uint64 // the change the commit covers
	size int64
	f    *os.File // the spill file
	opts blobstore.PutOptions
	// nonce names the commit in the blob's metadata, so that a retry,
	// or the next process, knows its own earlier attempt.
	nonce string
	// seen and attrsChanged: the content this file's writers saw, and
	// whether this mount changed its attributes since (a failed
	// condition over the same content is not another writer).
	seen         seenContent
	attrsChanged bool
	// stream holds the blocks staged while the file was written; nil to
	// upload it whole.
	stream *upload.Stream
}

// planCommitLocked builds the commit of the spill file as it is now: its
// metadata, the condition, the nonce (journaled before the store can hold
// it) and the block stream it uses up. The caller holds of.mu.
func (of *openFile) planCommitLocked() commitPlan {
	c := commitPlan{gen: of.gen, size: of.size, f: of.spill}
	c.opts = blobstore.PutOptions{Metadata: meta.Copy(of.baseMeta)}
	// The node's attributes as they are now (a chmod while writing
	// waits for this commit); the content changes, so the blob's
	// Last-Modified is its mtime and ctime unless utimensat set one.
	of.fs.mu.Lock()
	of.fs.attrsMetaLocked(of.n, c.opts.Metadata)
	of.fs.mu.Unlock()
	meta.Delete(c.opts.Metadata, blobstore.MetaMtime)
	meta.Delete(c.opts.Metadata, blobstore.MetaRcloneMtime)
	meta.Delete(c.opts.Metadata, blobstore.MetaCtime)
	if of.mtime != nil {
		c.opts.Metadata[blobstore.MetaMtime] = strconv.FormatInt(of.mtime.UnixNano(), 10)
	}
	if of.commitNonce == "" {
		of.commitNonce = newCommitNonce()
		of.journalLocked(true) // before the store can hold it
	}
	c.nonce = of.commitNonce
	c.opts.Metadata[blobstore.MetaCommit] = c.nonce
	c.opts.Conditions = of.conditionsLocked()
	c.seen, c.attrsChanged = of.seenContentLocked()
	// A stream that staged blocks is used up by this commit, whatever
	// happens: later changes go up whole. One that staged none yet stays
	// for the writes that follow: a FLUSH before the first full block is
	// common (a shell's "> file" and dd open the file, dup2 it and close
	// the first descriptor), and would otherwise leave the whole file to
	// be uploaded at its last close, after every write.
	c.stream = of.stream
	if c.stream != nil && c.stream.Next() == 0 {
		c.stream = nil
	} else {
		of.stream = nil
	}
	return c
}

// commitWithoutName ends a commit of a file that has no name in this
// mount: nothing to upload when it was unlinked or replaced through the
// mount; else a conflict.
func (of *openFile) commitWithoutName(c commitPlan) error {
	if c.stream != nil {
		c.stream.Abandon()
	}
	of.mu.Lock()
	unlinked := of.unlinked
	if !unlinked {
		// Not unlinked or replaced through this mount, yet without a
		// name: its directory was removed, after another writer deleted
		// the blob (rmdir found the directory empty). Its data is not
		// dropped in silence: a conflict, kept in lost+found.
		of.commitErr = errNameLost
	}
	of.mu.Unlock()
	if unlinked {
		return nil
	}
	return fmt.Errorf("upload %q: %w", of.n.name, errNameLost)
}

// uploadCommit uploads the commit to path: through its block stream when
// it has one, else whole (through a stream of its own for a large file),
// then over its own earlier attempt or another mount's metadata change
// when the condition failed on those alone. streamed says whether the
// blocks of the stream it used can be kept for the next commit.
func (of *openFile) uploadCommit(ctx context.Context, path string, c *commitPlan) (attrs blobstore.Attrs, streamed bool, err error) {
	stream, f, size := c.stream, c.f, c.size
	if stream != nil && stream.Name() == path && stream.Next() > 0 {
		attrs, err = stream.Commit(ctx, f, size, c.opts)
		if err != nil {
			of.fs.log.Debug("streamed commit failed; uploading the whole file", "path", path, "err", err)
		}
		if streamed = err == nil; streamed {
			of.fs.reusedBytes.Add(stream.Reused())
		}
	} else if stream != nil {
		stream.Abandon()
		err = upload.ErrNoStream
	} else {
		err = upload.ErrNoStream
	}
	if err != nil && ctx.Err() == nil && size > of.fs.opts.UploadBlockSize && upload.StreamBlocks(size, of.fs.opts.UploadBlockSize) < blobstore.MaxBlocks-1 {
		// The whole file, through a stream of its own, so that the
		// commit after this one can keep its blocks: a log reopened
		// for appending, or written out of order once, is then not
		// uploaded whole at every fsync.
		stream = of.fs.up.NewStream(path)
		stream.KeepPages()
		c.stream = stream
		attrs, err = of.uploadStream(ctx, stream, path, f, size, c.opts)
		streamed = err == nil
	} else if err != nil {
		attrs, err = of.upload(ctx, path, f, size, c.opts)
	}
	// The retry of an attempt that reached the store fails its ETag
	// condition, or finds its staged blocks used up by the commit: an
	// earlier attempt of this commit reached the store and its answer
	// was lost (a timeout, a connection reset, or the process that made
	// it was killed). Upload again on top of it: the spill file may hold
	// changes made after that attempt. That upload's answer can be lost
	// too: a few rounds.
	onOwnEarlierCommit := func() {
		for range 3 {
			if err == nil || ctx.Err() != nil {
				return
			}
			current, ours := of.ownEarlierCommit(ctx, path, c.nonce)
			if !ours {
				return
			}
			of.fs.log.Info("the store holds this file's own earlier commit; uploading on top of it", "path", path)
			c.opts.Conditions = blobstore.Conditions{IfMatch: current.ETag}
			attrs, err = of.upload(ctx, path, f, size, c.opts)
		}
	}
	onOwnEarlierCommit()
	if errors.Is(err, blobstore.ErrPreconditionFailed) && ctx.Err() == nil {
		if current, ok := of.fs.sameContent(ctx, path, c.seen); ok {
			// Only the metadata changed since this file's writers saw
			// the blob (another mount's chmod, chown or utime, or the
			// store API's): not another writer. Their attributes stay
			// unless this mount changed the file's own meanwhile.
			of.fs.log.Info("the blob's metadata changed in the store since it was opened, its content did not; committing over it", "path", path)
			c.opts.Conditions = blobstore.Conditions{IfMatch: current.ETag}
			if !c.attrsChanged {
				c.opts.Metadata = theirAttrs(current.Metadata, c.opts.Metadata)
			}
			attrs, err = of.upload(ctx, path, f, size, c.opts)
			onOwnEarlierCommit()
			if err == nil && !c.attrsChanged {
				of.fs.mu.Lock()
				of.n.attrs = meta.ParsePosix(c.opts.Metadata)
				of.fs.mu.Unlock()
			}
		}
	}
	return attrs, streamed, err
}

// committedLocked records a commit that reached the store: the condition
// of the next one is its ETag, and its stream's blocks are kept when
// nothing changed during the upload. The caller holds of.mu.
func (of *openFile) committedLocked(c commitPlan, attrs blobstore.Attrs, streamed bool) {
	of.committedGen = c.gen
	if streamed && of.gen == c.gen && of.spill == c.f && of.stream == nil {
		// Nothing changed during the upload: the next commit can keep
		// the blocks of this one.
		of.stream = c.stream.CarryOn(c.size)
	}
	of.baseETag = attrs.ETag
	of.baseMeta = c.opts.Metadata
	of.loadedSum, of.loadedSize = contentsum.Of(c.opts.ContentMD5), c.size
	if len(attrs.ContentMD5) > 0 {
		of.loadedSum = contentsum.Of(attrs.ContentMD5)
	}
	of.attrsChanged = false
	of.exclusive = false
	of.commitErr = nil
	of.commitNonce = ""
	of.journalLocked(of.dirty())
}

// errNameLost: a file with changes lost its name without being unlinked
// through this mount (its blob deleted by another writer, then its
// directory removed). A conflict: ESTALE, the data kept in lost+found.
var errNameLost = fmt.Errorf("the file's directory was removed after its blob was deleted by another writer: %w", blobstore.ErrPreconditionFailed)

// seenContent is what a commit's condition stands for: the content of
// the blob as the spill file loaded it, or as the writers saw it at open.
type seenContent struct {
	sum  contentsum.Sum // unknown: never compared
	size int64
}

// seenContentLocked returns the content the next commit's condition
// stands for, and whether this mount changed the file's attributes since
// its last commit.
func (of *openFile) seenContentLocked() (seenContent, bool) {
	switch c := of.conditionsLocked(); {
	case c.IfMatch == "":
		return seenContent{}, of.attrsChanged
	case c.IfMatch == of.baseETag:
		return seenContent{of.loadedSum, of.loadedSize}, of.attrsChanged
	case c.IfMatch == of.openETag:
		return seenContent{of.openSum, of.openSize}, of.attrsChanged
	}
	return seenContent{}, of.attrsChanged
}

// needsSourceETag tells whether a rename of this file must learn the
// source's ETag before its Copy for followCopy: the condition stands for a
// version whose content is not known.
func (of *openFile) needsSourceETag() bool {
	of.mu.Lock()
	defer of.mu.Unlock()
	seen, _ := of.seenContentLocked()
	return of.conditionsLocked().IfMatch != "" && !seen.sum.Known()
}

// sameContent tells whether the blob at path holds the content seen,
// under whatever ETag and metadata: a change of metadata alone. Only a
// Content-MD5 tells; a blob without one is never the same.
func (fs *FS) sameContent(ctx context.Context, path string, seen seenContent) (blobstore.Attrs, bool) {
	if !seen.sum.Known() {
		return blobstore.Attrs{}, false
	}
	a, err := fs.store.Stat(ctx, path)
	if err != nil || a.Size != seen.size || contentsum.Of(a.ContentMD5) != seen.sum {
		return blobstore.Attrs{}, false
	}
	return a, true
}

// theirAttrs returns a commit's metadata with the POSIX attributes (and
// other keys) of the blob's current metadata, keeping the commit's own
// keys (its nonce).
func theirAttrs(current, ours map[string]string) map[string]string {
	md := meta.Copy(current)
	meta.Delete(md, blobstore.MetaMtime) // the content is new: its time is now
	meta.Delete(md, blobstore.MetaRcloneMtime)
	meta.Delete(md, blobstore.MetaCtime)
	if v, ok := meta.Value(ours, blobstore.MetaCommit); ok {
		meta.Set(md, blobstore.MetaCommit, v)
	}
	if v, ok := meta.Value(ours, blobstore.MetaMtime); ok {
		meta.Set(md, blobstore.MetaMtime, v)
	}
	return md
}

// upload writes the whole spill file as the blob.
func (of *openFile) upload(ctx context.Context, path string, f *os.File, size int64, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	p := of.fs.up.StartProgress(path, size)
	// Counted as uploading until the store has it (Stats.UploadingBytes).
	of.fs.up.Uploading.Add(size)
	a, err := blobstore.Upload(ctx, of.fs.store, path, f, size, blobstore.UploadOptions{
		BlockSize:   of.fs.opts.UploadBlockSize,
		Concurrency: of.fs.opts.UploadConcurrency,
		PutOptions:  opts,
		Progress: func(n int64) {
			p.Add(n)
			of.fs.up.Uploading.Add(-n)
		},
		Buffers: of.fs.up.Buffers,
	})
	of.fs.up.Uploading.Add(-(size - p.Done()))
	p.Finish(err)
	return a, err
}

// uploadStream writes the whole spill file as the blob through st, a
// fresh stream: upload's work, in blocks a later commit can keep.
func (of *openFile) uploadStream(ctx context.Context, st *upload.Stream, path string, f *os.File, size int64, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	p := of.fs.up.StartProgress(path, size)
	st.SetProgress(p)
	a, err := st.Commit(ctx, f, size, opts)
	p.Finish(err)
	return a, err
}

// close lets go of the spill file (back to the pool, emptied); the caller
// made sure nothing is dirty or gave up on it. The removal is journaled
// first, so that a process adopting the mount never looks for a spill file
// that is legitimately gone, and removes it if this one dies.
func (of *openFile) close() {
	of.mu.Lock()
	defer of.mu.Unlock()
	of.closeLocked()
}

// closeIfClean is close for a file with nothing unsaved, checked in the
// same hold of the locks: a write landing between a check and the close
// would be dropped with the spill file. It reports whether it closed.
func (of *openFile) closeIfClean() bool {
	of.commitMu.Lock()
	defer of.commitMu.Unlock()
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.dirty() {
		return false
	}
	of.closeLocked()
	return true
}

func (of *openFile) closeLocked() {
	if of.stream != nil {
		of.stream.Abandon()
		of.stream = nil
	}
	if of.spill != nil {
		of.fs.journalSpillRemoval(of.n, of.spillPath)
		of.fs.spills.put(of.spill)
		of.spill = nil
		of.hasSpill.Store(false)
	}
}

// keepSpill moves a spill file whose data could not be uploaded to
// CacheDir/lost+found so that it survives, and returns its new path.
func (of *openFile) keepSpill(blobName string) string {
	of.mu.Lock()
	defer of.mu.Unlock()
	if of.spill == nil {
		return ""
	}
	dst := of.fs.lostFoundPath(blobName)
	// Journaled first, as in close: a successor must not upload it. Not
	// as a removal: if this process dies before the move, the data stays
	// in the spill directory.
	of.fs.journalFile(of.n, journal.SavedFile{})
	of.spill.Close()
	if err := os.Rename(of.spillPath, dst); err != nil {
		dst = of.spillPath
	}
	of.spill = nil
	of.hasSpill.Store(false)
	if of.stream != nil {
		of.stream.Abandon()
		of.stream = nil
	}
	return dst
}

// download copies a blob into f with parallel ranged reads. Where the
// blob has a Content-MD5 want and checks are on, the chunks are hashed in
// order as they land, and a blob whose bytes do not match is not loaded:
// the change that needed it fails with EIO, as a whole read of the blob
// through the mount would, rather than build on bytes the store did not
// vouch for.
func (fs *FS) download(ctx context.Context, name, etag string, size int64, want contentsum.Sum, f *os.File) error {
	if fs.sums.IsCorrupt(name, etag) {
		return contentsum.ErrMismatch
	}
	var h *upload.Hash
	if fs.sums != nil && want.Known() {
		h = upload.NewHash()
	}
	chunk := fs.opts.UploadBlockSize
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fs.opts.UploadConcurrency)
	for off := int64(0); off < size; off += chunk {
		g.Go(func() error {
			buf := make([]byte, min(chunk, size-off))
			n, err := fs.store.ReadAt(gctx, name, buf, off, etag)
			if err != nil && !(errors.Is(err, io.EOF) && n == len(buf)) {
				err = fmt.Errorf("read %q at %d: %w", name, off, err)
			} else {
				_, err = f.WriteAt(buf, off)
			}
			if h != nil {
				if err != nil {
					h.Fail() // the chunks after this one stop waiting
				} else {
					h.Add(off, buf)
				}
			}
			return err
		})
	}
	if err := g.Wait(); err != nil || h == nil {
		return err
	}
	sum := h.Sum(size)
	if sum == nil {
		return fmt.Errorf("read %q: not every byte was hashed", name)
	}
	return fs.sums.Verdict(contentsum.Version{Name: name, ETag: etag}, size, want, sum)
}
