package blobstore_test

import (
	"bytes"
	"crypto/md5"
	"io"
	"sync/atomic"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// changingReader is a source whose bytes change with every read, as a
// file still being written through another handle does.
type changingReader struct {
	size  int64
	reads atomic.Int64
}

func (r *changingReader) ReadAt(p []byte, off int64) (int, error) {
	v := byte(r.reads.Add(1))
	n := int(min(int64(len(p)), r.size-off))
	for i := range n {
		p[i] = v + byte(off+int64(i))
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// The Content-MD5 Upload commits is the MD5 of the bytes it staged, even
// when its source changes under it.
func TestUploadContentMD5OfWhatWasStaged(t *testing.T) {
	mem := blobstore.NewMemory()
	const bs = 64 << 10
	r := &changingReader{size: 7*bs + 5}
	a, err := blobstore.Upload(t.Context(), mem, "b", r, r.size, blobstore.UploadOptions{BlockSize: bs, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, r.size)
	if _, err := mem.ReadAt(t.Context(), "b", got, 0, a.ETag); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if sum := md5.Sum(got); !bytes.Equal(a.ContentMD5, sum[:]) {
		t.Fatalf("Content-MD5 %x, but the stored bytes hash to %x", a.ContentMD5, sum)
	}
}
