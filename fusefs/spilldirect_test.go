package fusefs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
)

// TestAlignedRequestBuf: whatever the allocation, a WRITE's data lands on
// a page boundary, and the buffer has the length asked for.
func TestAlignedRequestBuf(t *testing.T) {
	for _, n := range []int{1 << 20, 1<<20 + requestSlack, 4096, 12345} {
		buf := alignedRequestBuf(n)
		if len(buf) != n || cap(buf) != n {
			t.Fatalf("alignedRequestBuf(%d): len %d cap %d", n, len(buf), cap(buf))
		}
		if a := uintptr(unsafe.Pointer(&buf[writePayloadOffset])) % directAlign; a != 0 {
			t.Fatalf("alignedRequestBuf(%d): payload at %d past a page boundary", n, a)
		}
	}
}

// residentPages counts the pages of the file at path that are in the page
// cache.
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() == 0 {
		return 0, 0
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec)
}

// randomBytes returns n bytes with no period: a block read back at the
// wrong offset differs.
func randomBytes(n int, seed byte) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// TestLargeWritesBypassPageCache: a file written in large aligned writes
// has its spill file written around the page cache, small writes into it
// stay buffered, and what the store gets is every byte written, read back
// partly direct and partly through the page cache.
func TestLargeWritesBypassPageCache(t *testing.T) {
	store := blobstore.NewMemory()
	cache := t.TempDir()
	mnt, _ := mountStore(t, store, Options{CacheDir: cache, UploadBlockSize: 1 << 20})
	data := randomBytes(6<<20+1234, 1)

	f, err := os.Create(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const chunk = 512 << 10
	for off := 0; off < 4<<20; off += chunk {
		if _, err := f.WriteAt(data[off:off+chunk], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	spills, err := filepath.Glob(filepath.Join(cache, "spill", spillPrefix+"*"))
	if err != nil || len(spills) != 1 {
		t.Fatalf("spill files %v (%v), want one", spills, err)
	}
	if resident, total := residentPages(t, spills[0]); total != 1024 || resident > total/8 {
		t.Fatalf("after 4 MiB of 512 KiB writes, %d of the spill file's %d pages are in the page cache; want it written around it", resident, total)
	}
	// Small writes, and the unaligned rest, go through the page cache.
	for off := 4 << 20; off < len(data); {
		n := min(1000, len(data)-off)
		if _, err := f.WriteAt(data[off:off+n], int64(off)); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	// A small overwrite inside a page written direct.
	patch := []byte("written through the page cache")
	copy(data[100:], patch)
	if _, err := f.WriteAt(patch, 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := blobContent(t, store, "big")
	if !bytes.Equal(got, data) {
		t.Fatalf("the blob has %d bytes, differing from the %d written (first: %q)", len(got), len(data), head(got))
	}
}

// TestSpillReader: reads of a file written partly direct and partly
// buffered give its bytes back whatever the alignment of buffer, offset
// and length.
func TestSpillReader(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "spill")
	buffered, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer buffered.Close()
	direct, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Skipf("no O_DIRECT in %s: %v", dir, err)
	}
	defer direct.Close()
	want := randomBytes(3*directAlign*16+777, 2)
	aligned := alignedRequestBuf(len(want) + writePayloadOffset)[writePayloadOffset:]
	copy(aligned, want)
	if _, err := direct.WriteAt(aligned[:32*directAlign], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := buffered.WriteAt(want[32*directAlign:], 32*directAlign); err != nil {
		t.Fatal(err)
	}
	r := spillReader{buffered: buffered, direct: direct}
	dst := alignedRequestBuf(len(want) + directAlign + writePayloadOffset)[writePayloadOffset:]
	for _, c := range []struct {
		name        string
		bufOff, off int
		n           int
	}{
		{"aligned, the direct part", 0, 0, 32 * directAlign},
		{"aligned, across both parts", 0, 16 * directAlign, 24 * directAlign},
		{"aligned with an unaligned end", 0, 0, len(want)},
		{"aligned, past the end", 0, 40 * directAlign, 16 * directAlign},
		{"unaligned buffer", 1, 0, 8 * directAlign},
		{"unaligned offset", 0, 5, 8 * directAlign},
		{"less than a page", 0, 0, 100},
	} {
		p := dst[c.bufOff : c.bufOff+c.n]
		clear(p)
		n, err := r.ReadAt(p, int64(c.off))
		wantN := min(c.n, len(want)-c.off)
		if n != wantN || (err != nil && n == c.n) {
			t.Fatalf("%s: read %d bytes (%v), want %d", c.name, n, err, wantN)
		}
		if !bytes.Equal(p[:n], want[c.off:c.off+n]) {
			t.Fatalf("%s: the bytes read differ from those written", c.name)
		}
	}
}
