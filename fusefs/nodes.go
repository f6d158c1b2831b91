package fusefs

import (
	"strings"
	"time"

	"github.com/blobfs/blobfs/fusefs/contentsum"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The node table maps the node ids blobfs hands to the kernel to names.
//
// blobfs issues its own ids (it does not use go-fuse's fs package) because a
// restarted process must resolve ids that an earlier process handed out: the
// kernel keeps using them. An id is never given to another name within a
// table, so a stale id can be told apart from a live one; the kernel's inode
// number is the id. A node lives while the kernel holds a
// lookup reference to it (counted by LOOKUP/CREATE/MKDIR/... replies and
// READDIRPLUS entries, dropped by FORGET) or while a file handle uses it.
//
// Locking: the table and every node field below are guarded by FS.mu. Nodes
// are never touched without it; the data of an open file lives in openFile,
// which has its own lock.
//
// A file keeps its inode number when the kernel forgets it (it evicts
// inodes it does not use, under memory pressure or drop_caches) and looks
// its name up again: the table remembers the ids of the last
// rememberedIDs named nodes it dropped, by name, and gives such a name its
// old id back. Tools that tell files apart by (st_dev, st_ino) (tar, rsync
// -H, find, git's index, log followers) then see the same file, as
// pjdfstest's rename tests check after a rename away and back.

type node struct {
	id     uint64
	parent uint64 // 0 once detached (unlinked, or replaced by another node)
	// superseded: detached because its name was given to a node for a
	// newer version of the blob while this one's passthrough handles
	// read the old one (passthrough.go).
	superseded bool
	name       string
	kind       meta.Kind
	lookups    uint64 // kernel references
	// children counts the names bound under this directory node; a
	// directory with children stays in the table because their paths go
	// through it.
	children int

	// Cached attributes, valid until attrExpiry.
	size       int64
	mtime      time.Time
	etag       string
	sum        contentsum.Sum // the blob's Content-MD5, if it has one
	attrExpiry time.Time
	// inStore is false for a file created through this mount and not yet
	// committed: the store does not know it, but the kernel does.
	inStore bool
	// attrs are the POSIX attributes (attrs.go); attrsKnown is false
	// until the store (or this mount) said what they are: a node
	// restored from the state region has only its name.
	attrs      meta.Posix
	attrsKnown bool
	// touched is when this mount last made, removed or renamed an entry
	// of this directory: its mtime and ctime are at least that (kept in
	// memory; a listing of the parent may carry an older stored time).
	touched time.Time
	// subdirs is the number of subdirectories, when a listing knew it:
	// nlink is 2 plus that.
	subdirs int
	// target is a symlink's target, once read.
	target string
	// file holds the content state while handles are open.
	file *openFile
	// io counts the open handles by the kernel's io mode, and holds the
	// backing file of passthrough handles (passthrough.go).
	io ioOpens
	// lastOpenETag is the ETag seen at the last open, to tell the kernel
	// it may keep its page cache when the blob has not changed.
	lastOpenETag string
	// fileRecord is the journaled state of n's spill file, kept here so
	// that a checkpoint can write it without taking openFile locks.
	fileRecord []byte
}

type bindingKey struct {
	parent uint64
	name   string
}

// rememberedIDs bounds the ids the table keeps for dropped names: about
// 100 bytes each (a 3 MiB table at most), proportional to the files a
// mount has looked up, not to the container's size.
const rememberedIDs = 1 << 15

// rememberedID is a dropped node's id, for the next node of its name.
type rememberedID struct {
	key  bindingKey
	id   uint64
	kind meta.Kind
}

type nodeTable struct {
	byID   map[uint64]*node
	byName map[bindingKey]*node
	nextID uint64
	// remembered maps a dropped node's name to its id; forgotten is a
	// ring of the same entries (consumed ones included) whose oldest,
	// at index oldest once the ring is full, goes first.
	remembered map[bindingKey]rememberedID
	forgotten  []rememberedID
	oldest     int
	rootTime   time.Time
	// state journals every change the kernel may depend on; nil when the
	// mount need not survive its process.
	state *journal.Region
	// onCheckpoint returns the records of the tables beyond nodes (handles,
	// files) for a checkpoint of the state region.
	onCheckpoint func(dst []byte) []byte
}

func newNodeTable() *nodeTable {
	t := &nodeTable{
		byID:       map[uint64]*node{},
		byName:     map[bindingKey]*node{},
		nextID:     fuse.FUSE_ROOT_ID + 1,
		remembered: map[bindingKey]rememberedID{},
		rootTime:   time.Now(),
	}
	t.byID[fuse.FUSE_ROOT_ID] = &node{id: fuse.FUSE_ROOT_ID, kind: meta.KindDir, lookups: 1, mtime: t.rootTime, inStore: true}
	return t
}

func (t *nodeTable) get(id uint64) *node { return t.byID[id] }

// ref counts one more kernel reference to n; the caller replies with n's id.
func (t *nodeTable) ref(n *node) {
	n.lookups++
	t.save(n)
}

// save journals n's binding and lookup count.
func (t *nodeTable) save(n *node) {
	if t.state == nil || n.id == fuse.FUSE_ROOT_ID {
		return
	}
	t.state.Append(nodeRecord(nil, n))
	t.maybeCheckpoint()
}

func (t *nodeTable) maybeCheckpoint() {
	if t.state.NeedsCheckpoint() {
		t.checkpoint()
	}
}

// checkpoint rewrites the state region as the tables are now.
func (t *nodeTable) checkpoint() {
	var b []byte
	for _, n := range t.byID {
		if n.id != fuse.FUSE_ROOT_ID {
			b = nodeRecord(b, n)
		}
		b = append(b, n.fileRecord...)
	}
	if t.onCheckpoint != nil {
		b = t.onCheckpoint(b)
	}
	t.state.Checkpoint(b)
}

func (t *nodeTable) child(parent uint64, name string) *node {
	return t.byName[bindingKey{parent, name}]
}

// bind returns the node for (parent, name), creating it, or replacing an
// existing node of another kind (the blob changed kind behind our back).
func (t *nodeTable) bind(parent uint64, name string, kind meta.Kind) *node {
	if n := t.child(parent, name); n != nil {
		if n.kind == kind {
			return n
		}
		t.detach(n)
	}
	n := &node{id: t.newID(bindingKey{parent, name}, kind), kind: kind}
	t.byID[n.id] = n
	t.link(n, parent, name)
	return n
}

// newID returns the id for a new node of name key: the one its last node
// had, if the table remembers it, otherwise a new one.
func (t *nodeTable) newID(key bindingKey, kind meta.Kind) uint64 {
	if r, ok := t.remembered[key]; ok {
		delete(t.remembered, key)
		if r.kind == kind && t.byID[r.id] == nil {
			return r.id
		}
	}
	id := t.nextID
	t.nextID++
	return id
}

// remember keeps the id of n, dropped while it still had its name.
func (t *nodeTable) remember(n *node) {
	r := rememberedID{key: bindingKey{n.parent, n.name}, id: n.id, kind: n.kind}
	if len(t.forgotten) < rememberedIDs {
		t.forgotten = append(t.forgotten, r)
	} else {
		// Full: the oldest entry makes room, unless consumed already.
		old := t.forgotten[t.oldest]
		if t.remembered[old.key] == old {
			delete(t.remembered, old.key)
		}
		t.forgotten[t.oldest] = r
		t.oldest = (t.oldest + 1) % rememberedIDs
	}
	t.remembered[r.key] = r
}

// detach removes n's name; the id stays valid until the kernel forgets it.
func (t *nodeTable) detach(n *node) {
	if n.parent == 0 {
		return
	}
	t.unlink(n)
	t.maybeDrop(n)
}

// link binds n to (parent, name); the name must be free.
func (t *nodeTable) link(n *node, parent uint64, name string) {
	n.parent, n.name = parent, name
	t.byName[bindingKey{parent, name}] = n
	if p := t.byID[parent]; p != nil {
		p.children++
	}
	t.save(n)
}

// unlink removes n's binding and lets its old parent go if unused.
func (t *nodeTable) unlink(n *node) {
	if n.parent == 0 {
		return
	}
	k := bindingKey{n.parent, n.name}
	if t.byName[k] == n {
		delete(t.byName, k)
	}
	p := t.byID[n.parent]
	n.parent = 0
	if _, live := t.byID[n.id]; live {
		t.save(n)
	}
	if p != nil {
		p.children--
		t.maybeDrop(p)
	}
}

// move rebinds n under a new name, detaching whatever held that name.
func (t *nodeTable) move(n *node, parent uint64, name string) {
	if n.parent == parent && n.name == name {
		return
	}
	if old := t.child(parent, name); old != nil && old != n {
		t.detach(old)
	}
	// Link first so that the old parent is not dropped while n moves
	// within it.
	oldParent, oldName := n.parent, n.name
	t.link(n, parent, name)
	if oldParent != 0 {
		k := bindingKey{oldParent, oldName}
		if t.byName[k] == n {
			delete(t.byName, k)
		}
		if p := t.byID[oldParent]; p != nil {
			p.children--
			t.maybeDrop(p)
		}
	}
}

// forget drops nlookup kernel references.
func (t *nodeTable) forget(id, nlookup uint64) {
	n := t.byID[id]
	if n == nil || id == fuse.FUSE_ROOT_ID {
		return
	}
	if nlookup > n.lookups {
		nlookup = n.lookups
	}
	n.lookups -= nlookup
	t.save(n)
	t.maybeDrop(n)
}

// maybeDrop frees a node nobody refers to. A node with children bound to it
// stays: their paths go through it.
func (t *nodeTable) maybeDrop(n *node) {
	if n.lookups > 0 || n.file != nil || n.id == fuse.FUSE_ROOT_ID {
		return
	}
	if n.children > 0 {
		return
	}
	delete(t.byID, n.id)
	if t.state != nil {
		t.state.Append(journal.IDRecord(nil, journal.RecNodeDrop, n.id))
	}
	if n.parent != 0 {
		t.remember(n)
	}
	t.unlink(n)
}

// path returns n's blob name ("" for the root), and false if n or one of
// its ancestors is detached.
func (t *nodeTable) path(n *node) (string, bool) {
	if n.id == fuse.FUSE_ROOT_ID {
		return "", true
	}
	var parts []string
	for n.id != fuse.FUSE_ROOT_ID {
		if n.parent == 0 {
			return "", false
		}
		parts = append(parts, n.name)
		p := t.byID[n.parent]
		if p == nil {
			return "", false
		}
		n = p
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/"), true
}

// descendants returns the live nodes below the directory at dirPath.
func (t *nodeTable) descendants(dirPath string) []*node {
	var out []*node
	for _, n := range t.byID {
		if p, ok := t.path(n); ok && p != dirPath && strings.HasPrefix(p, dirPath+"/") {
			out = append(out, n)
		}
	}
	return out
}

// nodeRecord journals n's binding and lookup count.
func nodeRecord(dst []byte, n *node) []byte {
	return journal.NodeRecord(dst, journal.SavedNode{ID: n.id, Parent: n.parent, Lookups: n.lookups, Kind: byte(n.kind), Name: n.name})
}

// handleRecord journals an open handle.
func handleRecord(dst []byte, h *handle) []byte {
	return journal.HandleRecord(dst, journal.SavedHandle{FH: h.id, Node: h.n.id, Write: h.write, Dir: h.of == nil, IO: h.io, BackingID: h.n.io.backingID, Opened: h.opened})
}
