package fusefs

// Edge cases of carrying blocks on between commits (fusefs/upload/stream.go), found
// in review: each failed, or would fail, with one of the guards removed.

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

func rnd(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 99))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// holdStore holds the next CommitBlocks, once armed, until release.
type holdStore struct {
	blobstore.Store
	mu      sync.Mutex
	armed   bool
	held    chan struct{}
	release chan struct{}
	// lose: the armed commit lands but its caller gets an error.
	lose bool
	// stages counts StageBlock calls.
	stages atomic.Int64
	// failStage makes every StageBlock fail.
	failStage atomic.Bool
}

func (s *holdStore) arm(lose bool) {
	s.mu.Lock()
	s.armed, s.lose, s.held, s.release = true, lose, make(chan struct{}), make(chan struct{})
	s.mu.Unlock()
}

func (s *holdStore) StageBlock(ctx context.Context, name, id string, data []byte) error {
	s.stages.Add(1)
	if s.failStage.Load() {
		return errors.New("stage refused")
	}
	return s.Store.StageBlock(ctx, name, id, data)
}

func (s *holdStore) CommitBlocks(ctx context.Context, name string, ids []string, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	s.mu.Lock()
	armed, lose, held, release := s.armed, s.lose, s.held, s.release
	s.armed = false
	s.mu.Unlock()
	if armed {
		close(held)
		<-release
	}
	a, err := s.Store.CommitBlocks(ctx, name, ids, opts)
	if armed && lose && err == nil {
		return blobstore.Attrs{}, errors.New("answer lost")
	}
	return a, err
}

// A write below the kept blocks while the commit that would carry on is
// in flight: the carried stream must not be installed.
func TestCarryOnNotAfterWriteDuringCommit(t *testing.T) {
	const bs = 64 << 10
	forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
		store := &holdStore{Store: inner}
		mnt, fsys := mountStore(t, store, Options{UploadBlockSize: bs})
		f, err := os.OpenFile(join(mnt, "w"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		model := rnd(3*bs+bs/2, 1)
		if _, err := f.WriteAt(model, 0); err != nil {
			t.Fatal(err)
		}
		store.arm(false)
		done := make(chan error)
		// In-process (fsync would hold the inode lock against the write).
		go func() { done <- fsys.Sync(context.Background()) }()
		<-store.held
		over := rnd(100, 2)
		if _, err := f.WriteAt(over, 10); err != nil {
			t.Fatal(err)
		}
		copy(model[10:], over)
		close(store.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		more := rnd(bs, 3)
		if _, err := f.WriteAt(more, int64(len(model))); err != nil {
			t.Fatal(err)
		}
		model = append(model, more...)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, inner, "w", model)
	})
}

// The carried commit's answer is lost (it landed): the retry path must
// end with the right content and MD5, and the commits after it too.
func TestCarryOnCommitAnswerLost(t *testing.T) {
	const bs = 64 << 10
	forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
		store := &holdStore{Store: inner}
		mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs})
		f, err := os.OpenFile(join(mnt, "l"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var model []byte
		for i := range 6 {
			chunk := rnd(bs+bs/3, uint64(10+i))
			if _, err := f.WriteAt(chunk, int64(len(model))); err != nil {
				t.Fatal(err)
			}
			model = append(model, chunk...)
			if i == 2 {
				store.arm(true)
				close(store.release)
			}
			if err := f.Sync(); err != nil {
				t.Fatalf("fsync %d: %v", i, err)
			}
			wantBlobAndMD5(t, inner, "l", model)
		}
	})
}

// Rename away and back while a carried stream waits: content and MD5.
func TestCarryOnRenameBackAndForth(t *testing.T) {
	const bs = 64 << 10
	forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
		mnt, _ := mountStore(t, inner, Options{UploadBlockSize: bs})
		f, err := os.OpenFile(join(mnt, "a"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		model := rnd(3*bs+bs/2, 4)
		f.WriteAt(model, 0)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(join(mnt, "a"), join(mnt, "b")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(join(mnt, "b"), join(mnt, "a")); err != nil {
			t.Fatal(err)
		}
		more := rnd(bs/2, 5)
		f.WriteAt(more, int64(len(model)))
		model = append(model, more...)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, inner, "a", model)
	})
}

// Truncate below the kept blocks and back up past them, then fsync.
func TestCarryOnTruncateDownUp(t *testing.T) {
	const bs = 64 << 10
	forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
		mnt, _ := mountStore(t, inner, Options{UploadBlockSize: bs})
		f, err := os.OpenFile(join(mnt, "t"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		model := rnd(4*bs, 6)
		f.WriteAt(model, 0)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(bs / 2); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(5 * bs); err != nil {
			t.Fatal(err)
		}
		model = append(model[:bs/2], make([]byte, 5*bs-bs/2)...)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		wantBlobAndMD5(t, inner, "t", model)
	})
}

// Whole-file uploads through uploadStream at awkward sizes, then appends.
func TestUploadStreamSizesCarryOn(t *testing.T) {
	const bs = 64 << 10
	for _, size := range []int{bs + 1, bs + bs/8 - 1, bs + bs/8, 2*bs - 1, 2 * bs, 2*bs + 1, 5 * bs} {
		forCarryOnStores(t, func(t *testing.T, inner blobstore.Store) {
			mnt, fsys := mountStore(t, inner, Options{UploadBlockSize: bs})
			f, err := os.OpenFile(join(mnt, "u"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			model := rnd(size, uint64(size))
			// Written backwards: no stream.
			f.WriteAt(model[size/2:], int64(size/2))
			f.WriteAt(model[:size/2], 0)
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			wantBlobAndMD5(t, inner, "u", model)
			for i := range 3 {
				more := rnd(bs/3+i, uint64(size+i))
				f.WriteAt(more, int64(len(model)))
				model = append(model, more...)
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
				wantBlobAndMD5(t, inner, "u", model)
			}
			if r := fsys.Stats().ReusedBytes; r < int64(3*(size/bs*bs)) {
				t.Errorf("size %d: %d bytes reused", size, r)
			}
		})
	}
}

func findOpenFile(fsys *FS, name string) *openFile {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	for _, n := range fsys.nodes.byID {
		if n.name == name && n.file != nil {
			return n.file
		}
	}
	return nil
}

// A commit whose context has already ended must not upload the whole file
// (blobstore.Upload returned at once; uploadStream stages every block on
// fs.ctx). Likewise a whole upload whose first block fails stops early.
func TestUploadStreamStops(t *testing.T) {
	const bs = 64 << 10
	store := &holdStore{Store: blobstore.NewMemory()}
	mnt, fsys := mountStore(t, store, Options{UploadBlockSize: bs})
	f, err := os.OpenFile(join(mnt, "c"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := rnd(40*bs, 7)
	f.WriteAt(data[bs:], bs) // out of order: no stream
	f.WriteAt(data[:bs], 0)
	// The first write handed the stream's blocks out (block 0 a hole)
	// before the second abandoned it: let them finish, so that the
	// counts below are the commits' own (under load, some were still
	// staging after the failures were switched on).
	waitFor(t, "the abandoned stream's blocks", func() bool { return fsys.up.Buffers.Lent() == 0 })
	of := findOpenFile(fsys, "c")
	if of == nil {
		t.Fatal("no open file")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := store.stages.Load()
	start := time.Now()
	err = of.commit(ctx)
	t.Logf("commit with a cancelled context: %v after %v; %d blocks staged", err, time.Since(start), store.stages.Load()-before)
	if n := store.stages.Load() - before; n > 2*int64(fsys.opts.UploadConcurrency) {
		t.Errorf("a commit whose context had ended staged %d blocks", n)
	}
	store.failStage.Store(true)
	before = store.stages.Load()
	err = of.commit(context.Background())
	t.Logf("commit with failing stages: %v; %d StageBlock calls", err, store.stages.Load()-before)
	if n := store.stages.Load() - before; n > 2*int64(fsys.opts.UploadConcurrency)+1 {
		t.Errorf("a whole upload went on after its blocks failed: %d StageBlock calls for %d blocks", n, 40)
	}
	store.failStage.Store(false)
}

// The model test of carryon_test.go on the faulty backend, with a store
// that also loses the answers of some commits (after they landed).
type loseSomeCommits struct {
	blobstore.Store
	n atomic.Int64
}

func (s *loseSomeCommits) CommitBlocks(ctx context.Context, name string, ids []string, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	a, err := s.Store.CommitBlocks(ctx, name, ids, opts)
	if err == nil && s.n.Add(1)%3 == 0 {
		return blobstore.Attrs{}, errors.New("answer lost")
	}
	return a, err
}

// TestCarryOnModelFaultyAndLost: the model test on the faulty backend, and
// with a store that loses the answers of some commits after they landed.
func TestCarryOnModelFaultyAndLost(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4} {
		faulty := storetest.Faulty(t)
		checkCarryOnModel(t, faulty, faulty, seed)
		inner := blobstore.NewMemory()
		checkCarryOnModel(t, &loseSomeCommits{Store: inner}, inner, seed)
	}
}
