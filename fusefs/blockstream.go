package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/blobfs/blobfs/blobstore"
)

var errNoStream = errors.New("no usable block stream")

// blockStream stages the full blocks of a file being written sequentially,
// while it is written, so that its commit only uploads the tail.
//
// Bounds: each staged block is read back from the spill file into a buffer
// held for the duration of its upload; FS.uploadSlots (shared by all files)
// caps those buffers, and a writer that finds none free waits: backpressure
// instead of unbounded memory.
//
// Locking: the owning openFile's mu serialises stageFull, commit and
// abandon's callers; mu here guards ids and err, written by the uploads.
type blockStream struct {
	fs    *FS
	name  string // blob the blocks are staged for
	nonce string
	bs    int64
	next  int64 // bytes handed to uploads so far, a multiple of bs

	wg sync.WaitGroup

	mu  sync.Mutex
	ids []string
	err error
}

func (fs *FS) newBlockStream(name string) *blockStream {
	return &blockStream{fs: fs, name: name, nonce: blobstore.NewBlockNonce(), bs: fs.opts.UploadBlockSize}
}

// stageFull starts uploads of every full block below size not yet handed
// out.
func (st *blockStream) stageFull(spill *os.File, size int64) error {
	for size-st.next >= st.bs {
		if len(st.ids) >= blobstore.MaxBlocks-1 {
			return errors.New("too many blocks for streaming")
		}
		buf := make([]byte, st.bs)
		st.fs.uploadSlots <- struct{}{}
		if _, err := spill.ReadAt(buf, st.next); err != nil {
			<-st.fs.uploadSlots
			return fmt.Errorf("spill read: %w", err)
		}
		st.mu.Lock()
		id := blobstore.BlockID(st.nonce, len(st.ids))
		st.ids = append(st.ids, id)
		st.mu.Unlock()
		st.next += st.bs
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			defer func() { <-st.fs.uploadSlots }()
			err := st.fs.store.StageBlock(st.fs.ctx, st.name, id, buf)
			if err != nil {
				st.mu.Lock()
				if st.err == nil {
					st.err = err
				}
				st.mu.Unlock()
			}
		}()
	}
	return nil
}

// commit waits for the staged blocks, stages the tail and commits the
// blob. Any failure leaves the caller to upload the whole file instead.
func (st *blockStream) commit(ctx context.Context, spill io.ReaderAt, size int64, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	st.wg.Wait()
	st.mu.Lock()
	ids, err := append([]string(nil), st.ids...), st.err
	st.mu.Unlock()
	if err != nil {
		return blobstore.Attrs{}, err
	}
	if size < st.next {
		return blobstore.Attrs{}, errNoStream
	}
	if tail := size - st.next; tail > 0 {
		buf := make([]byte, tail)
		if _, err := spill.ReadAt(buf, st.next); err != nil && !errors.Is(err, io.EOF) {
			return blobstore.Attrs{}, err
		}
		id := blobstore.BlockID(st.nonce, len(ids))
		if err := st.fs.store.StageBlock(ctx, st.name, id, buf); err != nil {
			return blobstore.Attrs{}, err
		}
		ids = append(ids, id)
	}
	return st.fs.store.CommitBlocks(ctx, st.name, ids, opts)
}

// abandon lets in-flight uploads finish on their own; their blocks are
// dropped by the store at the blob's next commit.
func (st *blockStream) abandon() {}
