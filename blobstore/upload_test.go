package blobstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

func TestUploadRequests(t *testing.T) {
	const bs = 1000
	cases := []struct {
		name        string
		size        int64
		opts        blobstore.UploadOptions
		puts, stage int64
	}{
		{"empty", 0, blobstore.UploadOptions{BlockSize: bs}, 1, 0},
		{"up to the block size: one Put", bs, blobstore.UploadOptions{BlockSize: bs}, 1, 0},
		{"one byte more: blocks", bs + 1, blobstore.UploadOptions{BlockSize: bs}, 0, 2},
		{"explicit single-shot limit", 5 * bs, blobstore.UploadOptions{BlockSize: bs, SingleShotLimit: 5 * bs}, 1, 0},
		{"always blocks", 10, blobstore.UploadOptions{BlockSize: bs, SingleShotLimit: -1}, 0, 1},
		{"many blocks", 25*bs + 1, blobstore.UploadOptions{BlockSize: bs, Concurrency: 4}, 0, 26},
		// 50,001 one-byte blocks would exceed MaxBlocks: the block size
		// grows (to a MiB), so one block holds everything.
		{"block size grows", blobstore.MaxBlocks + 1, blobstore.UploadOptions{BlockSize: 1, SingleShotLimit: -1}, 0, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := blobstore.NewMemory()
			data := randomBytes(7, int(c.size))
			if _, err := blobstore.Upload(t.Context(), m, "f", bytes.NewReader(data), c.size, c.opts); err != nil {
				t.Fatal(err)
			}
			req := m.Requests()
			commits := int64(0)
			if c.stage > 0 {
				commits = 1
			}
			if req[blobstore.OpPut] != c.puts || req[blobstore.OpStageBlock] != c.stage || req[blobstore.OpCommitBlocks] != commits {
				t.Errorf("requests %v, want %d Put, %d StageBlock, %d CommitBlocks", req, c.puts, c.stage, commits)
			}
			if got := readAll(t, m, "f"); !bytes.Equal(got, data) {
				t.Error("content differs")
			}
		})
	}
}

// inFlight is a Store whose StageBlock takes a while and records how many
// run at once.
type inFlight struct {
	blobstore.Store
	mu       sync.Mutex
	now, max int
}

func (s *inFlight) StageBlock(ctx context.Context, name, id string, data []byte) error {
	s.mu.Lock()
	s.now++
	s.max = max(s.max, s.now)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}()
	time.Sleep(5 * time.Millisecond)
	return s.Store.StageBlock(ctx, name, id, data)
}

func TestUploadConcurrency(t *testing.T) {
	for _, conc := range []int{1, 3} {
		t.Run(fmt.Sprint(conc), func(t *testing.T) {
			s := &inFlight{Store: blobstore.NewMemory()}
			data := randomBytes(1, 12*100)
			_, err := blobstore.Upload(t.Context(), s, "f", bytes.NewReader(data), int64(len(data)),
				blobstore.UploadOptions{BlockSize: 100, Concurrency: conc})
			if err != nil {
				t.Fatal(err)
			}
			// At most conc blocks in flight, and so at most conc
			// buffers; more than one when allowed, or parallelism
			// is not happening.
			if s.max > conc || (conc > 1 && s.max < 2) {
				t.Errorf("%d blocks staged at once, want at most %d (and more than 1)", s.max, conc)
			}
			if got := readAll(t, s, "f"); !bytes.Equal(got, data) {
				t.Error("content differs")
			}
		})
	}
}

func TestUploadFailedBlock(t *testing.T) {
	m := blobstore.NewMemory()
	f := blobstore.NewFaulty(m, blobstore.FaultOptions{})
	f.FailNext(blobstore.OpStageBlock, 1, blobstore.ErrUnauthorized)
	_, err := blobstore.Upload(t.Context(), f, "f", bytes.NewReader(make([]byte, 1000)), 1000,
		blobstore.UploadOptions{BlockSize: 100, Concurrency: 2})
	wantErr(t, "Upload with a failing block", err, blobstore.ErrUnauthorized)
	if n := m.Requests()[blobstore.OpCommitBlocks]; n != 0 {
		t.Errorf("%d commits after a failed block, want none", n)
	}
	if n := m.Requests()[blobstore.OpStageBlock]; n >= 9 {
		t.Errorf("%d of 10 blocks staged after the first failed: the rest were not cancelled", n)
	}
	_, err = m.Stat(t.Context(), "f")
	wantErr(t, "Stat", err, blobstore.ErrNotFound)
}

func TestBlockID(t *testing.T) {
	nonces := []string{blobstore.NewBlockNonce(), blobstore.NewBlockNonce(), "short", "a nonce much longer than sixteen bytes", ""}
	seen := map[string]string{}
	want := len(blobstore.BlockID(nonces[0], 0))
	for _, nonce := range nonces {
		for _, i := range []int{0, 1, 9, 10, 49999, 99_999_999} {
			id := blobstore.BlockID(nonce, i)
			what := fmt.Sprintf("BlockID(%q, %d) = %q", nonce, i, id)
			if len(id) != want {
				t.Errorf("%s: length %d, want %d like every other id", what, len(id), want)
			}
			raw, err := base64.StdEncoding.DecodeString(id)
			if err != nil || len(raw) > blobstore.MaxBlockIDLength {
				t.Errorf("%s: not base64 of at most %d bytes (%v)", what, blobstore.MaxBlockIDLength, err)
			}
			if prev, ok := seen[id]; ok {
				t.Errorf("%s: same as %s", what, prev)
			}
			seen[id] = what
			if again := blobstore.BlockID(nonce, i); again != id {
				t.Errorf("%s, then %q: not deterministic", what, again)
			}
		}
	}
	for _, i := range []int{-1, 100_000_000} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("BlockID(n, %d) did not panic", i)
				}
			}()
			blobstore.BlockID("n", i)
		}()
	}
	if a, b := blobstore.NewBlockNonce(), blobstore.NewBlockNonce(); a == b || len(a) != 16 {
		t.Errorf("NewBlockNonce: %q, %q", a, b)
	}
}

func TestUploadNegativeSize(t *testing.T) {
	_, err := blobstore.Upload(t.Context(), blobstore.NewMemory(), "f", bytes.NewReader(nil), -1, blobstore.UploadOptions{})
	if err == nil || errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Upload of size -1: %v", err)
	}
}

// ExampleUpload uploads 20 MiB as three 8 MiB blocks, staged in parallel.
func ExampleUpload() {
	ctx := context.Background()
	store := blobstore.NewMemory()
	data := bytes.Repeat([]byte("blobfs"), 20<<20/6)
	a, err := blobstore.Upload(ctx, store, "dir/file", bytes.NewReader(data), int64(len(data)), blobstore.UploadOptions{
		PutOptions: blobstore.PutOptions{Metadata: map[string]string{"owner": "me"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	req := store.Requests()
	fmt.Println(a.Size, a.Metadata["owner"], req[blobstore.OpStageBlock], req[blobstore.OpCommitBlocks])
	// Output: 20971518 me 3 1
}
