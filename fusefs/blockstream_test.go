package fusefs

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// gatedStore holds every StageBlock until the gate opens, and counts the
// calls in flight, and all calls by blob name.
type gatedStore struct {
	blobstore.Store
	gate chan struct{} // closed (by open) to let StageBlock calls through
	once sync.Once

	mu       sync.Mutex
	inFlight int
	started  int
	byName   map[string]int
}

func (s *gatedStore) StageBlock(ctx context.Context, name, id string, data []byte) error {
	s.mu.Lock()
	s.inFlight++
	s.started++
	if s.byName == nil {
		s.byName = map[string]int{}
	}
	s.byName[name]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	select {
	case <-s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.StageBlock(ctx, name, id, data)
}

// newGatedStore returns a gatedStore over a new memory store, its gate
// shut.
func newGatedStore() *gatedStore {
	return &gatedStore{Store: blobstore.NewMemory(), gate: make(chan struct{})}
}

func (s *gatedStore) open() { s.once.Do(func() { close(s.gate) }) }

func (s *gatedStore) counts() (inFlight, started int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight, s.started
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestStreamingStagesBlocksInParallel: while a file is being written, as
// many blocks stage at once as there are upload slots (2 ×
// UploadConcurrency), the writes are answered without waiting for them,
// and the commit at close stages the tail while those are still in flight.
func TestStreamingStagesBlocksInParallel(t *testing.T) {
	const bs, conc = 1 << 20, 3
	slots := 2 * conc
	store := newGatedStore()
	mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: conc})
	t.Cleanup(store.open) // before the unmount, should the test fail early
	data := pattern(slots*bs+777, 9)

	f, err := os.Create(join(mnt, "par"))
	if err != nil {
		t.Fatal(err)
	}
	// Every full block is handed to an upload that cannot finish; the
	// writes still return.
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "all full blocks staging at once", func() bool {
		n, _ := store.counts()
		return n == slots
	})

	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	waitFor(t, "the tail staging beside the full blocks", func() bool {
		n, started := store.counts()
		return n == slots+1 && started == slots+1
	})
	select {
	case err := <-closed:
		t.Fatalf("close returned (%v) before its blocks were staged", err)
	default:
	}
	store.open()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wantBlob(t, store, "par", data)
	if _, started := store.counts(); started != slots+1 {
		t.Fatalf("%d blocks staged, want %d (no block sent twice)", started, slots+1)
	}
}

// TestStreamingAfterEarlyFlush: a FLUSH before the first full block (a
// shell's "> file" and dd open the file, dup2 it and close the first
// descriptor) leaves streaming on: the blocks written afterwards stage
// while the file is written, not all at its last close.
func TestStreamingAfterEarlyFlush(t *testing.T) {
	const bs = 1 << 20
	for _, early := range []struct {
		name string
		data []byte // written before the early FLUSH
	}{
		{"empty", nil},
		{"less than a block", pattern(bs/3, 4)},
	} {
		t.Run(early.name, func(t *testing.T) {
			store := newGatedStore()
			store.open()
			mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: 3})
			f, err := os.Create(join(mnt, "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(early.data); err != nil {
				t.Fatal(err)
			}
			dup, err := syscall.Dup(int(f.Fd()))
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Close(dup); err != nil { // the FLUSH
				t.Fatal(err)
			}
			rest := pattern(4*bs+99, 5)
			if _, err := f.Write(rest); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the full blocks staging before the close", func() bool {
				_, started := store.counts()
				return started >= 4
			})
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			wantBlob(t, store, "out", append(append([]byte(nil), early.data...), rest...))
			if _, started := store.counts(); started != 5 {
				t.Fatalf("%d blocks staged in all, want 5 (4 full ones and the tail, none twice)", started)
			}
		})
	}
}

// TestStreamNotStagedUnderOldName: a file renamed while it is written
// stages no block under its old name after the rename, which its commit
// could not use. Here the rename's own commit leaves the stream in place
// (it staged nothing yet), and the blocks written afterwards must not go
// to the old name.
func TestStreamNotStagedUnderOldName(t *testing.T) {
	const bs = 1 << 20
	store := newGatedStore()
	store.open()
	mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: 3})
	f, err := os.Create(join(mnt, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := pattern(100, 1)
	if _, err := f.Write(head); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(join(mnt, "a"), join(mnt, "b")); err != nil {
		t.Fatal(err)
	}
	rest := pattern(4*bs+7, 2)
	if _, err := f.Write(rest); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, store, "b", append(head, rest...))
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.byName["a"] > 0 {
		t.Fatalf("%d blocks staged under the old name after the rename (by name: %v)", store.byName["a"], store.byName)
	}
}

// sizeStore records the size of every staged block.
type sizeStore struct {
	blobstore.Store
	mu    sync.Mutex
	sizes map[int]int // block size -> blocks staged of it
}

func (s *sizeStore) StageBlock(ctx context.Context, name, id string, data []byte) error {
	s.mu.Lock()
	s.sizes[len(data)]++
	s.mu.Unlock()
	return s.Store.StageBlock(ctx, name, id, data)
}

// TestStreamBlocksGrow: a stream's blocks after the first blockGrowAfter
// are twice the block size, so that a large file streams within Azure's
// block count; the blob is the file, and no block goes twice.
func TestStreamBlocksGrow(t *testing.T) {
	defer func(n int) { blockGrowAfter = n }(blockGrowAfter)
	blockGrowAfter = 3
	const bs = 64 << 10
	store := &sizeStore{Store: blobstore.NewMemory(), sizes: map[int]int{}}
	mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: 2})
	data := pattern(3*bs+4*2*bs+777, 6)
	f, err := os.Create(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	// In pieces smaller than a block, as a writer's requests arrive.
	for off := 0; off < len(data); off += 20000 {
		if _, err := f.Write(data[off:min(off+20000, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, store, "big", data)
	store.mu.Lock()
	defer store.mu.Unlock()
	want := map[int]int{bs: 3, 2 * bs: 4, 777: 1}
	if len(store.sizes) != len(want) || store.sizes[bs] != 3 || store.sizes[2*bs] != 4 || store.sizes[777] != 1 {
		t.Fatalf("staged blocks by size %v, want %v", store.sizes, want)
	}
}
