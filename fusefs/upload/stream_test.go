package upload

import (
	"bytes"
	"context"
	"crypto/md5"
	"io"
	"log/slog"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/memory"
)

func newUploader(store blobstore.Store, bs int64) *Uploader {
	return &Uploader{Store: store, BlockSize: bs, Buffers: memory.NewUploads(4, bs), Ctx: context.Background(), Log: slog.New(slog.DiscardHandler)}
}

// TestStreamCommitThenCarryOn: a stream stages a file's full blocks as they
// are written, its commit stores the file with its Content-MD5, and the
// stream that carries on names the committed blocks again, so that the
// next commit, after an append, sends only what follows them.
func TestStreamCommitThenCarryOn(t *testing.T) {
	const bs = 64 << 10
	ctx := context.Background()
	mem := blobstore.NewMemory()
	u := newUploader(mem, bs)
	data := storetest.Pattern(3*bs+bs/2, 1) // three full blocks and a tail of half a block
	st := u.NewStream("f")
	if err := st.StageFull(bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if st.Next() != 3*bs {
		t.Fatalf("staged up to %d, want the three full blocks, %d", st.Next(), 3*bs)
	}
	attrs, err := st.Commit(ctx, bytes.NewReader(data), int64(len(data)), blobstore.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	if !bytes.Equal(attrs.ContentMD5, sum[:]) {
		t.Errorf("Content-MD5 %x, want %x", attrs.ContentMD5, sum)
	}
	if got := readBlob(t, mem, "f"); !bytes.Equal(got, data) {
		t.Fatal("the blob is not the file written")
	}
	if u.Uploading.Load() != 0 {
		t.Errorf("%d bytes still counted as uploading after the commit", u.Uploading.Load())
	}

	next := st.CarryOn(int64(len(data)))
	if next == nil {
		t.Fatal("no stream carries on after a commit")
	}
	if next.Next() != int64(len(data)) || next.Reused() != int64(len(data)) {
		t.Fatalf("carried on from %d reusing %d, want the whole file %d (its tail holds at least bs/%d)", next.Next(), next.Reused(), len(data), KeptTailDivisor)
	}
	more := append(data, storetest.Pattern(bs, 2)...)
	if _, err := next.Commit(ctx, bytes.NewReader(more), int64(len(more)), blobstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := readBlob(t, mem, "f"); !bytes.Equal(got, more) {
		t.Fatal("the blob after the append is not the file written")
	}
}

// TestHashResume: a stream's MD5 resumes where a block it hashed ended
// (what CarryOn needs), to the MD5 of the bytes before it and after, and
// nowhere else.
func TestHashResume(t *testing.T) {
	h := NewHash()
	h.keepStates = true
	a, b := storetest.Pattern(1000, 1), storetest.Pattern(500, 2)
	h.Add(0, a)
	h.Add(1000, b)
	r, ok := h.resumeAt(1000)
	if !ok {
		t.Fatal("no state kept at 1000, where a block ended")
	}
	c := storetest.Pattern(300, 3)
	r.Add(1000, c)
	want := md5.Sum(append(append([]byte(nil), a...), c...))
	if got := r.Sum(1300); !bytes.Equal(got, want[:]) {
		t.Fatalf("resumed MD5 %x, want %x", got, want)
	}
	if _, ok := h.resumeAt(700); ok {
		t.Error("resumed at 700, where no block ended")
	}
}

func readBlob(t *testing.T, s blobstore.Store, name string) []byte {
	t.Helper()
	a, err := s.Stat(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, a.Size)
	n, err := s.ReadAt(context.Background(), name, b, 0, "")
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return b[:n]
}
