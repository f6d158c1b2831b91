package fusefs

import (
	"sync"

	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Whole-file prefetch for directories read file by file.
//
// cp -r, tar, rsync, grep -r and dataset loaders read a directory's files one
// after another in the order readdir gives them, which in blobfs is name
// order. A small file costs a round trip to the store when it is read, so
// such a reader waits for one GET per file, one after another. Once two
// files of a directory have been opened for reading in name order, blobfs
// fetches the next small files into the block cache, several at once, and
// their reads find them there.
//
// Only files that fit one read block are fetched (a larger file has its own
// read-ahead), and only from a fresh listing: it gives their size and ETag,
// and the cache is keyed by ETag, so a file changed since it was listed is
// read from the store again, never served stale. The window doubles with
// every file opened in order, up to Options.PrefetchFiles files and a
// quarter of the block cache; opening a file out of order starts again.

// maxReadRuns bounds the directories whose reading order is remembered.
const maxReadRuns = 1024

type filePrefetcher struct {
	mu   sync.Mutex
	runs map[string]*readRun // by directory path
}

// readRun is what blobfs knows of the files opened in one directory.
type readRun struct {
	last  string // the file opened last
	n     int    // files opened in name order in a row, last included
	ahead string // the last file handed to the block cache
}

// prefetchAfterOpen is called when path is opened for reading. It never
// waits for the store.
func (fs *FS) prefetchAfterOpen(path string) {
	if fs.opts.PrefetchFiles <= 0 {
		return
	}
	dir, name := meta.SplitPath(path)
	p := &fs.prefetcher
	p.mu.Lock()
	if p.runs == nil || len(p.runs) >= maxReadRuns {
		p.runs = map[string]*readRun{}
	}
	r := p.runs[dir]
	if r == nil {
		r = &readRun{}
		p.runs[dir] = r
	}
	if r.last != "" && name > r.last {
		r.n++
	} else {
		r.n, r.ahead = 1, ""
	}
	r.last = name
	n, ahead := r.n, r.ahead
	p.mu.Unlock()
	if n < 2 {
		return
	}

	window := min(1<<min(n-1, 16), fs.opts.PrefetchFiles)
	budget := fs.opts.BlockCacheBytes / 4
	handed := ""
	for _, it := range fs.lists.Following(dir, name, window) {
		e := it.Entry
		if e.Kind != meta.KindFile || e.Pending || e.ETag == "" || e.Size <= 0 || e.Size > fs.opts.ReadBlockSize {
			continue
		}
		if budget -= e.Size; budget < 0 {
			break
		}
		if it.Name <= ahead {
			continue // handed out already
		}
		path := meta.JoinPath(dir, it.Name)
		if fs.sums.Expect(path, e.ETag, e.Size, e.Sum, !fs.blocks.Has(cache.BlockKey{Name: path, ETag: e.ETag, Idx: 0})) != nil {
			continue // known not to match its Content-MD5
		}
		if !fs.blocks.Prefetch(cache.BlockKey{Name: path, ETag: e.ETag, Idx: 0}, e.Size, 0) {
			break // no fetch slot or no room: try again at the next open
		}
		handed = it.Name
	}
	if handed == "" {
		return
	}
	p.mu.Lock()
	if r.last == name && handed > r.ahead {
		r.ahead = handed
	}
	p.mu.Unlock()
}
