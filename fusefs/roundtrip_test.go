package fusefs

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// BenchmarkOpenClose measures FUSE round trips of requests blobfs answers
// from memory: each iteration is an OPEN, a FLUSH and a RELEASE.
func BenchmarkOpenClose(b *testing.B) {
	mem := blobstore.NewMemory()
	putBlob(b, mem, "f", []byte("x"), nil)
	mnt, _ := mountStore(b, mem, Options{AttrTimeout: time.Hour, EntryTimeout: time.Hour})
	path := join(mnt, "f")
	if _, err := os.Stat(path); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		fd, err := syscall.Open(path, syscall.O_RDONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		syscall.Close(fd)
	}
}
