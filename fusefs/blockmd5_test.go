package fusefs

import (
	"bytes"
	"context"
	"crypto/md5"
	"os"
	"sync/atomic"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// md5Checker stands for a store that sends each block's MD5 with it
// (Azure) when checks is set: it checks every MD5 handed over with a block
// (blobstore.WithBlockMD5) against the block, and counts them.
type md5Checker struct {
	blobstore.Store
	checks               bool
	staged, given, wrong atomic.Int64
}

func (c *md5Checker) ChecksBlockMD5() bool { return c.checks }

func (c *md5Checker) StageBlock(ctx context.Context, name, id string, data []byte) error {
	c.staged.Add(1)
	if sum, ok := blobstore.BlockMD5(ctx, data); ok {
		c.given.Add(1)
		if want := md5.Sum(data); !bytes.Equal(sum, want[:]) {
			c.wrong.Add(1)
		}
	}
	return c.Store.StageBlock(ctx, name, id, data)
}

// TestStreamedBlockMD5: where the store sends block MD5s, a file written
// in order has its blocks' MD5s computed in the pass that hashes them into
// the blob's, every one right, and the blob's Content-MD5 right, through
// streaming, fsyncs that carry blocks on, and a whole upload after an
// out-of-order write. Where the store sends none, none is computed.
func TestStreamedBlockMD5(t *testing.T) {
	const bs = 256 << 10
	for _, checks := range []bool{true, false} {
		store := &md5Checker{Store: blobstore.NewMemory(), checks: checks}
		mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs})

		// Streamed in order, 64 KiB at a time.
		data := pattern(10<<20+12345, 1)
		f, err := os.Create(join(mnt, "seq"))
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < len(data); off += 64 << 10 {
			if _, err := f.Write(data[off:min(off+64<<10, len(data))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, store, "seq", data)
		staged, given := store.staged.Load(), store.given.Load()
		t.Logf("checks=%v: %d blocks staged, %d with their MD5 from the blob's pass", checks, staged, given)
		if !checks {
			if given != 0 {
				t.Fatalf("%d block MD5s computed for a store that sends none", given)
			}
			continue
		}
		// Every block starts at a multiple of 64 bytes: each is hashed
		// once for both MD5s, even one staged before the one ahead of
		// it was hashed (it waits for its turn).
		if given != staged {
			t.Fatalf("%d of %d streamed blocks had their MD5 from the blob's pass; want all", given, staged)
		}

		// Appended and fsync'ed: carried blocks, kept tails whose ends
		// are not multiples of 64, which the blocks after them still
		// share the pass across.
		staged, given = store.staged.Load(), store.given.Load()
		log, err := os.Create(join(mnt, "log"))
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for i := range 12 {
			chunk := pattern(100<<10+i*1000, byte(i))
			if _, err := log.Write(chunk); err != nil {
				t.Fatal(err)
			}
			all = append(all, chunk...)
			if err := log.Sync(); err != nil {
				t.Fatal(err)
			}
			wantBlobAndMD5(t, store, "log", all)
		}
		if s, g := store.staged.Load()-staged, store.given.Load()-given; s == 0 || g != s {
			t.Fatalf("fsyncs of a log: %d of %d blocks had their MD5 from the blob's pass; want all", g, s)
		}
		// Out of order once: the next commit uploads the whole file
		// through a fresh stream.
		if _, err := log.WriteAt([]byte("rewritten"), 1000); err != nil {
			t.Fatal(err)
		}
		copy(all[1000:], "rewritten")
		if err := log.Close(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, store, "log", all)
		if n := store.wrong.Load(); n != 0 {
			t.Fatalf("%d blocks were handed a wrong MD5", n)
		}
	}
}
