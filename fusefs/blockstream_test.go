package fusefs

import (
	"context"
	"maps"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/upload"
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

// Waits for an event, polled (storetest).
var (
	waitFor   = storetest.WaitFor
	pollUntil = storetest.PollUntil
)

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
	bytes int
}

func (s *sizeStore) StageBlock(ctx context.Context, name, id string, data []byte) error {
	s.mu.Lock()
	s.sizes[len(data)]++
	s.bytes += len(data)
	s.mu.Unlock()
	return s.Store.StageBlock(ctx, name, id, data)
}

func (s *sizeStore) staged() (map[int]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sizes), s.bytes
}

// TestStreamBlocksGrow: a stream's blocks after the first blockGrowAfter
// are twice the block size, so that a large file streams within Azure's
// block count: while the file is written, and after an fsync carries the
// stream on. The blob is the file, and no byte goes twice but a short
// tail's.
func TestStreamBlocksGrow(t *testing.T) {
	// Put back after the unmount (cleanups run last first): a release
	// may still be committing after the test's last close.
	old := upload.BlockGrowAfter
	t.Cleanup(func() { upload.BlockGrowAfter = old })
	upload.BlockGrowAfter = 3
	// tail is under an eighth of a grown block, not of bs.
	const bs, tail = 64 << 10, 10000
	store := &sizeStore{Store: blobstore.NewMemory(), sizes: map[int]int{}}
	mnt, _ := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: 2})
	data := pattern(3*bs+4*2*bs+tail, 6)
	f, err := os.Create(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(p []byte) {
		// In pieces smaller than a block, as a writer's requests arrive.
		for off := 0; off < len(p); off += 20000 {
			if _, err := f.Write(p[off:min(off+20000, len(p))]); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(data)
	waitFor(t, "the full blocks streamed while the file is written", func() bool {
		sizes, _ := store.staged()
		return sizes[bs] == 3 && sizes[2*bs] == 4
	})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	wantBlobAndMD5(t, store, "big", data)
	if sizes, _ := store.staged(); len(sizes) != 3 || sizes[tail] != 1 {
		t.Fatalf("staged blocks by size %v, want 3 of %d, 4 of %d and the tail", sizes, bs, 2*bs)
	}

	// The tail, under an eighth of a full block at its place, goes
	// again with what follows; the blocks before it are kept.
	more := pattern(2*2*bs+5000, 7)
	write(more)
	data = append(data, more...)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlobAndMD5(t, store, "big", data)
	sizes, sent := store.staged()
	if want := len(data) + tail; sent != want {
		t.Errorf("%d bytes staged, want %d (each byte once, the short tail twice)", sent, want)
	}
	if sizes[bs] != 3 || sizes[2*bs] != 6 {
		t.Errorf("staged blocks by size %v, want 3 of %d and 6 of %d", sizes, bs, 2*bs)
	}
}

// commitGate holds CommitBlocks until release is closed, and says when
// one has started.
type commitGate struct {
	blobstore.Store
	started chan struct{} // one value per CommitBlocks call
	release chan struct{}
}

func (s *commitGate) CommitBlocks(ctx context.Context, name string, ids []string, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	s.started <- struct{}{}
	<-s.release
	return s.Store.CommitBlocks(ctx, name, ids, opts)
}

// TestUploadingBytesAreWhatIsStillToSend: Stats.UploadingBytes (the
// blobfs_volume_uploading_bytes gauge) counts the bytes still to upload:
// a sequential write's blocks in flight while it streams, and at close
// only what is left to send, not the whole file. (Issue 38: it read 0
// while a file streamed, and the file's whole size during its close.)
func TestUploadingBytesAreWhatIsStillToSend(t *testing.T) {
	const bs = 256 << 10
	gated := newGatedStore()
	store := &commitGate{Store: gated, started: make(chan struct{}, 1), release: make(chan struct{})}
	mnt, fsys := mountStore(t, store, Options{UploadBlockSize: bs, UploadConcurrency: 2})
	data := pattern(3*bs+1000, 5)
	f := mustOpen(t, join(mnt, "seq"), os.O_WRONLY|os.O_CREATE|os.O_EXCL)
	mustWriteHandle(t, f, data)
	waitFor(t, "blocks staged while writing", func() bool { inFlight, _ := gated.counts(); return inFlight == 3 })
	if got := fsys.Stats().UploadingBytes; got != 3*bs {
		t.Errorf("uploading %d bytes while 3 blocks of %d stream, want %d", got, bs, 3*bs)
	}
	gated.open()
	waitFor(t, "the streamed blocks acknowledged", func() bool { return fsys.Stats().UploadingBytes == 0 })

	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	<-store.started // the tail is staged; the commit waits
	if got := fsys.Stats().UploadingBytes; got != 0 {
		t.Errorf("uploading %d bytes while only the commit of a streamed file of %d is left, want 0", got, len(data))
	}
	close(store.release)
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	wantBlob(t, gated, "seq", data)
	if got := fsys.Stats().UploadingBytes; got != 0 {
		t.Errorf("uploading %d bytes after the commit, want 0", got)
	}
}

// TestStreamBlocks: the block count of a stream, and the largest file
// that streams at the default block size (docs/reference.md).
func TestStreamBlocks(t *testing.T) {
	const bs = DefaultUploadBlockSize
	small := int64(upload.BlockGrowAfter) * bs
	for _, c := range []struct{ size, want int64 }{
		{0, 0}, {1, 1}, {bs, 1}, {bs + 1, 2},
		{small, int64(upload.BlockGrowAfter)},
		{small + 1, int64(upload.BlockGrowAfter) + 1},
		{small + 2*bs, int64(upload.BlockGrowAfter) + 1},
		{small + 2*bs + 1, int64(upload.BlockGrowAfter) + 2},
	} {
		if got := upload.StreamBlocks(c.size, bs); got != c.want {
			t.Errorf("streamBlocks(%d, %d) = %d, want %d", c.size, bs, got, c.want)
		}
	}
	if n := upload.StreamBlocks(351<<30, bs); n >= blobstore.MaxBlocks-1 {
		t.Errorf("351 GiB takes %d blocks: does not stream", n)
	}
	if n := upload.StreamBlocks(352<<30, bs); n < blobstore.MaxBlocks-1 {
		t.Errorf("352 GiB takes %d blocks: streams, the docs say it does not", n)
	}
}
