package fusefs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
)

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

// TestStagedBlocksLeaveThePageCache: while a file is written sequentially,
// the spill file's pages of blocks already staged leave the page cache;
// the file's content is whole all the same, read back through the mount
// before close and in the store after it, including a page rewritten
// after its block was staged.
func TestStagedBlocksLeaveThePageCache(t *testing.T) {
	store := blobstore.NewMemory()
	cache := t.TempDir()
	const bs = 1 << 20
	mnt, _ := mountStore(t, store, Options{CacheDir: cache, UploadBlockSize: bs})
	data := randomBytes(8*bs+1234, 1)

	f, err := os.Create(join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; off < len(data); off += 256 << 10 {
		if _, err := f.WriteAt(data[off:min(off+256<<10, len(data))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	spills, err := filepath.Glob(filepath.Join(cache, "spill", spillPrefix+"*"))
	if err != nil || len(spills) != 1 {
		t.Fatalf("spill files %v (%v), want one", spills, err)
	}
	// Eight full blocks are staged; their pages go once on disk.
	var resident, total int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resident, total = residentPages(t, spills[0])
		if resident <= total/4 || time.Now().After(deadline) {
			break
		}
	}
	if resident > total/4 {
		t.Fatalf("%d of the spill file's %d pages still in the page cache after its blocks were staged", resident, total)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reading the open file back: %v, equal=%v", err, bytes.Equal(got, data))
	}
	// A rewrite inside a staged block: the upload of the whole file then
	// reads the dropped pages from disk.
	patch := []byte("written again after its block was staged")
	copy(data[100:], patch)
	if _, err := f.WriteAt(patch, 100); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := blobContent(t, store, "big"); !bytes.Equal(got, data) {
		t.Fatalf("the blob has %d bytes, differing from the %d written", len(got), len(data))
	}
}
