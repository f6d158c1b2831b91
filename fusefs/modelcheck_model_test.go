package fusefs

// The reference model of the model-based checker (modelcheck_test.go): a
// small filesystem in Go that says what docs/semantics.md promises for a
// sequence of operations through two mounts of one container and the
// store's API. It does no I/O; each method returns what the real
// operation must return and updates the model as the operation does.
//
// What it encodes:
//   - The store holds blobs (files, symlinks, FIFOs, directory markers); a
//     directory exists where a marker or any blob under its prefix does.
//   - A mount sees the store, plus the files it created and has not
//     committed yet (pending). With its caches off it sees every change
//     of the store at once.
//   - Close-to-open: an open file of a mount is one place (mfile) shared
//     by that mount's handles; it holds the mount's writes (the spill)
//     until a close or fsync of any of its handles commits them. Other
//     mounts see the new content at their next open.
//   - Conflicts only between writers: a commit requires that the blob is
//     still the version its writers saw at open (or that there is none,
//     for a new file), and after a commit the version it wrote. This
//     mount's own changes (rename, attributes) are not another writer and
//     move that condition along; another mount's or the store API's
//     changes are, and the commit then fails with ESTALE, the store keeps
//     the other version, and the loser's data goes to that mount's
//     lost+found at the last release. A change of metadata alone by
//     another client is not another writer: where the blob still holds
//     the content the condition stands for (seen), the commit goes over
//     it, keeping the other client's attributes unless this mount changed
//     the file's own since its last commit.
//   - Hard links EPERM, a name over 255 bytes ENAMETOOLONG.

import (
	"bytes"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// errENOENTOrOK: either ENOENT or success is right.
const errENOENTOrOK = syscall.Errno(0xfffd)

type mkind int

const (
	kNone mkind = iota
	kFile
	kDir
	kSymlink
	kFifo
)

func (k mkind) String() string {
	return [...]string{"none", "file", "dir", "symlink", "fifo"}[k]
}

// mattrs are the POSIX attributes the model knows of a blob or an open
// file; a zero field is "not stored": the mount shows its default, which
// the model does not check.
type mattrs struct {
	perm     uint32
	owned    bool
	uid, gid uint32
	mtime    int64 // set explicitly (utime), Unix ns; 0: the content's time
}

// mblob is one blob of the model's store.
type mblob struct {
	kind   mkind
	data   []byte // content of a file
	target string // of a symlink
	ver    int    // changes with every write of content or metadata (the ETag)
	attrs  mattrs
}

// mfile is a file open in one mount: what every handle of that mount on
// it shares (openFile).
type mfile struct {
	mount    int
	path     string // follows this mount's renames
	handles  int
	writers  int
	spill    []byte
	hasSpill bool
	dirty    bool
	// base is the version of the blob at path that the next commit
	// requires (0: that there is none). It is meaningful while writers
	// are open or a spill exists (opened).
	base int
	// seen is the content the blob had at version base: a commit whose
	// condition fails commits all the same while the blob still holds it.
	seen   []byte
	opened bool
	// attrsChanged: this mount changed the file's attributes since its
	// last commit (those win over another client's then).
	attrsChanged bool
	pending      bool // created by this mount and never committed
	// unlinked: removed (or replaced by a rename) through this mount
	// while open; nothing of it is uploaded.
	unlinked bool
	// nameLost: its name went with a directory a rename replaced (the
	// store had no blob of it any more); unlike an unlinked file, its
	// unsaved changes are a conflict (ESTALE, lost+found), not dropped.
	nameLost   bool
	conflicted bool
	attrs      mattrs
}

// mhandle is one open file descriptor.
type mhandle struct {
	mount            int
	f                *mfile
	read, write, app bool
	writer           bool   // counts as a writer of its file
	openView         []byte // the content it could see at open
	openVer          int    // the version of the blob it opened
	desc             string
}

type model struct {
	store    map[string]*mblob
	ver      int
	files    []*mfile
	lost     [2][][]byte // contents expected in each mount's lost+found
	fileMode uint32      // permissions of a file created through a mount
}

func newModel(fileMode uint32) *model {
	return &model{store: map[string]*mblob{}, fileMode: fileMode}
}

func (m *model) nextVer() int { m.ver++; return m.ver }

func parentOf(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}

// storeKind is what the store holds at p, directories by prefix too.
func (m *model) storeKind(p string) mkind {
	if p == "" {
		return kDir
	}
	if b := m.store[p]; b != nil {
		return b.kind
	}
	for name := range m.store {
		if strings.HasPrefix(name, p+"/") {
			return kDir
		}
	}
	return kNone
}

// fileData is the content of the file blob at p (nil if none).
func (m *model) fileData(p string) []byte {
	if b := m.store[p]; b != nil && b.kind == kFile {
		return bytes.Clone(b.data)
	}
	return nil
}

func (m *model) curVer(p string) int {
	if b := m.store[p]; b != nil && b.kind == kFile {
		return b.ver
	}
	return 0
}

// mountFile is mount mnt's open file at p, if any.
func (m *model) mountFile(mnt int, p string) *mfile {
	for _, f := range m.files {
		if f.mount == mnt && f.path == p && !f.unlinked {
			return f
		}
	}
	return nil
}

// view is the kind of p as mount mnt sees it. A file this mount holds a
// copy of (created here, or written while open: a spill file) shows as
// that copy while it is open, whatever another writer did to the blob
// since; but only while its directory is there in the store: a directory
// that another mount removed is gone, whatever this one was making in it
// (its commit brings it back). Listings (children) show the store's
// names and, of these, only the files never uploaded.
func (m *model) view(mnt int, p string) mkind {
	if f := m.mountFile(mnt, p); f != nil && (f.pending || f.hasSpill) && m.storeKind(parentOf(p)) == kDir {
		return kFile
	}
	return m.storeKind(p)
}

// viewData is the content of file p as a fresh open through mnt reads it.
func (m *model) viewData(mnt int, p string) []byte {
	if f := m.mountFile(mnt, p); f != nil && f.hasSpill {
		return f.spill
	}
	if b := m.store[p]; b != nil {
		return b.data
	}
	return nil
}

// viewAttrs are p's attributes as mnt shows them.
func (m *model) viewAttrs(mnt int, p string) mattrs {
	if f := m.mountFile(mnt, p); f != nil {
		return f.attrs
	}
	if b := m.store[p]; b != nil {
		return b.attrs
	}
	return mattrs{}
}

// children lists directory dir as mnt sees it, sorted.
func (m *model) children(mnt int, dir string) []string {
	set := map[string]bool{}
	add := func(name string) {
		rest, ok := strings.CutPrefix(name, dir+"/")
		if dir == "" {
			rest, ok = name, true
		}
		if !ok || rest == "" {
			return
		}
		first, _, _ := strings.Cut(rest, "/")
		set[first] = true
	}
	for name := range m.store {
		add(name)
	}
	for _, f := range m.files {
		if f.mount == mnt && f.pending && !f.unlinked && parentOf(f.path) == dir && m.storeKind(dir) == kDir {
			add(f.path)
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (m *model) dirEmpty(mnt int, dir string) bool {
	return len(m.children(mnt, dir)) == 0
}

// keepDir: removing the last entry of a directory through a mount writes
// its marker, so that the directory stays.
func (m *model) keepDir(dir string) {
	if dir == "" {
		return
	}
	for name := range m.store {
		if strings.HasPrefix(name, dir+"/") {
			return
		}
	}
	if m.store[dir] == nil {
		m.store[dir] = &mblob{kind: kDir, ver: m.nextVer()}
	}
}

// parentErr is the errno of making or opening p when its directory is not
// there.
func (m *model) parentErr(mnt int, p string) syscall.Errno {
	switch m.view(mnt, parentOf(p)) {
	case kDir:
		return 0
	case kNone:
		return syscall.ENOENT
	}
	return syscall.ENOTDIR
}

// open opens p through mnt. The caller passes the open(2) flags.
func (m *model) open(mnt int, p string, flags int) (*mhandle, syscall.Errno) {
	if e := m.parentErr(mnt, p); e != 0 {
		return nil, e
	}
	acc := flags & syscall.O_ACCMODE
	h := &mhandle{mount: mnt, read: acc != syscall.O_WRONLY, write: acc != syscall.O_RDONLY, app: flags&syscall.O_APPEND != 0}
	switch m.view(mnt, p) {
	case kNone:
		if flags&syscall.O_CREAT == 0 {
			return nil, syscall.ENOENT
		}
		f := &mfile{mount: mnt, path: p, hasSpill: true, spill: []byte{}, dirty: true, opened: true, pending: true,
			attrs: mattrs{perm: m.fileMode, owned: true}}
		m.files = append(m.files, f)
		f.handles, f.writers = 1, 1
		h.f, h.writer = f, true // blobfs counts a creating handle as a writer
		h.openView = []byte{}
		return h, 0
	case kDir:
		return nil, syscall.EISDIR
	case kSymlink, kFifo:
		panic("open of a special file is not generated")
	}
	if flags&syscall.O_CREAT != 0 && flags&syscall.O_EXCL != 0 {
		return nil, syscall.EEXIST
	}
	f := m.mountFile(mnt, p)
	if f == nil {
		b := m.store[p]
		f = &mfile{mount: mnt, path: p, attrs: b.attrs}
		m.files = append(m.files, f)
	}
	if !f.hasSpill {
		f.attrs = m.store[p].attrs // an open revalidates
	}
	f.handles++
	if h.write {
		h.writer = true
		f.writers++
		if !f.hasSpill {
			f.base, f.opened = m.curVer(p), true
			f.seen = m.fileData(p)
		}
		if flags&syscall.O_TRUNC != 0 {
			m.truncateFile(f, 0)
		}
	}
	h.f = f
	h.openView = bytes.Clone(m.viewData(mnt, p))
	h.openVer = m.curVer(p)
	return h, 0
}

// ensureSpill loads the blob into f's spill before a change that keeps
// some of it. A blob gone from the store fails the change.
func (m *model) ensureSpill(f *mfile, load bool) syscall.Errno {
	if f.hasSpill {
		return 0
	}
	if !f.opened {
		f.base, f.opened = m.curVer(f.path), true
		f.seen = m.fileData(f.path)
	}
	if load && !f.unlinked {
		b := m.store[f.path]
		if b == nil || b.kind != kFile {
			return syscall.ENOENT
		}
		if f.base != 0 && b.ver != f.base && bytes.Equal(b.data, f.seen) {
			// Only its metadata changed since the open: the mount
			// takes it (a setattr or getattr read it meanwhile).
			f.base = b.ver
			if !f.attrsChanged {
				f.attrs = b.attrs
			}
		}
		// Loaded as it is now; if that is not what the writers saw,
		// the commit keeps their condition and fails.
		f.spill = bytes.Clone(b.data)
	} else {
		f.spill = []byte{}
	}
	f.hasSpill = true
	return 0
}

func (m *model) truncateFile(f *mfile, size int) syscall.Errno {
	if e := m.ensureSpill(f, size != 0); e != 0 {
		return e
	}
	f.spill = resize(f.spill, size)
	f.dirty = true
	f.attrs.mtime = 0
	return 0
}

func resize(b []byte, size int) []byte {
	if size <= len(b) {
		return b[:size:size]
	}
	return append(slices.Clip(b), make([]byte, size-len(b))...)
}

func (m *model) write(h *mhandle, off int, data []byte) syscall.Errno {
	if !h.write {
		return syscall.EBADF
	}
	if len(data) == 0 {
		return 0 // the kernel sends no WRITE: nothing changes
	}
	f := h.f
	if e := m.ensureSpill(f, true); e != 0 {
		return e
	}
	if h.app {
		off = len(f.spill)
	}
	if off+len(data) > len(f.spill) {
		f.spill = resize(f.spill, off+len(data))
	} else {
		f.spill = bytes.Clone(f.spill)
	}
	copy(f.spill[off:], data)
	f.dirty = true
	f.attrs.mtime = 0
	return 0
}

// readAllowed is the content a read through h may see: what its mount
// wrote, else the blob it opened. When another writer has replaced or
// removed that blob since (and this mount holds no copy), the read may
// also see the new content, the old one (the kernel's page cache), or
// fail (mayFail): the semantics promise nothing more to a handle opened
// before another writer's change.
func (m *model) readAllowed(h *mhandle) (allowed [][]byte, mayFail bool) {
	f := h.f
	if f.hasSpill {
		return [][]byte{f.spill}, false
	}
	if f.unlinked {
		return [][]byte{h.openView}, true
	}
	b := m.store[f.path]
	if b != nil && b.ver == h.openVer {
		return [][]byte{b.data, h.openView}, false
	}
	if b != nil {
		return [][]byte{b.data, h.openView}, true
	}
	return [][]byte{h.openView}, true
}

// commit uploads f if it has changes: at close and fsync of any of its
// mount's handles.
func (m *model) commit(f *mfile) syscall.Errno {
	if f.nameLost && f.dirty {
		f.conflicted = true
		return syscall.ESTALE
	}
	if !f.dirty || f.unlinked {
		return 0
	}
	b := m.store[f.path]
	if b != nil && b.kind != kFile {
		f.conflicted = true
		return syscall.ESTALE
	}
	if m.curVer(f.path) != f.base {
		if f.base == 0 || b == nil || !bytes.Equal(b.data, f.seen) {
			f.conflicted = true
			return syscall.ESTALE
		}
		// Only the metadata changed: not another writer.
		if !f.attrsChanged {
			f.attrs = b.attrs
			f.attrs.mtime = 0 // the content is new
		}
	}
	v := m.nextVer()
	m.store[f.path] = &mblob{kind: kFile, data: bytes.Clone(f.spill), ver: v, attrs: f.attrs}
	f.base, f.dirty, f.pending, f.conflicted = v, false, false, false
	f.seen, f.attrsChanged = bytes.Clone(f.spill), false
	return 0
}

func (m *model) close(h *mhandle) syscall.Errno {
	f := h.f
	e := m.commit(f)
	f.handles--
	if h.writer {
		f.writers--
		if f.writers == 0 && !f.hasSpill {
			f.opened = false
		}
	}
	if f.handles == 0 {
		m.release(f)
	}
	return e
}

// release: the last handle went. What could not be committed for a
// conflict is kept in lost+found.
func (m *model) release(f *mfile) {
	if f.dirty && (!f.unlinked || f.nameLost) && m.commit(f) != 0 {
		m.lost[f.mount] = append(m.lost[f.mount], bytes.Clone(f.spill))
	}
	m.files = slices.DeleteFunc(m.files, func(g *mfile) bool { return g == f })
}

func (m *model) ftruncate(h *mhandle, size int) syscall.Errno {
	if !h.write {
		return syscall.EINVAL
	}
	return m.truncateFile(h.f, size)
}

func (m *model) truncatePath(mnt int, p string, size int) syscall.Errno {
	switch m.view(mnt, p) {
	case kNone:
		return syscall.ENOENT
	case kDir:
		return syscall.EISDIR
	}
	if f := m.mountFile(mnt, p); f != nil {
		return m.truncateFile(f, size)
	}
	f := &mfile{mount: mnt, path: p, attrs: m.store[p].attrs}
	if e := m.truncateFile(f, size); e != 0 {
		return e
	}
	return m.commit(f)
}

type attrOp struct {
	kind  string // chmod, chown, utime
	perm  uint32
	owner uint32 // uid and gid
	mtime int64
}

// setAttr applies a chmod, chown or utime of p (or of h's file) through
// mnt. defaults are the attributes mnt shows for a blob that stores none.
func (m *model) setAttr(mnt int, p string, h *mhandle, op attrOp, defaults mattrs) syscall.Errno {
	var f *mfile
	if h != nil {
		f = h.f
	} else {
		switch m.view(mnt, p) {
		case kNone:
			return syscall.ENOENT
		case kDir:
			panic("attributes of directories are not generated")
		}
		f = m.mountFile(mnt, p)
	}
	if f != nil && !f.hasSpill && !f.pending && !f.unlinked && m.store[f.path] == nil {
		// Removed by another writer: setattr fails when it looks the
		// blob up, which it does unless the attributes are known (and
		// then a change to what they are already is no change).
		return errENOENTOrOK
	}
	if f != nil && !f.hasSpill && !f.pending && !f.unlinked {
		// setattr looks the blob up first: what another writer set
		// since the open is kept.
		f.attrs = m.store[f.path].attrs
	}
	var cur mattrs
	if f != nil {
		cur = f.attrs
	} else {
		cur = m.store[p].attrs
	}
	shown := cur
	if shown.perm == 0 {
		shown.perm = defaults.perm
	}
	if !shown.owned {
		shown.uid, shown.gid = defaults.uid, defaults.gid
	}
	next := cur
	switch op.kind {
	case "chmod":
		if op.perm == shown.perm {
			return 0 // nothing to change: blobfs writes nothing
		}
		next.perm = op.perm
	case "chown":
		if op.owner == shown.uid && op.owner == shown.gid {
			return 0
		}
		next.perm, next.owned, next.uid, next.gid = shown.perm, true, op.owner, op.owner
	case "utime":
		next.mtime = op.mtime
	}
	if op.kind != "chmod" && next.perm == 0 {
		next.perm = shown.perm
	}
	if f == nil {
		b := m.store[p]
		nb := *b
		nb.attrs, nb.ver = next, m.nextVer()
		m.store[p] = &nb
		return 0
	}
	f.attrsChanged = true
	switch {
	case f.dirty && f.hasSpill && !f.unlinked:
		f.attrs = next // with the next commit
	case f.unlinked:
		f.attrs = next
	case !f.hasSpill:
		b := m.store[f.path]
		if b == nil {
			return syscall.ENOENT
		}
		nb := *b
		nb.attrs, nb.ver = next, m.nextVer()
		m.store[f.path] = &nb
		if f.opened && f.base == b.ver {
			f.base = nb.ver // this mount's own change is no other writer's
		}
		f.attrs = next
	default: // a spill, all committed: conditional on it
		b := m.store[f.path]
		if b == nil {
			return syscall.ENOENT
		}
		if b.ver != f.base {
			return syscall.ESTALE
		}
		nb := *b
		nb.attrs, nb.ver = next, m.nextVer()
		m.store[f.path] = &nb
		f.base = nb.ver
		f.attrs = next
	}
	return 0
}

// renameFile renames file src to dst through mnt.
func (m *model) renameFile(mnt int, src, dst string) syscall.Errno {
	if m.view(mnt, src) == kNone {
		return syscall.ENOENT
	}
	if e := m.parentErr(mnt, dst); e != 0 {
		return e
	}
	if src == dst {
		return 0
	}
	if m.view(mnt, dst) == kDir {
		return syscall.EISDIR
	}
	sf := m.mountFile(mnt, src)
	if sf != nil {
		// Its changes are committed first, then the blob is copied.
		if e := m.commit(sf); e != 0 {
			return e
		}
	}
	if df := m.mountFile(mnt, dst); df != nil {
		m.keepContent(df)
		df.unlinked = true
	}
	b := m.store[src]
	old := b.ver
	nb := *b
	nb.ver = m.nextVer()
	m.store[dst] = &nb
	delete(m.store, src)
	if sf != nil {
		sf.path = dst
		if sf.base == old {
			sf.base = nb.ver
		}
	}
	m.keepDir(parentOf(src))
	return 0
}

// copyFile is the first half of a file rename, the Copy of the blob at
// src to dst, as a session lost between the two halves leaves it; it
// returns the version of src that was copied. finishCopy is the second
// half as the next mount does it from the rename's record.
func (m *model) copyFile(src, dst string) int {
	nb := *m.store[src]
	nb.ver = m.nextVer()
	m.store[dst] = &nb
	return m.store[src].ver
}

func (m *model) finishCopy(src string) {
	delete(m.store, src)
	m.keepDir(parentOf(src))
}

// renameDir renames directory src to dst through mnt: every blob under it
// is copied.
func (m *model) renameDir(mnt int, src, dst string) syscall.Errno {
	if m.view(mnt, src) == kNone {
		return syscall.ENOENT
	}
	if src == dst {
		return 0
	}
	switch m.view(mnt, dst) {
	case kDir:
		if !m.dirEmpty(mnt, dst) {
			return syscall.ENOTEMPTY
		}
	case kNone:
	default:
		return syscall.ENOTDIR
	}
	for _, f := range slices.Clone(m.files) {
		if f.mount == mnt && !f.unlinked && strings.HasPrefix(f.path, src+"/") {
			if e := m.commit(f); e != 0 {
				return e
			}
		}
	}
	delete(m.store, dst)
	for _, f := range m.files {
		// A file this mount holds open below the directory the rename
		// replaces (the store no longer has its blob, or the directory
		// would not be empty) loses its name with it.
		if f.mount == mnt && !f.unlinked && strings.HasPrefix(f.path, dst+"/") {
			f.unlinked, f.nameLost = true, true
		}
	}
	moved := map[string][2]int{} // new name: old and new version
	for name, b := range m.store {
		if name == src || strings.HasPrefix(name, src+"/") {
			nn := dst + strings.TrimPrefix(name, src)
			nb := *b
			nb.ver = m.nextVer()
			m.store[nn] = &nb
			delete(m.store, name)
			moved[nn] = [2]int{b.ver, nb.ver}
		}
	}
	if len(moved) == 0 {
		// Nothing in the store moved: the directory is made anew, with a
		// marker. One with blobs below it moves as it is, a prefix
		// without a marker staying one (docs/semantics.md, Layout).
		m.store[dst] = &mblob{kind: kDir, ver: m.nextVer()}
	}
	for _, f := range m.files {
		if f.mount == mnt && !f.unlinked && strings.HasPrefix(f.path, src+"/") {
			f.path = dst + strings.TrimPrefix(f.path, src)
			if v, ok := moved[f.path]; ok && f.base == v[0] {
				f.base = v[1]
			}
		}
	}
	return 0
}

func (m *model) unlink(mnt int, p string) syscall.Errno {
	switch m.view(mnt, p) {
	case kNone:
		return syscall.ENOENT
	case kDir:
		return syscall.EISDIR
	}
	f := m.mountFile(mnt, p)
	if f != nil {
		m.keepContent(f)
		f.unlinked = true
	}
	if f == nil || !f.pending {
		delete(m.store, p)
	}
	m.keepDir(parentOf(p))
	return 0
}

// keepContent: a file that loses its name through its mount while
// writers hold it open keeps its content for them (the mount loads it
// before the blob goes), so that their writes and truncates after work
// on it until the last close, without reaching the store.
func (m *model) keepContent(f *mfile) {
	if f.writers > 0 && !f.hasSpill {
		if e := m.ensureSpill(f, true); e != 0 {
			panic("the blob of a file this mount sees is gone")
		}
	}
}

func (m *model) mkdir(mnt int, p string) syscall.Errno {
	if e := m.parentErr(mnt, p); e != 0 {
		return e
	}
	if m.view(mnt, p) != kNone {
		return syscall.EEXIST
	}
	m.store[p] = &mblob{kind: kDir, ver: m.nextVer()}
	return 0
}

func (m *model) rmdir(mnt int, p string) syscall.Errno {
	switch m.view(mnt, p) {
	case kNone:
		return syscall.ENOENT
	case kDir:
	default:
		return syscall.ENOTDIR
	}
	if !m.dirEmpty(mnt, p) {
		return syscall.ENOTEMPTY
	}
	delete(m.store, p)
	m.keepDir(parentOf(p))
	return 0
}

// mknode makes a symlink or a FIFO.
func (m *model) mknode(mnt int, p string, k mkind, target string) syscall.Errno {
	if e := m.parentErr(mnt, p); e != 0 {
		return e
	}
	if m.view(mnt, p) != kNone {
		return syscall.EEXIST
	}
	m.store[p] = &mblob{kind: k, target: target, ver: m.nextVer()}
	return 0
}

func (m *model) readlink(mnt int, p string) (string, syscall.Errno) {
	switch m.view(mnt, p) {
	case kNone:
		return "", syscall.ENOENT
	case kSymlink:
		return m.store[p].target, 0
	}
	return "", syscall.EINVAL
}

func (m *model) link(mnt int, src, dst string) syscall.Errno {
	if m.view(mnt, src) == kNone {
		return syscall.ENOENT
	}
	if e := m.parentErr(mnt, dst); e != 0 {
		return e
	}
	if m.view(mnt, dst) != kNone {
		return syscall.EEXIST
	}
	return syscall.EPERM
}

// modelSnap is the model before an operation that may fail for a store
// fault: mfiles are restored in place (handles point to them), blobs are
// never changed in place.
type modelSnap struct {
	store map[string]*mblob
	ver   int
	files []*mfile
	vals  []mfile
	lost  [2][][]byte
}

func (m *model) snapshot() *modelSnap {
	s := &modelSnap{store: maps.Clone(m.store), ver: m.ver, files: slices.Clone(m.files), lost: m.lost}
	for i := range s.lost {
		s.lost[i] = slices.Clone(m.lost[i])
	}
	for _, f := range m.files {
		s.vals = append(s.vals, *f)
	}
	return s
}

// restore puts the model back as it was at s; s stays usable for another
// restore.
func (m *model) restore(s *modelSnap) {
	m.store, m.ver, m.files, m.lost = maps.Clone(s.store), s.ver, slices.Clone(s.files), s.lost
	for i := range m.lost {
		m.lost[i] = slices.Clone(s.lost[i])
	}
	for i, f := range s.files {
		*f = s.vals[i]
	}
}

// closeFailed: a close whose commit failed for a store fault (EIO). The
// handle is gone; when it was the last, blobfs keeps the file and retries
// the upload in the background (retryCommit): the model keeps it, with no
// handle, until the faults end (faultsEnded).
func (m *model) closeFailed(h *mhandle) {
	f := h.f
	f.handles--
	if h.writer {
		f.writers--
	}
	if f.handles == 0 && (!f.dirty || f.unlinked) {
		m.release(f)
	}
}

// faultsEnded: the store answers again; the uploads retried in the
// background commit, or lose to another writer (lost+found).
func (m *model) faultsEnded(mnt int) {
	for _, f := range slices.Clone(m.files) {
		if f.mount == mnt && f.handles == 0 {
			m.release(f)
		}
	}
}

// loseSession: the serving process of mount mnt and its keeper died
// together; the mount and its handles are gone. The next mount on the same
// cache directory uploads each file with unsaved changes under the
// condition its commit had (the version its writers saw, or no blob for a
// new file), or keeps it in lost+found when another writer overtook it
// (spillrecover.go). A file unlinked while open is dropped.
func (m *model) loseSession(mnt int) {
	for _, f := range slices.Clone(m.files) {
		if f.mount != mnt {
			continue
		}
		if f.dirty && !f.unlinked {
			b := m.store[f.path]
			if (b == nil || b.kind == kFile) && m.curVer(f.path) == f.base {
				attrs := f.attrs
				attrs.mtime = 0
				m.store[f.path] = &mblob{kind: kFile, data: bytes.Clone(f.spill), ver: m.nextVer(), attrs: attrs}
			} else {
				m.lost[mnt] = append(m.lost[mnt], bytes.Clone(f.spill))
			}
		}
		m.files = slices.DeleteFunc(m.files, func(g *mfile) bool { return g == f })
	}
}

// storePut is another client of the store replacing (or creating) a blob.
func (m *model) storePut(p string, data []byte) {
	m.store[p] = &mblob{kind: kFile, data: bytes.Clone(data), ver: m.nextVer()}
}

func (m *model) storeDelete(p string) {
	delete(m.store, p)
}
