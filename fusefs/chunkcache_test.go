package fusefs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
)

// TestRandomReadsFetchChunks: a handle that seeks before every read is
// served with small ranged GETs, not a read block each; its bytes are the
// blob's; a chunk read again comes from memory; and once it reads
// sequentially it goes back to blocks and read-ahead. The read amplification
// (Stats: bytes fetched / bytes read) says so.
func TestRandomReadsFetchChunks(t *testing.T) {
	const size = 64 << 20 // eight read blocks; large enough for direct I/O
	data := pattern(size, 7)
	mem := blobstore.NewMemory()
	putBlob(t, mem, "big", data, nil)
	mnt, fsys := mountStore(t, mem, Options{})
	f, err := os.Open(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	rng := rand.New(rand.NewPCG(1, 2))
	const reads = 200
	buf := make([]byte, 4096)
	offsets := make([]int64, reads)
	for i := range offsets {
		offsets[i] = rng.Int64N(size - int64(len(buf)))
	}
	read := func(off int64) {
		t.Helper()
		n, err := f.ReadAt(buf, off)
		if err != nil || n != len(buf) || !bytes.Equal(buf, data[off:off+int64(n)]) {
			t.Fatalf("pread of %d bytes at %d: %d bytes, %v, equal %v", len(buf), off, n, err, bytes.Equal(buf[:n], data[off:off+int64(n)]))
		}
	}
	before := fsys.Stats()
	for _, off := range offsets {
		read(off)
	}
	s := fsys.Stats()
	fetched, got := s.FetchedBytes-before.FetchedBytes, s.ReadBytes-before.ReadBytes
	if got != reads*int64(len(buf)) {
		t.Fatalf("read bytes counted %d, want %d", got, reads*len(buf))
	}
	// Each read costs one or two 64 KiB chunks; a block each would be
	// 8 MiB.
	if max := int64(reads) * 2 * cache.RandomChunk; fetched > max {
		t.Errorf("%d random reads of 4 KiB fetched %d bytes (amplification %.0f); want at most %d (chunks, not blocks)",
			reads, fetched, float64(fetched)/float64(got), max)
	}
	t.Logf("random: %d bytes read, %d fetched: amplification %.1f", got, fetched, float64(fetched)/float64(got))

	// The same offsets again: from the chunks kept.
	before = fsys.Stats()
	for _, off := range offsets[:50] {
		read(off)
	}
	if s := fsys.Stats(); s.FetchedBytes != before.FetchedBytes {
		t.Errorf("re-reading chunks just read fetched %d bytes more", s.FetchedBytes-before.FetchedBytes)
	}

	// Sequential again, from offset 0 of the same handle: blocks and
	// read-ahead, about as many bytes fetched as read.
	before = fsys.Stats()
	whole := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(whole)) {
		n, err := f.ReadAt(whole, off)
		if err != nil || !bytes.Equal(whole[:n], data[off:off+int64(n)]) {
			t.Fatalf("sequential pread at %d: %d, %v", off, n, err)
		}
	}
	s = fsys.Stats()
	fetched, got = s.FetchedBytes-before.FetchedBytes, s.ReadBytes-before.ReadBytes
	if fetched > got+int64(fsys.Options().ReadBlockSize) || fetched < got/2 {
		t.Errorf("sequential read of %d bytes fetched %d: want about as many (blocks and read-ahead)", got, fetched)
	}
	t.Logf("sequential: %d bytes read, %d fetched", got, fetched)
}
