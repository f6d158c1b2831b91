package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// spillPool keeps emptied spill files for the next files written, so that a
// file written and closed costs no file creation and removal on the cache
// disk. Creating a file can cost far more than emptying one: on ext4 without
// a journal (the file system of this project's machines), allocating an
// inode skips every inode of its group freed in the last 30 seconds
// (recently_deleted in fs/ext4/ialloc.c), so a spill file created and
// removed per small file made each creation slower than the one before:
// 0.1-0.36 ms of CPU per file after a thousand 4 KiB files, as much as the
// file's whole upload to Azurite.
//
// Bounds: at most maxPooledSpills files, each truncated to zero bytes when
// it comes back. A pooled file is renamed from spill-* to pooled-* (a
// rename allocates no inode), so that what the spill directory holds says
// which files hold data: the pooled ones belong to nobody, and a process
// starting on the directory (newSpillPool) removes any that a dead
// predecessor left. FS.Close removes its own.
//
// Locking: mu guards free; it is taken after FS.mu, never before.
type spillPool struct {
	dir  string
	mu   sync.Mutex
	free []pooledSpill // guarded by mu
}

// pooledSpill is an emptied spill file and the name it had in use.
type pooledSpill struct {
	f    *os.File
	name string
}

const (
	spillPrefix  = "spill-"
	pooledPrefix = "pooled-"
)

// newSpillPool returns an empty pool for dir, after removing the pooled
// files a previous process left there.
func newSpillPool(dir string) spillPool {
	left, _ := filepath.Glob(filepath.Join(dir, pooledPrefix+"*"))
	for _, path := range left {
		os.Remove(path)
	}
	return spillPool{dir: dir}
}

func pooledName(name string) string {
	dir, base := filepath.Split(name)
	return filepath.Join(dir, pooledPrefix+strings.TrimPrefix(base, spillPrefix))
}

// maxPooledSpills bounds the pool: enough for as many files closed at once
// as the kernel sends requests in parallel; more would only hold inodes.
const maxPooledSpills = 32

// get returns an empty spill file: a pooled one, or a new one.
func (p *spillPool) get() (*os.File, error) {
	for {
		p.mu.Lock()
		n := len(p.free)
		if n == 0 {
			p.mu.Unlock()
			return os.CreateTemp(p.dir, spillPrefix)
		}
		ps := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		// Back to its name in use: os.File.Name still says it.
		if err := renameNoReplace(pooledName(ps.name), ps.name); err == nil {
			return ps.f, nil
		}
		ps.f.Close() // renamed or removed by someone else: not ours to use
	}
}

// put takes back a spill file nothing refers to any more (its removal is
// journaled): emptied into the pool, or removed when the pool is full or
// the file cannot be emptied. An abandoned block stream may still be
// reading it: what it reads goes into blocks that nothing commits
// (blockStream.abandon).
func (p *spillPool) put(f *os.File) {
	name := f.Name()
	p.mu.Lock()
	full := len(p.free) >= maxPooledSpills
	p.mu.Unlock()
	// The record goes first: a spill file emptied but still named
	// spill-* must not say it holds a file's changes.
	clearSpillRecord(f)
	if !full && f.Truncate(0) == nil && renameNoReplace(name, pooledName(name)) == nil {
		p.mu.Lock()
		p.free = append(p.free, pooledSpill{f: f, name: name})
		p.mu.Unlock()
		return
	}
	f.Close()
	os.Remove(name)
}

// close removes every pooled file.
func (p *spillPool) close() {
	p.mu.Lock()
	free := p.free
	p.free = nil
	p.mu.Unlock()
	for _, ps := range free {
		ps.f.Close()
		os.Remove(pooledName(ps.name))
	}
}

// renameNoReplace renames a file of the spill directory. It is os.Rename
// without the Lstat that os.Rename makes first (to refuse renaming over a
// directory, which the pool never does), and it refuses to replace an
// existing file: a name the pool does not own is not taken over.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without RENAME_NOREPLACE.
		err = unix.Rename(from, to)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}
