package fusefs

import (
	"bytes"
	"context"
	"crypto/md5"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/upload"
)

// sentCounter wraps a store and counts the bytes of content sent to it
// (staged blocks and single Puts), and the blocks of the last commit.
type sentCounter struct {
	blobstore.Store
	sent       atomic.Int64
	lastBlocks atomic.Int64 // blocks named by the last CommitBlocks
}

func newSentCounter(inner blobstore.Store) *sentCounter {
	c := &sentCounter{}
	c.Store = blobstore.NewObserved(inner, func(_ context.Context, call *blobstore.Call) {
		if call.Err == nil && (call.Op == blobstore.OpStageBlock || call.Op == blobstore.OpPut) {
			c.sent.Add(int64(call.Len))
		}
		if call.Err == nil && call.Op == blobstore.OpCommitBlocks {
			c.lastBlocks.Store(int64(call.Blocks))
		}
	})
	return c
}

// forCarryOnStores runs body on each backend whose committed block lists
// the tests below rely on: the fake, the embedded default and Azurite
// (when $BLOBFS_TEST_AZURITE names one). Not the faulty one: its lost
// answers make blocks go twice, which the byte counts would blame on
// blobfs.
func forCarryOnStores(t *testing.T, body func(t *testing.T, s blobstore.Store)) {
	for _, b := range storetest.Backends() {
		if b.Name == "faulty" {
			continue
		}
		t.Run(b.Name, func(t *testing.T) { body(t, b.New(t)) })
	}
}

// wantBlobAndMD5 checks a blob's content and that its Content-MD5 is the
// MD5 of that content.
func wantBlobAndMD5(t *testing.T, s blobstore.Store, name string, want []byte) {
	t.Helper()
	wantBlob(t, s, name, want)
	a, err := s.Stat(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if sum := md5.Sum(want); !bytes.Equal(a.ContentMD5, sum[:]) {
		t.Fatalf("blob %q: Content-MD5 %x, want %x", name, a.ContentMD5, sum)
	}
}

// TestFsyncKeepsCommittedBlocks: a file appended to and fsync'ed over and
// over (a log) sends each byte about once: every commit names the blocks
// of the one before instead of uploading the whole file again, and only a
// tail shorter than bs/keptTailDivisor goes again. Before, 20 fsyncs of a
// file growing by 100 KiB sent 21 MB for 2 MB.
func TestFsyncKeepsCommittedBlocks(t *testing.T) {
	const bs = 64 << 10
	for _, c := range []struct {
		name        string
		step, steps int
	}{
		{"100 KiB steps", 100 << 10, 20},
		// Short tails go again with what follows, rather than each
		// becoming a block: the block count stays bounded.
		{"1000-byte steps", 1000, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
				checkFsyncKeepsBlocks(t, inner, bs, c.step, c.steps)
			})
		})
	}
}

func checkFsyncKeepsBlocks(t *testing.T, inner blobstore.Store, bs int64, step, steps int) {
	store := newSentCounter(inner)
	mnt, fsys := mountStore(t, store, Options{UploadBlockSize: bs})
	f, err := os.Create(join(mnt, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var all []byte
	var committed int64 // the sizes of every commit, summed
	for i := range steps {
		chunk := pattern(step, byte(i))
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		all = append(all, chunk...)
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync %d: %v", i, err)
		}
		committed += int64(len(all))
		if i%10 == 0 || i == steps-1 {
			wantBlobAndMD5(t, inner, "log", all)
		}
		if i == steps/2 {
			// Metadata changes between fsyncs keep the blocks (a
			// new ETag, the same block list).
			if err := f.Chmod(0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Each commit sends what is new and at most a short tail again;
	// while the file is shorter than a block, its commits are one Put of
	// the whole file.
	sent := store.sent.Load()
	bound := int64(len(all)) + int64(steps)*bs/upload.KeptTailDivisor + min(int64(steps), bs/int64(step)+1)*bs
	t.Logf("%d bytes sent for a %d-byte file fsync'ed %d times; last commit of %d blocks", sent, len(all), steps, store.lastBlocks.Load())
	if sent > bound {
		t.Fatalf("%d bytes sent, want at most %d", sent, bound)
	}
	// One block per bs/keptTailDivisor bytes at most, and a tail.
	if blocks, most := store.lastBlocks.Load(), int64(len(all))/(bs/upload.KeptTailDivisor)+2; blocks > most {
		t.Fatalf("the last commit named %d blocks, want at most %d", blocks, most)
	}
	// What a commit did not send it reused: the metric.
	if reused := fsys.Stats().ReusedBytes; sent+reused != committed {
		t.Fatalf("%d bytes sent and %d reused, want %d together", sent, reused, committed)
	}
}

// TestCarryOnMatchesModel: random appends, overwrites (which abandon the
// kept blocks), truncates and fsyncs through one handle; after every fsync
// the blob is the file as written and its Content-MD5 matches.
func TestCarryOnMatchesModel(t *testing.T) {
	forCarryOnStores(t, func(t *testing.T, store blobstore.Store) {
		checkCarryOnModel(t, store, store, 1)
	})
}

// checkCarryOnModel runs 150 random operations through a mount of store
// (a wrapper of inner, or inner) and checks inner after each fsync.
func checkCarryOnModel(t *testing.T, store, inner blobstore.Store, seed uint64) {
	const bs = 64 << 10
	mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs})
	f, err := os.OpenFile(join(mnt, "model"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(seed, 2))
	var model []byte
	for i := range 150 {
		switch op := rng.IntN(10); {
		case op < 5: // append
			chunk := pattern(rng.IntN(3*bs), byte(i))
			if _, err := f.WriteAt(chunk, int64(len(model))); err != nil {
				t.Fatal(err)
			}
			model = append(model, chunk...)
		case op < 6 && len(model) > 0: // overwrite inside
			off := rng.IntN(len(model))
			chunk := pattern(min(rng.IntN(bs), len(model)-off), byte(i)+100)
			if _, err := f.WriteAt(chunk, int64(off)); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], chunk)
		case op < 7: // truncate, shorter or longer
			size := rng.IntN(len(model) + bs + 1)
			if err := f.Truncate(int64(size)); err != nil {
				t.Fatal(err)
			}
			if size <= len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-len(model))...)
			}
		default:
			if err := f.Sync(); err != nil {
				t.Fatalf("seed %d, op %d: fsync: %v", seed, i, err)
			}
			wantBlobAndMD5(t, inner, "model", model)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlobAndMD5(t, inner, "model", model)
}

// TestCarryOnAfterReplace: a blob replaced by another writer between two
// fsyncs is not built on: the second fsync fails with ESTALE, as any
// commit over a change it did not see, and the other writer's blob stays.
func TestCarryOnAfterReplace(t *testing.T) {
	const bs = 64 << 10
	forCarryOnStores(t, func(t *testing.T, store blobstore.Store) {
		{
			opts := Options{UploadBlockSize: bs, CacheDir: t.TempDir()}
			mnt, _ := mountStore(t, store, opts)
			f, err := os.Create(join(mnt, "replaced"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(pattern(3*bs+100, 1)); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			other := pattern(5*bs, 2)
			if _, err := blobstore.Upload(context.Background(), store, "replaced", bytes.NewReader(other), int64(len(other)), blobstore.UploadOptions{BlockSize: bs}); err != nil {
				t.Fatal(err)
			}
			mine := pattern(bs, 3)
			if _, err := f.Write(mine); err != nil {
				t.Fatal(err)
			}
			wantErrno(t, f.Sync(), syscall.ESTALE)
			wantErrno(t, f.Close(), syscall.ESTALE)
			wantBlob(t, store, "replaced", other)
			if kept := waitLostFound(t, opts.CacheDir, "replaced"); !bytes.HasSuffix(kept, mine) {
				t.Errorf("lost+found holds %d bytes, want the writer's file", len(kept))
			}
		}
	})
}

// TestFsyncAfterReopenKeepsBlocks: a log that already has content in the
// store, opened again for appending, is uploaded whole at its first fsync
// (blobfs does not know the blob's blocks), and carries on from there.
// Before, every fsync uploaded the whole file again.
func TestFsyncAfterReopenKeepsBlocks(t *testing.T) {
	const bs, step, steps = 64 << 10, 50 << 10, 10
	forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
		store := newSentCounter(inner)
		all := pattern(10*bs+123, 7)
		putBlob(t, inner, "old.log", all, nil)
		mnt, fsys := mountStore(t, store, Options{UploadBlockSize: bs})
		f, err := os.OpenFile(join(mnt, "old.log"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for i := range steps {
			chunk := pattern(step, byte(i))
			if _, err := f.Write(chunk); err != nil {
				t.Fatal(err)
			}
			all = append(all, chunk...)
			if err := f.Sync(); err != nil {
				t.Fatalf("fsync %d: %v", i, err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, inner, "old.log", all)
		// The first fsync sends the file as it then was; the others
		// what is new and at most a short tail each.
		first := int64(10*bs + 123 + step)
		sent, bound := store.sent.Load(), first+int64((steps-1)*step)+int64(steps)*bs/upload.KeptTailDivisor
		t.Logf("%d bytes sent for %d appended to a %d-byte blob, %d fsyncs; %d reused", sent, steps*step, 10*bs+123, steps, fsys.Stats().ReusedBytes)
		if sent > bound {
			t.Fatalf("%d bytes sent, want at most %d", sent, bound)
		}
	})
}
