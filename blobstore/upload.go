package blobstore

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
)

// Defaults of UploadOptions.
const (
	// DefaultBlockSize is the block size of a block upload. Big enough
	// that per-request overhead (a round trip, ~1 ms on Azure's LAN, more
	// across regions) is small against the transfer time of one block,
	// small enough that Concurrency blocks in flight stay modest in memory
	// (64 MiB by default) and that a failed block is cheap to send again.
	DefaultBlockSize = 8 << 20
	// DefaultUploadConcurrency is the number of blocks staged at once: a
	// single HTTP stream to Azure tops out well below a NIC's bandwidth,
	// and eight streams come close to saturating a typical VM's network.
	DefaultUploadConcurrency = 8
	// MaxBlockSize is the largest block Azure accepts.
	MaxBlockSize = 4000 << 20
)

// UploadOptions configure Upload. The zero value means defaults.
type UploadOptions struct {
	// PutOptions are passed to the final Put or CommitBlocks: metadata
	// and conditions of the new blob.
	PutOptions PutOptions
	// SingleShotLimit is the largest size written with one Put; larger
	// blobs are uploaded as blocks. 0 means the block size: a blob that
	// fits one block gains nothing from staging (it would cost a second
	// request, StageBlock plus CommitBlocks), while anything larger is
	// faster as parallel blocks than as one stream. Negative means
	// always use blocks.
	SingleShotLimit int64
	// BlockSize is the size of every block but the last; 0 means
	// DefaultBlockSize. It is raised when the blob would need more than
	// MaxBlocks blocks.
	BlockSize int64
	// Concurrency is the number of blocks staged in parallel, and so the
	// number of block buffers in memory; 0 means
	// DefaultUploadConcurrency.
	Concurrency int
	// Progress, if set, is told the size of each part once it is in the
	// store (a staged block, or the whole blob of a single Put). It is
	// called from several goroutines at once.
	Progress func(bytes int64)
	// Buffers, if set, gives the block buffers instead of Upload's own:
	// a caller that uploads many blobs at once bounds their memory
	// together (Get waits while none is free).
	Buffers BufferSource
}

// BufferSource lends block buffers to Upload. Get returns a buffer of at
// least n bytes, waiting until one may be had or ctx ends; Put gives it
// back.
type BufferSource interface {
	Get(ctx context.Context, n int64) ([]byte, error)
	Put(buf []byte)
}

// Upload writes size bytes from r as blob name: one Put when size is at
// most opts.SingleShotLimit, otherwise blocks staged in parallel and then
// committed in order, with opts.PutOptions on the final request. At most
// opts.Concurrency blocks are in memory at a time, and one more waiting for
// a slot. If any block fails, the others are cancelled, nothing is
// committed and the blob is unchanged; the staged blocks are left for the
// store to discard (Azure after a week, Local on its next start after
// that, both on the blob's next write).
//
// r must hold size bytes; a shorter r fails the upload with
// io.ErrUnexpectedEOF.
func Upload(ctx context.Context, s Store, name string, r io.ReaderAt, size int64, opts UploadOptions) (Attrs, error) {
	if size < 0 {
		return Attrs{}, fmt.Errorf("blobstore: upload %q: negative size %d", name, size)
	}
	bs := opts.BlockSize
	if bs <= 0 {
		bs = DefaultBlockSize
	}
	single := opts.SingleShotLimit
	if single == 0 {
		single = bs
	}
	if size <= single {
		buf := make([]byte, size)
		if err := readFull(r, buf, 0); err != nil {
			return Attrs{}, fmt.Errorf("blobstore: upload %q: read source: %w", name, err)
		}
		a, err := s.Put(ctx, name, buf, opts.PutOptions)
		if err == nil && opts.Progress != nil {
			opts.Progress(size)
		}
		return a, err
	}
	// Azure allows at most MaxBlocks blocks per blob: grow the blocks
	// (to a whole MiB) rather than fail.
	if n := (size + bs - 1) / bs; n > MaxBlocks {
		const mib = 1 << 20
		bs = ((size+MaxBlocks-1)/MaxBlocks + mib - 1) / mib * mib
	}
	if bs > MaxBlockSize {
		return Attrs{}, fmt.Errorf("blobstore: upload %q: %d bytes is more than a blob can hold", name, size)
	}
	conc := opts.Concurrency
	if conc <= 0 {
		conc = DefaultUploadConcurrency
	}
	nblocks := int((size + bs - 1) / bs)
	nonce := NewBlockNonce()
	ids := make([]string, nblocks)

	// The blob's Content-MD5, for its readers: the blocks are hashed in
	// order, each once the one before it is, from the very bytes staged
	// (r may change meanwhile: a file still being written). Buffers are
	// taken in order, in this loop, so every block before the one hashing
	// has its buffer and goes on: the wait cannot deadlock, even on a
	// Buffers shared with other uploads.
	putOpts := opts.PutOptions
	hashing := len(putOpts.ContentMD5) == 0
	h := md5.New()
	prev := make(chan struct{}) // closed when the block before is hashed
	close(prev)
	// SetLimit(conc) keeps at most conc goroutines alive, each with one
	// buffer; the loop holds one more while it waits for a slot.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	free := make(chan []byte, conc+1)
	for i := range nblocks {
		if gctx.Err() != nil {
			break // a block failed or ctx ended: stop starting more
		}
		ids[i] = BlockID(nonce, i)
		off := int64(i) * bs
		n := min(bs, size-off)
		var buf []byte
		if opts.Buffers != nil {
			var err error
			if buf, err = opts.Buffers.Get(gctx, n); err != nil {
				break // gctx ended; Wait reports why
			}
		} else {
			select {
			case buf = <-free:
			default:
				buf = make([]byte, bs)
			}
		}
		wait, done := prev, make(chan struct{})
		prev = done
		g.Go(func() error {
			defer func() {
				if opts.Buffers != nil {
					opts.Buffers.Put(buf)
				} else {
					free <- buf
				}
			}()
			if err := readFull(r, buf[:n], off); err != nil {
				return fmt.Errorf("blobstore: upload %q: read source at %d: %w", name, off, err)
			}
			if hashing {
				select {
				case <-wait:
				case <-gctx.Done():
					return gctx.Err()
				}
				h.Write(buf[:n])
				close(done)
			}
			if err := s.StageBlock(gctx, name, ids[i], buf[:n]); err != nil {
				return err
			}
			if opts.Progress != nil {
				opts.Progress(n)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Attrs{}, err
	}
	if err := ctx.Err(); err != nil {
		return Attrs{}, err
	}
	if hashing {
		putOpts.ContentMD5 = h.Sum(nil)
	}
	return s.CommitBlocks(ctx, name, ids, putOpts)
}

// readFull fills p from r at off, treating a short source as
// io.ErrUnexpectedEOF.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil // io.ReaderAt may report io.EOF with the last byte
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// blockNonceLen is the length of a nonce inside a block id.
const blockNonceLen = 16

// NewBlockNonce returns a random nonce for BlockID: one per upload, so that
// blocks of two uploads of the same blob never mix.
func NewBlockNonce() string {
	var b [blockNonceLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// BlockID returns the id of block index of the upload identified by nonce.
// All ids have the same length, as Azure requires within a blob, even
// across uploads: a nonce of other than 16 bytes (NewBlockNonce makes
// 16) is replaced by 16 hex digits of its SHA-256. index must be in [0,
// 10^8); MaxBlocks is far below that, so anything else is a bug and
// panics.
func BlockID(nonce string, index int) string {
	if index < 0 || index >= 1e8 {
		panic(fmt.Sprintf("blobstore: block index %d out of range", index))
	}
	if len(nonce) != blockNonceLen {
		sum := sha256.Sum256([]byte(nonce))
		nonce = hex.EncodeToString(sum[:])[:blockNonceLen]
	}
	return base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "%s-%08d", nonce, index))
}
