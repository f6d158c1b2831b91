package blobstore

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Local is the embedded default backend: a container kept in a directory of
// the local filesystem (Linux only). Blob "a/b/c" is the regular file
// DIR/a/b/c, so the data stays readable with ordinary tools.
//
// # Metadata
//
// A blob's ETag, Last-Modified and metadata live in one extended attribute
// of its file, user.blobfs.meta, as JSON. An xattr belongs to the inode, so
// content and metadata are replaced together by the one rename(2) that
// publishes a write: there is no moment, and no crash, at which a reader
// sees new content with old metadata. A sidecar file could not give that
// without a journal, so Local needs user xattrs (ext4, xfs, btrfs, tmpfs
// since Linux 6.6, overlayfs over those) and NewLocal refuses a directory
// without them rather than silently degrading. ETags are random 64-bit
// values drawn on every write, not derived from mtime, so two writes in the
// same second still differ. A file put into DIR by hand (no xattr) is served
// with an ETag derived from its inode, size and times and no metadata.
// Metadata must fit one xattr; on ext4 that is about 4 KiB, less than
// Azure's 8 KiB, and larger metadata is refused with ErrInvalidName.
//
// # Names that are also prefixes
//
// Azure allows blob "a" next to blob "a/b"; a filesystem cannot have a file
// and a directory both called DIR/a. This is not a corner case: blobfs's
// marker blob for directory "a" is a blob named "a". Local keeps the natural
// layout and resolves the clash in the directory's favour: when "a" must
// become a directory while it is a blob, the blob moves to DIR/a/.blobfs-self
// (the "self file" of the directory), atomically, with
// renameat2(RENAME_EXCHANGE) of the file and a prepared directory. Readers
// resolve a name to DIR/name, or to DIR/name/.blobfs-self when that is a
// directory. Segments starting with ".blobfs-" are therefore reserved and
// refused with ErrInvalidName. A directory that keeps only its self file
// after its other entries are deleted is left as it is (List still reports
// just the blob); empty directories are removed after Delete so that List
// never reports a prefix without blobs.
//
// # Crash safety
//
// Every write goes to a temporary file under DIR/.blobfs-tmp (hidden from
// List), which is fsynced, renamed into place and its directory fsynced;
// staged blocks are fsynced too, since they are acknowledged as stored.
// Staged blocks are files under DIR/.blobfs-tmp/blocks/SHA256(name)/;
// CommitBlocks claims that directory with one rename, concatenates the
// listed blocks into a temporary file (copy_file_range, a reflink where the
// filesystem can) and renames it into place. A block of the blob's
// committed block list is copied from the current blob file, at the place
// its list (committedList) gives. NewLocal finishes a self-file
// conversion that the non-atomic fallback (filesystems without
// RENAME_EXCHANGE) left half done, and removes temporary files older than
// a day and staged blocks older than a week (Azure keeps uncommitted
// blocks for a week too).
//
// # Locking
//
// Reads take no lock: they open the file and work on that inode, which a
// concurrent write replaces but never changes. Changes to the namespace
// (rename into place, mkdir, rmdir, the self-file exchange, claiming
// blocks, conditional checks) run under a namespace lock: a mutex within
// the process plus flock(2) on DIR/.blobfs-tmp/lock across processes, so two
// processes may share one directory. Data is written and fsynced outside
// the lock.
type Local struct {
	dir      string // root of the container: absolute, symlinks resolved
	tmpDir   string // DIR/.blobfs-tmp/tmp: temporary files and directories
	blockDir string // DIR/.blobfs-tmp/blocks: staged blocks per blob
	listDir  string // DIR/.blobfs-tmp/lists: committed block lists per blob
	lockPath string // DIR/.blobfs-tmp/lock: flock'ed around namespace changes

	mu sync.Mutex // serializes namespace changes within the process

	// noExchange makes the self-file conversion use its fallback, as on
	// a filesystem without RENAME_EXCHANGE. Set by tests only.
	noExchange bool
}

var _ Store = (*Local)(nil)

const (
	localStaging   = ".blobfs-tmp"  // staging area in the root
	localSelf      = ".blobfs-self" // a directory's own blob
	localReserved  = ".blobfs-"     // segments with this prefix are ours
	localMetaXattr = "user.blobfs.meta"
	localDirPerm   = 0o700
	// localTmpMaxAge and localBlockMaxAge bound how long NewLocal keeps
	// leftovers of interrupted writes and uploads.
	localTmpMaxAge   = 24 * time.Hour
	localBlockMaxAge = 7 * 24 * time.Hour
	// convTargetSuffix marks, beside a conversion directory, the file that
	// names its destination while the non-atomic fallback runs.
	convTargetSuffix = ".target"
)

// localMeta is the JSON kept in the user.blobfs.meta xattr.
type localMeta struct {
	ETag     string            `json:"etag"`
	ModTime  int64             `json:"mtime"` // Last-Modified, Unix seconds
	Metadata map[string]string `json:"md,omitempty"`
	MD5      []byte            `json:"md5,omitempty"` // Content-MD5
}

// NewLocal opens the container kept in directory dir, which must exist. It
// creates the staging area DIR/.blobfs-tmp, checks that the filesystem
// supports user xattrs, and repairs or removes what interrupted writes left
// behind.
func NewLocal(dir string) (*Local, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("local store %q: %w", dir, err)
	}
	// Blob files are opened without following any symlink (see
	// openNoSymlinks), so the root's own path must have none.
	abs, err = filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("local store: %w", mapOSError(err))
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("local store: %w", mapOSError(err))
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("local store: %s is not a directory", abs)
	}
	staging := filepath.Join(abs, localStaging)
	l := &Local{
		dir:      abs,
		tmpDir:   filepath.Join(staging, "tmp"),
		blockDir: filepath.Join(staging, "blocks"),
		listDir:  filepath.Join(staging, "lists"),
		lockPath: filepath.Join(staging, "lock"),
	}
	for _, d := range []string{staging, l.tmpDir, l.blockDir, l.listDir} {
		if err := os.Mkdir(d, localDirPerm); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("local store %s: create staging area: %w", abs, mapOSError(err))
		}
	}
	if err := l.probeXattr(); err != nil {
		return nil, err
	}
	if err := l.recover(); err != nil {
		return nil, fmt.Errorf("local store %s: clean up staging area: %w", abs, err)
	}
	return l, nil
}

// Dir returns the directory that holds the container.
func (l *Local) Dir() string { return l.dir }

func (l *Local) probeXattr() error {
	f, err := os.CreateTemp(l.tmpDir, "probe-")
	if err != nil {
		return fmt.Errorf("local store %s: %w", l.dir, mapOSError(err))
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := unix.Fsetxattr(int(f.Fd()), localMetaXattr, []byte("{}"), 0); err != nil {
		return fmt.Errorf("local store %s: the filesystem does not support user extended attributes, which hold ETags and metadata: %w", l.dir, err)
	}
	return nil
}

// recover runs at start-up, under the namespace lock: it finishes
// self-file conversions that the non-atomic fallback left half done, and
// removes old temporary files and staged blocks.
func (l *Local) recover() error {
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	defer unlock()
	entries, err := os.ReadDir(l.tmpDir)
	if err != nil {
		return err
	}
	// Conversions first: their directories hold the only link to a blob.
	for _, e := range entries {
		if conv, ok := strings.CutSuffix(e.Name(), convTargetSuffix); ok {
			l.finishConversion(filepath.Join(l.tmpDir, conv), filepath.Join(l.tmpDir, e.Name()))
		}
	}
	now := time.Now()
	for _, e := range entries {
		p := filepath.Join(l.tmpDir, e.Name())
		switch {
		case strings.HasSuffix(e.Name(), convTargetSuffix):
		case strings.HasPrefix(e.Name(), "conv-"), strings.HasPrefix(e.Name(), "drop-"):
			// Conversions are only in flight under the lock, which we
			// hold; drop-* is garbage from the start.
			_ = os.RemoveAll(p)
		default:
			// Temporary files and claimed blocks of writes that may
			// still be running in another process.
			if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > localTmpMaxAge {
				_ = os.RemoveAll(p)
			}
		}
	}
	blocks, err := os.ReadDir(l.blockDir)
	if err != nil {
		return err
	}
	for _, e := range blocks {
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > localBlockMaxAge {
			_ = os.RemoveAll(filepath.Join(l.blockDir, e.Name()))
		}
	}
	return nil
}

// finishConversion completes a fallback conversion interrupted between
// removing the blob file and renaming the directory that holds it as self
// file into its place (see fileToDir).
func (l *Local) finishConversion(conv, targetFile string) {
	rel, err := os.ReadFile(targetFile)
	if err == nil && filepath.IsLocal(string(rel)) {
		target := filepath.Join(l.dir, string(rel))
		if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
			if os.Rename(conv, target) == nil {
				syncDir(filepath.Dir(target))
			}
		}
	}
	_ = os.RemoveAll(conv)
	_ = os.Remove(targetFile)
}

// lock takes the namespace lock; the returned function releases it.
func (l *Local) lock() (func(), error) {
	l.mu.Lock()
	f, err := os.OpenFile(l.lockPath, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		l.mu.Unlock()
		return nil, fmt.Errorf("local store %s: lock: %w", l.dir, mapOSError(err))
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		l.mu.Unlock()
		return nil, fmt.Errorf("local store %s: lock: %w", l.dir, err)
	}
	return func() {
		f.Close() // releases the flock
		l.mu.Unlock()
	}, nil
}

// checkName applies ValidateName and the local store's own limits.
func (l *Local) checkName(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	for seg := range strings.SplitSeq(name, "/") {
		if len(seg) > 255 {
			return fmt.Errorf("%w %q: segment longer than 255 bytes, the limit of a file name", ErrInvalidName, name)
		}
		if strings.HasPrefix(seg, localReserved) {
			return fmt.Errorf("%w %q: segments starting with %q are reserved by the local store", ErrInvalidName, name, localReserved)
		}
	}
	return nil
}

// validSegment reports whether a directory entry can be part of a blob
// name; anything else found on disk (put there by hand, or ours) is not
// listed.
func validSegment(seg string) bool {
	return seg != "" && !strings.HasPrefix(seg, localReserved) && !strings.HasSuffix(seg, ".") &&
		utf8.ValidString(seg)
}

func (l *Local) path(name string) string { return filepath.Join(l.dir, filepath.FromSlash(name)) }

// mapOSError turns errors of the local filesystem into the package's
// sentinels where one applies, keeping the original as the cause.
func mapOSError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	return err
}

// openNoSymlinks opens path (under the canonical l.dir) for reading
// without following a symlink in any component: a symlink put into the
// directory by hand must not let blob names reach files outside it.
// O_NONBLOCK keeps a FIFO found there from blocking the open.
func openNoSymlinks(path string) (*os.File, error) {
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOFOLLOW
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   flags,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// Before Linux 5.6, or openat2 filtered by seccomp: walk the
		// components one openat(O_NOFOLLOW) at a time.
		fd, err = openWalk(path, flags)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

func openWalk(path string, flags int) (int, error) {
	dir, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	comps := strings.Split(strings.Trim(path, "/"), "/")
	for i, c := range comps {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			f = flags
		}
		next, err := unix.Openat(dir, c, f, 0)
		unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = next
	}
	return dir, nil
}

// openBlob opens the file that holds blob name: DIR/name, or the self file
// inside it when DIR/name is a directory. Opening first and looking at the
// open file makes the answer consistent even while a writer converts the
// file into a directory.
func (l *Local) openBlob(name string) (*os.File, error) {
	f, err := openNoSymlinks(l.path(name))
	if err != nil {
		if errors.Is(err, syscall.ELOOP) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, notFound(name)
		}
		return nil, mapOSError(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.IsDir() {
		fd, err := unix.Openat(int(f.Fd()), localSelf, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		f.Close()
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
				return nil, notFound(name)
			}
			return nil, err
		}
		f = os.NewFile(uintptr(fd), filepath.Join(l.path(name), localSelf))
		if fi, err = f.Stat(); err != nil {
			f.Close()
			return nil, err
		}
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, notFound(name)
	}
	return f, nil
}

// readMeta returns the metadata of an open blob file.
func readMeta(f *os.File) (localMeta, error) {
	buf := make([]byte, 512)
	for {
		n, err := unix.Fgetxattr(int(f.Fd()), localMetaXattr, buf)
		switch {
		case err == nil:
			var m localMeta
			if err := json.Unmarshal(buf[:n], &m); err != nil {
				return localMeta{}, fmt.Errorf("local store: %s: corrupt %s xattr: %w", f.Name(), localMetaXattr, err)
			}
			return m, nil
		case errors.Is(err, unix.ERANGE):
			size, err := unix.Fgetxattr(int(f.Fd()), localMetaXattr, nil)
			if err != nil {
				return localMeta{}, err
			}
			buf = make([]byte, size)
		case errors.Is(err, unix.ENODATA):
			fi, err := f.Stat()
			if err != nil {
				return localMeta{}, err
			}
			return syntheticMeta(fi), nil
		default:
			return localMeta{}, fmt.Errorf("local store: %s: read metadata: %w", f.Name(), err)
		}
	}
}

// syntheticMeta serves a file without our xattr (put into the directory by
// hand): an ETag that changes when the file does, its mtime, no metadata.
func syntheticMeta(fi fs.FileInfo) localMeta {
	h := fnv.New64a()
	var b [8]byte
	put := func(v int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	put(fi.Size())
	put(fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		put(int64(st.Ino))
		put(st.Ctim.Nano())
	}
	return localMeta{
		ETag:    fmt.Sprintf(`"0xF%015X"`, h.Sum64()>>4),
		ModTime: fi.ModTime().Unix(),
	}
}

func newLocalMeta(md map[string]string, sum []byte) localMeta {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return localMeta{
		ETag:     fmt.Sprintf(`"0x%016X"`, binary.LittleEndian.Uint64(b[:])),
		ModTime:  time.Now().Unix(),
		Metadata: cloneMetadata(md),
		MD5:      slices.Clone(sum),
	}
}

func writeMeta(f *os.File, m localMeta) error {
	js, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := unix.Fsetxattr(int(f.Fd()), localMetaXattr, js, 0); err != nil {
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ERANGE) {
			return fmt.Errorf("%w: metadata (%d bytes as JSON) does not fit in an extended attribute on this filesystem: %w", ErrInvalidName, len(js), err)
		}
		return fmt.Errorf("local store: %s: write metadata: %w", f.Name(), err)
	}
	return nil
}

func (m localMeta) attrs(name string, size int64) Attrs {
	return Attrs{
		Name:       name,
		Size:       size,
		ModTime:    time.Unix(m.ModTime, 0).UTC(),
		ETag:       m.ETag,
		Metadata:   cloneMetadata(m.Metadata),
		ContentMD5: slices.Clone(m.MD5),
	}
}

// statBlob returns the attributes of an open blob file.
func statBlob(f *os.File, name string) (Attrs, localMeta, error) {
	fi, err := f.Stat()
	if err != nil {
		return Attrs{}, localMeta{}, err
	}
	m, err := readMeta(f)
	if err != nil {
		return Attrs{}, localMeta{}, err
	}
	return m.attrs(name, fi.Size()), m, nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, name string) (Attrs, error) {
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if err := l.checkName(name); err != nil {
		return Attrs{}, err
	}
	f, err := l.openBlob(name)
	if err != nil {
		return Attrs{}, err
	}
	defer f.Close()
	a, _, err := statBlob(f, name)
	return a, err
}

// ReadAt implements Store.
func (l *Local) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := l.checkName(name); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("blobstore: negative offset %d", off)
	}
	f, err := l.openBlob(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if etag != "" {
		m, err := readMeta(f)
		if err != nil {
			return 0, err
		}
		if m.ETag != etag {
			return 0, fmt.Errorf("%q: etag is not %s: %w", name, etag, ErrPreconditionFailed)
		}
	}
	// The open file is one version of the blob: a concurrent write
	// renames a new file over the name and leaves this inode alone.
	n, err := f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("local store: read %q: %w", name, err)
	}
	return n, err
}

// localEntry is one blob or directory met while listing.
type localEntry struct {
	key  string // blob name; for a directory, its prefix ending in "/"
	path string // file or directory on disk
	dir  bool
}

// localFrame is one directory being listed: its entries in key order and
// the next one to look at.
type localFrame struct {
	entries []localEntry
	i       int
}

// localCursor walks the tree in byte order of blob names, for listPage.
// Sorting by key ("name" for files, "name/" for directories) rather than
// by file name is what interleaves blobs and prefixes the way Azure does:
// "a-b" < "a/x" < "a0".
type localCursor struct {
	prefix string
	stack  []*localFrame
	reads  int // directories read, for tests
}

func (c *localCursor) readFrame(dir, prefix string) (*localFrame, error) {
	c.reads++
	des, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return &localFrame{}, nil // removed while we list
		}
		return nil, err
	}
	fr := &localFrame{entries: make([]localEntry, 0, len(des))}
	for _, de := range des {
		name := de.Name()
		if !validSegment(name) {
			continue
		}
		p := filepath.Join(dir, name)
		switch {
		case de.Type().IsRegular():
			fr.entries = append(fr.entries, localEntry{key: prefix + name, path: p})
		case de.IsDir():
			fr.entries = append(fr.entries, localEntry{key: prefix + name + "/", path: p, dir: true})
			self := filepath.Join(p, localSelf)
			if fi, err := os.Lstat(self); err == nil && fi.Mode().IsRegular() {
				fr.entries = append(fr.entries, localEntry{key: prefix + name, path: self})
			}
		}
	}
	slices.SortFunc(fr.entries, func(a, b localEntry) int { return strings.Compare(a.key, b.key) })
	return fr, nil
}

// seek returns the first blob whose name is >= key. Keys never decrease,
// so the walk only moves forward; a directory whose names all sort before
// key is skipped without being read.
func (c *localCursor) seek(key string) (localEntry, string, bool, error) {
	for len(c.stack) > 0 {
		top := c.stack[len(c.stack)-1]
		if top.i == len(top.entries) {
			c.stack = c.stack[:len(c.stack)-1]
			continue
		}
		e := top.entries[top.i]
		if e.key > c.prefix && !strings.HasPrefix(e.key, c.prefix) && !strings.HasPrefix(c.prefix, e.key) {
			// This and everything after it sort after every name
			// with the prefix.
			return localEntry{}, "", false, nil
		}
		if !e.dir {
			if e.key < key {
				top.i++
				continue
			}
			return e, e.key, true, nil
		}
		top.i++
		if e.key < key && !strings.HasPrefix(key, e.key) {
			continue // every name below sorts before key
		}
		fr, err := c.readFrame(e.path, e.key)
		if err != nil {
			return localEntry{}, "", false, err
		}
		c.stack = append(c.stack, fr)
	}
	return localEntry{}, "", false, nil
}

// List implements Store.
func (l *Local) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	if err := ctx.Err(); err != nil {
		return ListPage{}, err
	}
	if _, err := os.Stat(l.dir); err != nil {
		return ListPage{}, fmt.Errorf("local store: list: %w", mapOSError(err))
	}
	root, err := (&localCursor{}).readFrame(l.dir, "")
	if err != nil {
		return ListPage{}, fmt.Errorf("local store: list: %w", mapOSError(err))
	}
	c := &localCursor{prefix: opts.Prefix, stack: []*localFrame{root}}
	entries, prefixes, next, err := listPage(ctx, opts, c.seek)
	if err != nil {
		return ListPage{}, err
	}
	page := ListPage{Prefixes: prefixes, NextMarker: next}
	for _, e := range entries {
		a, err := l.statPath(e.path, e.key)
		if errors.Is(err, ErrNotFound) {
			continue // deleted while we list
		}
		if err != nil {
			return ListPage{}, err
		}
		page.Blobs = append(page.Blobs, a)
	}
	return page, nil
}

func (l *Local) statPath(path, name string) (Attrs, error) {
	f, err := openNoSymlinks(path)
	if err != nil {
		return Attrs{}, mapOSError(err)
	}
	defer f.Close()
	a, _, err := statBlob(f, name)
	return a, err
}

// createTemp makes a temporary file in the staging area.
func (l *Local) createTemp(kind string) (*os.File, error) {
	f, err := os.CreateTemp(l.tmpDir, kind+"-")
	if err != nil {
		return nil, fmt.Errorf("local store: %w", mapOSError(err))
	}
	return f, nil
}

// finishTemp sets the metadata of a fully written temporary file, makes it
// durable and closes it. It removes the file on failure.
func finishTemp(f *os.File, m localMeta) error {
	err := writeMeta(f, m)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error) {
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if err := l.checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	f, err := l.createTemp("put")
	if err != nil {
		return Attrs{}, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return Attrs{}, fmt.Errorf("local store: put %q: %w", name, err)
	}
	sum := md5.Sum(data) // kept as the blob's Content-MD5, as Azure does
	m := newLocalMeta(opts.Metadata, sum[:])
	if err := finishTemp(f, m); err != nil {
		return Attrs{}, err
	}
	if err := l.publish(ctx, name, f.Name(), opts.Conditions); err != nil {
		return Attrs{}, err
	}
	l.dropList(name)
	return m.attrs(name, int64(len(data))), nil
}

func (l *Local) checkWrite(name string, opts PutOptions) error {
	if err := l.checkName(name); err != nil {
		return err
	}
	if err := ValidateMetadata(opts.Metadata); err != nil {
		return err
	}
	return checkConditions(opts.Conditions)
}

// publish renames the finished temporary file tmp into place as blob name,
// if cond holds, and drops the blob's staged blocks. It removes tmp on
// failure.
func (l *Local) publish(ctx context.Context, name, tmp string, cond Conditions) (err error) {
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	var (
		dirty []string // directories to fsync once the lock is released
		trash string   // dropped blocks to remove then
	)
	defer func() {
		unlock()
		for _, d := range dirty {
			syncDir(d)
		}
		removeTrash(trash)
	}()
	// A caller that gave up must not see its write happen later.
	if err := ctx.Err(); err != nil {
		return err
	}
	exists, etag, err := l.currentETag(name)
	if err != nil {
		return err
	}
	if err := evalConditions(name, cond, exists, etag); err != nil {
		return err
	}
	segs := strings.Split(name, "/")
	p := l.dir
	for _, seg := range segs[:len(segs)-1] {
		parent := p
		p = filepath.Join(p, seg)
		fi, err := os.Lstat(p)
		switch {
		case err == nil && fi.IsDir():
		case err == nil && fi.Mode().IsRegular():
			// Blob "a" must make room for "a/...".
			if err := l.fileToDir(p); err != nil {
				return err
			}
			dirty = append(dirty, p, parent)
		case err == nil:
			return fmt.Errorf("local store: %s is neither a file nor a directory", p)
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, localDirPerm); err != nil {
				return fmt.Errorf("local store: %w", mapOSError(err))
			}
			dirty = append(dirty, parent)
		default:
			return fmt.Errorf("local store: %w", mapOSError(err))
		}
	}
	target := filepath.Join(p, segs[len(segs)-1])
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		target = filepath.Join(target, localSelf) // "a" is also a prefix
	}
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("local store: put %q: %w", name, mapOSError(err))
	}
	dirty = append(dirty, filepath.Dir(target))
	trash = l.dropBlocksLocked(name)
	return nil
}

// currentETag returns whether blob name exists and its ETag.
func (l *Local) currentETag(name string) (bool, string, error) {
	f, err := l.openBlob(name)
	if errors.Is(err, ErrNotFound) {
		return false, "", nil
	}
	if err != nil {
		return false, "", err
	}
	defer f.Close()
	m, err := readMeta(f)
	if err != nil {
		return false, "", err
	}
	return true, m.ETag, nil
}

// fileToDir turns the blob file p into a directory that holds the same
// inode as its self file. Called with the namespace lock held.
//
// The directory is prepared in the staging area with a hard link to the
// blob, then swapped with the file by renameat2(RENAME_EXCHANGE): readers
// see the blob at every instant, and a crash leaves either state. Where the
// filesystem cannot exchange, the fallback removes the file and renames the
// directory in; a crash between the two is repaired by NewLocal from a
// record written beforehand.
func (l *Local) fileToDir(p string) error {
	conv, err := os.MkdirTemp(l.tmpDir, "conv-")
	if err != nil {
		return fmt.Errorf("local store: %w", mapOSError(err))
	}
	defer os.RemoveAll(conv) // after the exchange: the old file's link
	if err := os.Link(p, filepath.Join(conv, localSelf)); err != nil {
		return fmt.Errorf("local store: %w", mapOSError(err))
	}
	// The link must be durable before the directory holding it becomes
	// the only way to the blob.
	syncDir(conv)
	if !l.noExchange {
		err := unix.Renameat2(unix.AT_FDCWD, conv, unix.AT_FDCWD, p, unix.RENAME_EXCHANGE)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("local store: make directory %s: %w", p, err)
		}
	}
	rel, err := filepath.Rel(l.dir, p)
	if err != nil {
		return err
	}
	record := conv + convTargetSuffix
	if err := writeFileSync(record, []byte(rel)); err != nil {
		return fmt.Errorf("local store: %w", err)
	}
	defer os.Remove(record)
	syncDir(l.tmpDir)
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("local store: %w", mapOSError(err))
	}
	if err := os.Rename(conv, p); err != nil {
		return fmt.Errorf("local store: make directory %s: %w", p, err)
	}
	return nil
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir makes the entries of directory d durable. Errors are ignored:
// the rename it follows has happened, and a directory that vanished since
// needs no sync.
func syncDir(d string) {
	f, err := os.Open(d)
	if err != nil {
		return
	}
	_ = f.Sync()
	f.Close()
}

// blocksOf returns the directory of blob name's staged blocks.
func (l *Local) blocksOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return filepath.Join(l.blockDir, hex.EncodeToString(sum[:]))
}

// blockFile names a block's file: block ids are base64 and may hold "/".
func blockFile(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }

// dropBlocksLocked discards blob name's staged blocks, with one rename
// under the namespace lock. It returns the directory that now holds them
// (or ""), for removeTrash once the lock is released: removing thousands
// of blocks need not hold up other writers. A crash in between leaves a
// drop-* directory that NewLocal removes.
func (l *Local) dropBlocksLocked(name string) string {
	trash := filepath.Join(l.tmpDir, "drop-"+randomHex(8))
	if os.Rename(l.blocksOf(name), trash) != nil {
		return "" // nothing staged
	}
	return trash
}

func removeTrash(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// StageBlock implements Store.
func (l *Local) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.checkName(name); err != nil {
		return err
	}
	if err := validateBlockID(blockID); err != nil {
		return err
	}
	dir := l.blocksOf(name)
	if d, err := os.Open(dir); err == nil {
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) > 0 {
			if other, err := base64.RawURLEncoding.DecodeString(names[0]); err == nil {
				if err := sameBlockIDLength(name, blockID, string(other)); err != nil {
					return err
				}
			}
		}
	}
	f, err := l.createTemp("block")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		// A staged block is acknowledged as stored: it must survive
		// a power cut as much as the blob it will become.
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("local store: stage block of %q: %w", name, err)
	}
	unlock, err := l.lock()
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	err = os.Mkdir(dir, localDirPerm)
	if err == nil || errors.Is(err, fs.ErrExist) {
		err = os.Rename(f.Name(), filepath.Join(dir, blockFile(blockID)))
	}
	unlock()
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("local store: stage block of %q: %w", name, err)
	}
	syncDir(dir)
	return nil
}

// CommitBlocks implements Store.
func (l *Local) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error) {
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if err := l.checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	if len(blockIDs) > MaxBlocks {
		return Attrs{}, fmt.Errorf("blobstore: %q: %d blocks, more than %d", name, len(blockIDs), MaxBlocks)
	}
	claimed, committed, err := l.claimBlocks(name, blockIDs, opts.Conditions)
	if err != nil {
		return Attrs{}, err
	}
	if committed != nil {
		defer committed.f.Close()
	}
	sizes, tmp, err := l.concatBlocks(ctx, name, claimed, committed, blockIDs, opts.Metadata, opts.ContentMD5)
	if err == nil {
		err = l.publish(ctx, name, tmp.name, opts.Conditions)
	}
	if err != nil {
		// A failed commit changes nothing in Azure: the blocks stay
		// staged for another attempt.
		l.unclaimBlocks(name, claimed)
		return Attrs{}, err
	}
	_ = os.RemoveAll(claimed)
	l.writeList(name, committedList{ETag: tmp.meta.ETag, IDs: blockIDs, Sizes: sizes})
	var size int64
	for _, n := range sizes {
		size += n
	}
	return tmp.meta.attrs(name, size), nil
}

// committedList is a blob's committed block list, kept in
// DIR/.blobfs-tmp/lists/SHA256(name) as JSON. It is written after the
// commit it describes and holds only while the blob's ETag is ETag: a
// list that a Put, a crash or a racing commit left stale names another
// version and is ignored. So a stale list can make a commit that names
// committed blocks fail (its caller then sends them again), never take
// bytes from another version; it need not be fsynced.
type committedList struct {
	ETag  string   `json:"etag"`
	IDs   []string `json:"ids"`
	Sizes []int64  `json:"sizes"`
}

func (l *Local) listOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return filepath.Join(l.listDir, hex.EncodeToString(sum[:]))
}

// writeList replaces name's committed block list; a failure only costs a
// later commit its reuse of these blocks.
func (l *Local) writeList(name string, list committedList) {
	b, err := json.Marshal(list)
	if err != nil {
		return
	}
	f, err := l.createTemp("list")
	if err != nil {
		return
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), l.listOf(name))
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

// dropList removes name's committed block list, if any: a blob written
// by Put or Copy has none (a stale list would only be ignored, but it
// would stay on disk until the blob's Delete).
func (l *Local) dropList(name string) {
	_ = os.Remove(l.listOf(name))
}

// readList returns name's committed block list, if it has a readable one
// (not necessarily of its current version).
func (l *Local) readList(name string) (committedList, bool) {
	var list committedList
	b, err := os.ReadFile(l.listOf(name))
	if err != nil || json.Unmarshal(b, &list) != nil || len(list.IDs) != len(list.Sizes) {
		return committedList{}, false
	}
	return list, true
}

// committedBlocks is where the blocks of a blob's committed block list
// are: ranges of the open blob file f, the version the list describes.
type committedBlocks struct {
	f      *os.File
	ranges map[string][2]int64 // id -> offset, size
}

// openCommittedLocked opens name's current version with the places of
// its committed blocks, or returns nil if it has no valid list. Called
// with the namespace lock held, so that the version opened is the one
// whose ETag is checked.
func (l *Local) openCommittedLocked(name string) *committedBlocks {
	list, ok := l.readList(name)
	if !ok {
		return nil
	}
	f, err := l.openBlob(name)
	if err != nil {
		return nil
	}
	if m, err := readMeta(f); err != nil || m.ETag != list.ETag {
		f.Close()
		return nil
	}
	c := &committedBlocks{f: f, ranges: make(map[string][2]int64, len(list.IDs))}
	var off int64
	for i, id := range list.IDs {
		c.ranges[id] = [2]int64{off, list.Sizes[i]}
		off += list.Sizes[i]
	}
	return c
}

// claimBlocks checks, under the namespace lock, that cond holds and every
// listed block is staged or committed, then takes the blob's staged blocks
// out of reach of other committers with one rename. It returns the
// directory that now holds them and, if some listed block is not staged,
// the committed ones (to be closed by the caller).
func (l *Local) claimBlocks(name string, ids []string, cond Conditions) (claimed string, committed *committedBlocks, err error) {
	unlock, err := l.lock()
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	defer func() {
		if err != nil && committed != nil {
			committed.f.Close()
		}
	}()
	// Fail early on a condition that already does not hold; publish
	// checks again at the end.
	exists, etag, err := l.currentETag(name)
	if err != nil {
		return "", nil, err
	}
	if err := evalConditions(name, cond, exists, etag); err != nil {
		return "", nil, err
	}
	dir := l.blocksOf(name)
	for _, id := range ids {
		_, err := os.Lstat(filepath.Join(dir, blockFile(id)))
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", nil, err
		}
		if committed == nil && exists {
			committed = l.openCommittedLocked(name)
		}
		if committed == nil {
			return "", nil, fmt.Errorf("blobstore: commit %q: block %q is neither staged nor committed", name, id)
		}
		if _, ok := committed.ranges[id]; !ok {
			return "", nil, fmt.Errorf("blobstore: commit %q: block %q is neither staged nor committed", name, id)
		}
	}
	claimed = filepath.Join(l.tmpDir, "claim-"+randomHex(8))
	if err := os.Rename(dir, claimed); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return "", nil, fmt.Errorf("local store: commit %q: %w", name, err)
		}
		// Nothing staged: an empty blob, or committed blocks only.
		if err := os.Mkdir(claimed, localDirPerm); err != nil {
			return "", nil, err
		}
	}
	// Age-based clean-up of the staging area goes by mtime.
	now := time.Now()
	_ = os.Chtimes(claimed, now, now)
	return claimed, committed, nil
}

// unclaimBlocks puts claimed blocks back after a failed commit, without
// replacing blocks staged again meanwhile.
func (l *Local) unclaimBlocks(name, claimed string) {
	unlock, err := l.lock()
	if err != nil {
		_ = os.RemoveAll(claimed)
		return
	}
	defer unlock()
	dir := l.blocksOf(name)
	if os.Rename(claimed, dir) == nil {
		return
	}
	if entries, err := os.ReadDir(claimed); err == nil {
		for _, e := range entries {
			dst := filepath.Join(dir, e.Name())
			if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
				_ = os.Rename(filepath.Join(claimed, e.Name()), dst)
			}
		}
	}
	_ = os.RemoveAll(claimed)
}

type finishedTemp struct {
	name string
	meta localMeta
}

// concatBlocks writes the listed blocks, in order, into a new temporary
// file with metadata md: each staged one from claimed, any other from the
// committed blocks. It returns the blocks' sizes.
func (l *Local) concatBlocks(ctx context.Context, name, claimed string, committed *committedBlocks, ids []string, md map[string]string, sum []byte) ([]int64, finishedTemp, error) {
	f, err := l.createTemp("commit")
	if err != nil {
		return nil, finishedTemp{}, err
	}
	fail := func(err error) ([]int64, finishedTemp, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, finishedTemp{}, fmt.Errorf("local store: commit %q: %w", name, err)
	}
	sizes := make([]int64, len(ids))
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		// Copies between two files use copy_file_range: no copy
		// through user space, a reflink where supported.
		b, err := os.Open(filepath.Join(claimed, blockFile(id)))
		if err == nil {
			sizes[i], err = io.Copy(f, b)
			b.Close()
		} else if r, ok := committed.lookup(id); ok && errors.Is(err, fs.ErrNotExist) {
			sizes[i], err = copyRange(f, committed.f, r[0], r[1])
		}
		if err != nil {
			return fail(fmt.Errorf("block %q: %w", id, err))
		}
	}
	m := newLocalMeta(md, sum)
	if err := finishTemp(f, m); err != nil {
		return nil, finishedTemp{}, err
	}
	return sizes, finishedTemp{name: f.Name(), meta: m}, nil
}

// lookup returns the place of committed block id; c may be nil.
func (c *committedBlocks) lookup(id string) ([2]int64, bool) {
	if c == nil {
		return [2]int64{}, false
	}
	r, ok := c.ranges[id]
	return r, ok
}

// copyRange appends n bytes of src at off to dst, with copy_file_range
// (os.File.ReadFrom takes a LimitedReader of a file at its offset).
func copyRange(dst, src *os.File, off, n int64) (int64, error) {
	if _, err := src.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	got, err := dst.ReadFrom(&io.LimitedReader{R: src, N: n})
	if err == nil && got != n {
		err = io.ErrUnexpectedEOF // the version's file is shorter than its list
	}
	return got, err
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, name string, cond Conditions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.checkName(name); err != nil {
		return err
	}
	if err := checkConditions(cond); err != nil {
		return err
	}
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	var dirty, trash string
	defer func() {
		unlock()
		if dirty != "" {
			syncDir(dirty)
		}
		removeTrash(trash)
	}()
	f, err := l.openBlob(name)
	if err != nil {
		return err
	}
	path := f.Name()
	m, err := readMeta(f)
	f.Close()
	if err != nil {
		return err
	}
	if err := evalConditions(name, cond, true, m.ETag); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("local store: delete %q: %w", name, mapOSError(err))
	}
	trash = l.dropBlocksLocked(name)
	l.dropList(name)
	dirty = l.prune(filepath.Dir(path))
	return nil
}

// prune removes empty directories from dir up to the root, so that List
// does not report prefixes without blobs, and returns the deepest
// directory left whose entries changed.
func (l *Local) prune(dir string) string {
	for dir != l.dir && strings.HasPrefix(dir, l.dir+string(filepath.Separator)) {
		if os.Remove(dir) != nil { // not empty: done
			return dir
		}
		dir = filepath.Dir(dir)
	}
	return dir
}

// Copy implements Store. The source is read from one open version, so a
// concurrent overwrite of src yields either the old or the new content,
// never a mix.
func (l *Local) Copy(ctx context.Context, dst, src string) (Attrs, error) {
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if err := l.checkName(dst); err != nil {
		return Attrs{}, err
	}
	if err := l.checkName(src); err != nil {
		return Attrs{}, err
	}
	in, err := l.openBlob(src)
	if err != nil {
		return Attrs{}, err
	}
	defer in.Close()
	srcMeta, err := readMeta(in)
	if err != nil {
		return Attrs{}, err
	}
	f, err := l.createTemp("copy")
	if err != nil {
		return Attrs{}, err
	}
	size, err := io.Copy(f, in)
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return Attrs{}, fmt.Errorf("local store: copy %q to %q: %w", src, dst, err)
	}
	m := newLocalMeta(srcMeta.Metadata, srcMeta.MD5)
	if err := finishTemp(f, m); err != nil {
		return Attrs{}, err
	}
	if err := l.publish(ctx, dst, f.Name(), Conditions{}); err != nil {
		return Attrs{}, err
	}
	l.dropList(dst)
	return m.attrs(dst, size), nil
}

// SetMetadata implements Store. It changes the xattr of the current file in
// place (one atomic setxattr) rather than rewriting the content.
func (l *Local) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error) {
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if err := l.checkName(name); err != nil {
		return Attrs{}, err
	}
	if err := ValidateMetadata(md); err != nil {
		return Attrs{}, err
	}
	if err := checkConditions(cond); err != nil {
		return Attrs{}, err
	}
	unlock, err := l.lock()
	if err != nil {
		return Attrs{}, err
	}
	defer unlock()
	f, err := l.openBlob(name)
	if err != nil {
		return Attrs{}, err
	}
	defer f.Close()
	a, m, err := statBlob(f, name)
	if err != nil {
		return Attrs{}, err
	}
	if err := evalConditions(name, cond, true, m.ETag); err != nil {
		return Attrs{}, err
	}
	nm := newLocalMeta(md, m.MD5)
	if err := writeMeta(f, nm); err != nil {
		return Attrs{}, err
	}
	if err := f.Sync(); err != nil {
		return Attrs{}, fmt.Errorf("local store: set metadata of %q: %w", name, err)
	}
	// Same content, same blocks: the committed list follows the ETag,
	// as Azure keeps it.
	if list, ok := l.readList(name); ok && list.ETag == m.ETag {
		list.ETag = nm.ETag
		l.writeList(name, list)
	}
	return nm.attrs(name, a.Size), nil
}

// Check implements Store: the directory must exist and be writable.
func (l *Local) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := os.Stat(l.dir)
	if err != nil {
		return fmt.Errorf("local store: %w", mapOSError(err))
	}
	if !fi.IsDir() {
		return fmt.Errorf("local store: %s is not a directory: %w", l.dir, ErrNotFound)
	}
	f, err := os.CreateTemp(l.tmpDir, "check-")
	if err != nil {
		return fmt.Errorf("local store %s: not writable: %w", l.dir, mapOSError(err))
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}
