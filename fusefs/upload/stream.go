package upload

import (
	"context"
	"crypto/md5"
	"encoding"
	"errors"
	"hash"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/internal/md5pair"
)

var ErrNoStream = errors.New("no usable block stream")

// Stream stages the full blocks of a file being written sequentially,
// while it is written, so that its commit only uploads the tail.
//
// Algorithm: the WRITE that completes a block takes an upload slot and
// hands the block to a goroutine, which reads it back from the spill file
// into a pooled buffer and stages it; the WRITE is answered without waiting
// for either. The commit stages the tail while the last full blocks are
// still in flight, then commits the list.
//
// Bounds: the mount's upload buffers (Uploader.Buffers, shared by all files) and the process's memory
// budget (fusefs/memory) cap the blocks in flight, and so the block buffers
// in use; a writer that finds no slot free waits
// for an upload to finish: backpressure instead of unbounded memory. Slots
// are held only by uploads, which end on their own, so the wait cannot
// deadlock on another file's writer.
//
// The read-back runs without the file's lock: a later write into a block
// already handed out abandons the stream (under that lock) before anyone
// can commit it, so a block read while being overwritten is never used.
//
// Carrying on: a file committed through its stream keeps a stream after
// the commit (carryOn), which starts with the blocks just committed: they
// stay in the blob's committed block list, and the next commit names them
// instead of sending them again (blobstore.Store.CommitBlocks), with the
// MD5 resumed from its state after them. The commit's tail, a block
// shorter than the others, is kept as it is when it holds at least
// bs/keptTailDivisor bytes; a shorter one is sent again with what follows
// it. A log fsync'ed every few writes so sends each byte about once, not
// the whole file at every fsync, and its block count stays within
// Azure's limit (one block per bs/keptTailDivisor bytes at most; past
// MaxBlocks the stream gives up and the file is uploaded whole). The same
// rule as for staged blocks keeps this right: a write below next abandons
// the stream, and the next commit uploads the whole file. The commit is
// conditional on the ETag the last one made, so the blocks named are that
// version's; where a store no longer has them the commit fails, and the
// whole file is uploaded instead.
//
// Locking: the owning openFile's mu serialises stageFull and commit's
// callers; mu here guards ids, ends and err: the uploads write err; ids and
// ends are written only by those serialised callers, which read them
// without it.
type Stream struct {
	up    *Uploader
	name  string // blob the blocks are staged for
	nonce string
	bs    int64
	next  int64 // bytes handed to uploads so far, or kept from the last commit
	// reused is the bytes of the blocks kept from the last commit.
	reused int64
	// progress, if set, is told of each block staged.
	progress *Progress
	// keepPages: staged blocks' pages stay in the page cache (a whole
	// file uploaded at its commit: it is all there already, and dropping
	// it would cost a disk write of pages its reuse would just discard).
	keepPages bool
	// queued is what a commit under way has still to hand out, counted
	// in Uploader.Uploading with the blocks in flight (handOut).
	queued atomic.Int64

	wg sync.WaitGroup

	// hash is the MD5 of the blocks in order, the blob's Content-MD5.
	hash *Hash

	mu   sync.Mutex
	ids  []string // block ids from offset 0: kept from the last commit, then staged
	ends []int64  // where each block of ids ends
	err  error
	// abort, during a commit, cancels the blocks it stages itself: the
	// first failure stops the others, as blobstore.Upload does.
	abort context.CancelFunc
}

// KeptTailDivisor: a commit's tail is kept as a block of its own when it
// holds at least 1/KeptTailDivisor of a full block at its place (see
// "Carrying on").
const KeptTailDivisor = 8

// BlockGrowAfter: a stream's blocks from this index on are twice bs (at
// most blobstore.MaxBlockSize), so that a file streams far beyond 10,000
// blocks within Azure's 50,000 (351 GiB at the default 4 MiB: 39 GiB of
// 4 MiB blocks, then 8 MiB ones), while files up to 10,000 blocks keep
// the small blocks, which keep the bytes in flight and a retried block
// small. A variable for tests.
var BlockGrowAfter = 10_000

// blockSizeAt returns the size of a full block at index i of a stream of
// block size bs.
func blockSizeAt(bs int64, i int) int64 {
	if i >= BlockGrowAfter {
		return min(2*bs, blobstore.MaxBlockSize)
	}
	return bs
}

// BlockSize returns the size of the stream's next full block.
func (st *Stream) BlockSize() int64 { return blockSizeAt(st.bs, len(st.ids)) }

// StreamBlocks returns the number of blocks a stream of block size bs
// stages for size bytes, the tail included.
func StreamBlocks(size, bs int64) int64 {
	small := int64(BlockGrowAfter) * bs
	if size <= small {
		return (size + bs - 1) / bs
	}
	big := blockSizeAt(bs, BlockGrowAfter)
	return int64(BlockGrowAfter) + (size-small+big-1)/big
}

// NewStream starts a stream of the blocks of blob name, from offset 0.
func (u *Uploader) NewStream(name string) *Stream {
	h := NewHash()
	h.keepStates = true
	return &Stream{up: u, name: name, nonce: blobstore.NewBlockNonce(), bs: u.BlockSize, hash: h}
}

// Next is the bytes handed to uploads so far, or kept from the last
// commit: a write below it abandons the stream.
func (st *Stream) Next() int64 { return st.next }

// Name is the blob the blocks are staged for.
func (st *Stream) Name() string { return st.name }

// Reused is the bytes of the blocks kept from the last commit.
func (st *Stream) Reused() int64 { return st.reused }

// KeepPages leaves staged blocks' pages in the page cache (a whole file
// uploaded at its commit: it is all there already, and dropping it would
// cost a disk write of pages its reuse would just discard).
func (st *Stream) KeepPages() { st.keepPages = true }

// SetProgress tells p of each block staged.
func (st *Stream) SetProgress(p *Progress) { st.progress = p }

// addIDLocked names the block that ends at end.
func (st *Stream) addIDLocked(end int64) string {
	id := blobstore.BlockID(st.nonce, len(st.ids))
	st.ids = append(st.ids, id)
	st.ends = append(st.ends, end)
	return id
}

// CarryOn returns the stream that follows a successful commit of st's
// size bytes: it starts after the blocks committed, which its commit names
// again, but for a short tail (see "Carrying on" above). nil if the MD5's
// state there is not known.
func (st *Stream) CarryOn(size int64) *Stream {
	keep := len(st.ids)
	if keep == 0 || st.ends[keep-1] != size {
		return nil
	}
	if start := blockStart(st.ends, keep-1); size-start < blockSizeAt(st.bs, keep-1)/KeptTailDivisor {
		keep--
	}
	next := blockStart(st.ends, keep)
	h, ok := st.hash.resumeAt(next)
	if !ok {
		return nil
	}
	return &Stream{
		up: st.up, name: st.name, nonce: blobstore.NewBlockNonce(), bs: st.bs,
		next: next, reused: next,
		ids:  append([]string(nil), st.ids[:keep]...),
		ends: append([]int64(nil), st.ends[:keep]...),
		hash: h,
	}
}

// blockStart returns where block i starts, given where each block ends.
func blockStart(ends []int64, i int) int64 {
	if i == 0 {
		return 0
	}
	return ends[i-1]
}

// Hash is the MD5 of blocks read in parallel and hashed in order:
// each waits for the blocks before it. A stream's blocks read back from the
// spill file use it, and so does download.
// That wait cannot deadlock: every block before one being hashed was
// handed to its own goroutine first, with its buffer, and the first
// block not hashed yet waits for nothing.
type Hash struct {
	mu     sync.Mutex
	cond   *sync.Cond
	h      hash.Hash
	next   int64 // bytes hashed
	broken bool  // a block was not read: there will be no sum

	// keepStates makes the hash keep its state after each of the last
	// two blocks: states[i] is the state after at[i] bytes.
	keepStates bool
	at         [2]int64
	states     [2][]byte
}

func NewHash() *Hash {
	s := &Hash{h: md5.New()}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// resumeAt returns a new streamHash that goes on from this one's state
// after off bytes, if it kept that state.
func (s *Hash) resumeAt(off int64) (*Hash, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := NewHash()
	r.keepStates = s.keepStates
	if off == 0 {
		return r, true
	}
	for i, state := range s.states {
		if s.broken || state == nil || s.at[i] != off {
			continue
		}
		if r.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state) != nil {
			return nil, false
		}
		r.next = off
		r.at[1], r.states[1] = off, state // where the next carryOn may resume too
		return r, true
	}
	return nil, false
}

// Add hashes the block at off once the bytes before it are hashed.
func (s *Hash) Add(off int64, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.broken && s.next < off {
		s.cond.Wait()
	}
	if !s.broken && s.next == off {
		s.h.Write(p)
		s.hashedLocked(len(p))
	} else {
		s.broken = true
	}
	s.cond.Broadcast()
}

// addWithSum is add that also returns the block's own MD5, from the same
// pass (md5pair): it waits, as add does, until the bytes before the block
// are hashed. Every block handed out is added or fails the hash, so the
// wait ends. If the hash broke, or md5pair cannot take the hash (not
// crypto/md5's state as it knows it), it does nothing and returns false:
// the caller adds the block as usual.
func (s *Hash) addWithSum(off int64, p []byte) (sum [md5.Size]byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for !s.broken && s.next < off {
		s.cond.Wait()
	}
	if s.broken || s.next != off {
		return sum, false
	}
	if sum, ok = md5pair.Write(s.h, p); ok {
		s.hashedLocked(len(p))
		s.cond.Broadcast()
	}
	return sum, ok
}

// hashedLocked records that n more bytes were hashed.
func (s *Hash) hashedLocked(n int) {
	s.next += int64(n)
	if s.keepStates {
		state, _ := s.h.(encoding.BinaryMarshaler).MarshalBinary()
		s.at[0], s.states[0] = s.at[1], s.states[1]
		s.at[1], s.states[1] = s.next, state
	}
}

// Fail says a block will never be added.
func (s *Hash) Fail() {
	s.mu.Lock()
	s.broken = true
	s.cond.Broadcast()
	s.mu.Unlock()
}

// Sum returns the MD5 of the stream's size bytes, or nil when they were
// not all hashed.
func (s *Hash) Sum(size int64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken || s.next != size {
		return nil
	}
	return s.h.Sum(nil)
}

// StageFull starts uploads of every full block below size not yet handed
// out. With write-back, a writer does not wait for a slot: the blocks no
// slot took now go later, or with the commit.
func (st *Stream) StageFull(spill io.ReaderAt, size int64) error {
	return st.stageBlocks(st.up.Ctx, spill, size, !st.up.WriteBack)
}

// stageBlocks is stageFull; wait says whether to wait for a free slot.
// The uploads run under ctx: the mount's for blocks a WRITE hands out
// (the write does not wait for them), the commit's for those it stages
// itself, so that a commit given up on stops sending them.
func (st *Stream) stageBlocks(ctx context.Context, spill io.ReaderAt, size int64, wait bool) error {
	for bs := st.BlockSize(); size-st.next >= bs; bs = st.BlockSize() {
		if len(st.ids) >= blobstore.MaxBlocks-1 {
			return errors.New("too many blocks for streaming")
		}
		if err := st.failure(ctx); err != nil {
			return err // stop handing out blocks of a failed commit
		}
		buf, ok, err := st.up.Buffers.Take(ctx, bs, wait)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		st.mu.Lock()
		id := st.addIDLocked(st.next + bs)
		st.mu.Unlock()
		off := st.next
		st.next += bs
		st.handOut(bs)
		st.wg.Add(1)
		go func() {
			staged := st.stage(ctx, id, spill, buf[:bs], off)
			st.up.Uploading.Add(-bs)
			st.up.Buffers.Give(buf)
			st.wg.Done()
			if f, ok := spill.(*os.File); ok && staged && !st.keepPages {
				// After Done: the commit need not wait for the disk.
				releaseStagedPages(f, off, bs)
			}
		}()
	}
	return nil
}

// handOut counts n bytes handed to an upload in Uploader.Uploading (the caller
// uncounts them when the upload ends), moving them from what a commit
// under way had queued.
func (st *Stream) handOut(n int64) {
	if q := st.queued.Load(); q > 0 {
		d := min(q, n)
		st.queued.Add(-d)
		st.up.Uploading.Add(-d)
	}
	st.up.Uploading.Add(n)
}

// stage reads len(buf) bytes at off from spill into buf and stages them as
// block id, recording the first failure; it tells whether the block is
// staged.
func (st *Stream) stage(ctx context.Context, id string, spill io.ReaderAt, buf []byte, off int64) bool {
	n, err := spill.ReadAt(buf, off)
	if n == len(buf) {
		err = nil
	} else if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		err = st.send(ctx, id, buf, off)
		if err == nil && st.progress != nil {
			st.progress.Add(int64(len(buf)))
		}
	} else {
		st.hash.Fail()
	}
	if err != nil {
		st.mu.Lock()
		if st.err == nil {
			st.err = err
		}
		if st.abort != nil {
			st.abort()
		}
		st.mu.Unlock()
	}
	return err == nil
}

// send stages the block buf, at off in the file, and hashes it into the
// blob's MD5.
//
// Where the store sends each block's MD5 (Azure), computing it is a second
// hash of the block: both MD5s come from one pass instead
// (streamHash.addWithSum), which costs about what one did. The request
// then waits for the blocks before this one to be hashed; at ~700 MB/s for
// both MD5s, that holds back no upload for long. Elsewhere the block is
// hashed into the blob's MD5 while it is sent: the hash waits for the
// blocks before this one, the request need not, and a commit's tail
// (every fsync of a log) does not wait for its hash first.
func (st *Stream) send(ctx context.Context, id string, buf []byte, off int64) error {
	if st.up.BlockMD5 {
		if sum, ok := st.hash.addWithSum(off, buf); ok {
			return st.up.Store.StageBlock(blobstore.WithBlockMD5(ctx, buf, sum), st.name, id, buf)
		}
	}
	hashed := make(chan struct{})
	go func() {
		st.hash.Add(off, buf)
		close(hashed)
	}()
	err := st.up.Store.StageBlock(ctx, st.name, id, buf)
	<-hashed // buf goes back to the pool after this
	return err
}

// failure returns the stream's first failure, or ctx's end.
func (st *Stream) failure(ctx context.Context) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err != nil {
		return st.err
	}
	return ctx.Err()
}

// releaseStagedPages writes the spill file's pages of a staged block to
// disk and drops them from the page cache, so that the pages of the next
// blocks written reuse them.
//
// Why: a file written sequentially keeps a staged block's bytes in its
// spill file only for what may never come (a read through the mount, an
// upload of the whole file if streaming fails, a successor's upload after
// a crash), and all of those read the disk as well. Kept in the page cache,
// a file being uploaded held as many pages as it had bytes, each a fresh
// page: on a VM whose host takes back the memory the guest frees
// (virtio-balloon free page reporting, this project's machines) a fresh
// page faults in the host on its first write: dd of 1 GiB into a new file
// took 3.8 s of system time, into the same file again 0.17 s. Dropped once
// staged, a stream's pages stay near its blocks in flight, freed pages are
// taken again while they are still the guest's, and the file no longer
// pushes other data out of the page cache.
//
// Only clean pages are dropped (POSIX_FADV_DONTNEED leaves dirty ones), so
// a page written again after its block was staged, which abandons the
// stream, keeps its new bytes. The disk write runs after the upload, off
// the writer's and the commit's path. The descriptor is held for the calls
// (RawConn.Control), so a spill file closed meanwhile is not mistaken for
// another; one emptied and handed to another file meanwhile only loses
// clean pages of that range to the disk.
func releaseStagedPages(spill *os.File, off, n int64) {
	rc, err := spill.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		const flags = unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
		if unix.SyncFileRange(int(fd), off, n, flags) == nil {
			unix.Fadvise(int(fd), off, n, unix.FADV_DONTNEED)
		}
	})
}

// Commit stages the tail alongside the blocks still in flight, waits for
// all of them and commits the blob. Any failure leaves the caller to upload
// the whole file instead.
func (st *Stream) Commit(ctx context.Context, spill io.ReaderAt, size int64, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	if size < st.next {
		return blobstore.Attrs{}, ErrNoStream
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st.mu.Lock()
	st.abort = cancel
	st.mu.Unlock()
	// What is still to be sent counts as uploading from now on; the
	// blocks already in flight count already.
	st.queued.Store(size - st.next)
	st.up.Uploading.Add(size - st.next)
	defer func() { st.up.Uploading.Add(-st.queued.Swap(0)) }()
	// Full blocks that no slot took while the file was written
	// (write-back writers do not wait).
	if err := st.stageBlocks(ctx, spill, size, true); err != nil {
		return blobstore.Attrs{}, err
	}
	if tail := size - st.next; tail > 0 {
		if len(st.ids) >= blobstore.MaxBlocks {
			return blobstore.Attrs{}, errors.New("too many blocks for streaming")
		}
		st.mu.Lock()
		id := st.addIDLocked(size)
		st.mu.Unlock()
		off := st.next
		st.handOut(tail)
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			st.stage(ctx, id, spill, make([]byte, tail), off)
			st.up.Uploading.Add(-tail)
		}()
	}
	st.wg.Wait()
	st.mu.Lock()
	ids, err := append([]string(nil), st.ids...), st.err
	st.mu.Unlock()
	if err != nil {
		return blobstore.Attrs{}, err
	}
	opts.ContentMD5 = st.hash.Sum(size)
	return st.up.Store.CommitBlocks(ctx, st.name, ids, opts)
}

// Abandon lets in-flight uploads finish on their own; their blocks are
// dropped by the store at the blob's next commit.
func (st *Stream) Abandon() {}
