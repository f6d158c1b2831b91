package fusefs

import (
	"fmt"
	"os"
	"time"

	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// NewState returns a fresh, empty state region (a memfd) for a mount that
// must survive its serving process. Pass it in Options.State, and keep a
// duplicate of it, with the /dev/fuse fd, in a process that outlives the
// server (the keeper).
func NewState() (*os.File, error) {
	r, err := journal.NewRegion()
	if err != nil {
		return nil, err
	}
	return r.File(), nil
}

// journalSpillRemoval records that n's spill file at spillPath is about to
// be removed: a successor removes it if this process dies before it does.
func (fs *FS) journalSpillRemoval(n *node, spillPath string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.nodes.state == nil {
		return
	}
	n.fileRecord = nil
	fs.nodes.state.Append(journal.FileRecord(journal.SpillRemovedRecord(nil, spillPath), journal.SavedFile{Node: n.id}))
}

// journalFile records n's spill file state (SpillPath "" once there is
// none). Callers may hold the openFile's mu (the lock order allows FS.mu
// after it).
func (fs *FS) journalFile(n *node, f journal.SavedFile) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.nodes.state == nil {
		return
	}
	f.Node = n.id
	rec := journal.FileRecord(nil, f)
	if f.SpillPath == "" {
		n.fileRecord = nil
	} else {
		n.fileRecord = rec
	}
	fs.nodes.state.Append(rec)
}

// tableRecords adds the handle table and the intents to a checkpoint.
func (fs *FS) tableRecords(dst []byte) []byte {
	for _, h := range fs.handles {
		dst = handleRecord(dst, h)
	}
	return fs.intents.Records(dst)
}

// attachState journals into the region in opts.State, first rebuilding the
// tables from it when a previous process left them there.
func (fs *FS) attachState(f *os.File) error {
	region, saved, err := journal.ReadRegion(f)
	if err != nil {
		return err
	}
	fs.nodes.state = region
	fs.nodes.onCheckpoint = fs.tableRecords
	if len(saved.Init) == 0 {
		return nil // a fresh region
	}
	fs.adoptInit = saved.Init
	return fs.restore(saved)
}

// restore rebuilds the node, handle and open-file tables. Attributes are
// not saved: every restored node is revalidated on first use.
func (fs *FS) restore(saved *journal.Saved) error {
	t := fs.nodes
	state := t.state
	t.state = nil // replaying, not journaling
	defer func() { t.state = state }()
	fs.intents = saved.Intents
	fs.restoreNodes(saved)
	fs.removeJournaledSpills(saved)
	if err := fs.restoreFiles(saved); err != nil {
		return err
	}
	fs.restoreHandles(saved)
	retry, unused := fs.releasedFiles()
	t.state = state // what follows is journaled
	for _, of := range retry {
		fs.retryCommitSoon(of)
	}
	for _, of := range unused {
		of.close()
		fs.mu.Lock()
		t.maybeDrop(of.n)
		fs.mu.Unlock()
	}
	fs.log.Info("state restored", "nodes", len(t.byID), "handles", len(fs.handles), "open_files", len(saved.Files))
	return nil
}

// restoreNodes rebuilds the node table: ids, kinds, lookups and names.
func (fs *FS) restoreNodes(saved *journal.Saved) {
	t := fs.nodes
	for id, sn := range saved.Nodes {
		if id == fuse.FUSE_ROOT_ID {
			continue
		}
		t.byID[id] = &node{id: id, kind: meta.Kind(sn.Kind), lookups: sn.Lookups, name: sn.Name, inStore: true}
	}
	for id, sn := range saved.Nodes {
		n := t.byID[id]
		if n == nil || sn.Parent == 0 {
			continue
		}
		if _, ok := t.byID[sn.Parent]; !ok {
			fs.log.Warn("state: node's parent is gone; detached", "node", id, "name", sn.Name)
			continue
		}
		if other := t.child(sn.Parent, sn.Name); other != nil {
			fs.log.Warn("state: name bound twice; keeping the newer node", "name", sn.Name)
			if other.id > id {
				continue
			}
			t.unlink(other)
		}
		t.link(n, sn.Parent, sn.Name)
	}
	t.nextID = max(t.nextID, saved.NextID)
	fs.nextHandle = max(fs.nextHandle, saved.NextHandle)
}

// removeJournaledSpills removes the spill files whose removal a dead
// process journaled and perhaps did not get to.
func (fs *FS) removeJournaledSpills(saved *journal.Saved) {
	live := map[string]bool{}
	for _, sf := range saved.Files {
		live[sf.SpillPath] = true
	}
	for _, path := range saved.RemovedSpills {
		if !live[path] {
			if err := os.Remove(path); err == nil {
				fs.log.Debug("state: removed a spill file its process did not get to", "spill", path)
			}
		}
	}
}

// restoreFiles reopens the spill file of every open file, with the
// condition of its next commit.
func (fs *FS) restoreFiles(saved *journal.Saved) error {
	t := fs.nodes
	for id, sf := range saved.Files {
		n := t.byID[id]
		if n == nil {
			continue
		}
		f, err := os.OpenFile(sf.SpillPath, os.O_RDWR, 0)
		if err != nil {
			// The data of an open file is gone: nothing can bring it
			// back; say so loudly.
			fs.log.Error("state: spill file of an open file is missing", "node", id, "spill", sf.SpillPath, "err", err)
			continue
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("spill %s: %w", sf.SpillPath, err)
		}
		of := &openFile{fs: fs, n: n, spill: f, spillPath: sf.SpillPath, baseETag: sf.BaseETag, exclusive: sf.Exclusive, commitNonce: sf.CommitNonce}
		// The content the condition stands for: a commit over another
		// client's metadata change goes on (sameContent).
		seenSum := contentsum.Sum(sf.SeenSum)
		if sf.BaseETag != "" {
			of.loadedSum, of.loadedSize = seenSum, sf.SeenSize
		}
		if rec, ok := readSpillRecord(f); ok {
			if sf.BaseETag == "" {
				of.openETag = rec.IfMatch // the region does not keep it
				of.openSum, of.openSize = seenSum, sf.SeenSize
			}
			// Unlinked, or replaced by a rename, through the mount while
			// open: it lives on without a name, and nothing of it is
			// uploaded (commit), in this process as in the dead one.
			of.unlinked = rec.Unlinked
			if t, ok := meta.Mtime(rec.Attrs); ok && sf.Dirty {
				of.mtime = &t // set by a utime, waiting for the commit
			}
			if len(rec.Attrs) > 0 {
				// A file created and not yet committed has its
				// attributes only here.
				n.attrs, n.attrsKnown = meta.ParsePosix(rec.Attrs), true
			}
		}
		of.setSizeLocked(st.Size())
		of.hasSpill.Store(true)
		if sf.Dirty {
			of.gen = 1
			if sf.BaseETag == "" {
				n.inStore = false // possibly created and never uploaded
			}
		}
		n.file = of
		n.fileRecord = journal.FileRecord(nil, sf)
	}
	return nil
}

// restoreHandles rebuilds the handle table, and each open file's count of
// handles and writers and each node's I/O mode.
func (fs *FS) restoreHandles(saved *journal.Saved) {
	t := fs.nodes
	for fh, sh := range saved.Handles {
		n := t.byID[sh.Node]
		if n == nil {
			continue
		}
		h := &handle{id: fh, n: n, write: sh.Write, io: sh.IO, opened: sh.Opened}
		if !sh.Dir {
			if n.file == nil {
				n.file = &openFile{fs: fs, n: n}
			}
			h.of = n.file
			n.file.refs++
			if sh.Write {
				n.file.writers++
			}
			switch sh.IO {
			case journal.IOCached, journal.IODirect:
				// A direct-I/O handle counts as cached here: an mmap of
				// it put the inode in cached mode, unseen (passthrough.go).
				n.io.cached++
			case journal.IOPassthrough:
				// The kernel still reads the backing file, and new
				// opens must join it (passthrough.go).
				n.io.passthrough++
				n.io.backingID = sh.BackingID
			}
		}
		fs.handles[fh] = h
	}
}

// releasedFiles sorts the restored open files that no handle holds: those
// whose upload was failing when their last handle went, to retry, and the
// rest, to close.
func (fs *FS) releasedFiles() (retry, unused []*openFile) {
	t := fs.nodes
	// Files whose last handle was released while their upload was failing
	// are retried here, as the previous process did. A file left by a
	// create that never completed was never written: no application got
	// a handle to it. Uploading it would make an empty blob that the
	// resent create, if it is O_EXCL, would then find in its way.
	for _, n := range t.byID {
		if of := n.file; of != nil && of.refs == 0 {
			if of.dirty() && !(of.size == 0 && fs.unfinishedCreate(n)) {
				retry = append(retry, of)
			} else {
				n.file = nil
				unused = append(unused, of)
			}
		}
	}
	return retry, unused
}

// retryCommitSoon uploads a restored dirty file with no handle left.
func (fs *FS) retryCommitSoon(of *openFile) {
	fs.retryCommitAfter(of, 10*time.Millisecond)
}

// AdoptInit returns the INIT request of the mount whose state was restored
// from Options.State, or nil for a fresh region: the caller then adopts the
// live mount (Adopt) instead of mounting (Mount).
func (fs *FS) AdoptInit() []byte { return fs.adoptInit }

// SaveInit records the kernel's INIT request in the state region; Mount
// calls it (through MountOptions.OnInit) before replying to INIT.
func (fs *FS) SaveInit(init []byte) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.nodes.state == nil {
		return nil
	}
	return fs.nodes.state.SetInit(init)
}
