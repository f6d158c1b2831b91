package fusefs

import (
	"os"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// The cost of a file rename's record (renamerecord.go), beside the rename
// it protects. Run both in one go, on one machine, and compare:
//
//	go test ./fusefs -run '^$' -bench 'BenchmarkRename' -benchtime 2000x
//
// BenchmarkRenameRecord is the record alone: a small file written (not
// fsynced) into the spill directory, and removed. BenchmarkRenameFile is
// a whole rename through a mount, record included, over each store
// backend (Azurite where $BLOBFS_TEST_AZURITE names one): the in-memory
// store is the fastest there is, so the record's share of it is the most
// it can be.

func BenchmarkRenameRecord(b *testing.B) {
	fsys := &FS{spillDir: b.TempDir(), log: testLogger(b)} // on the disk, as a cache directory is
	for b.Loop() {
		rec := fsys.recordRename("dir/file.tmp", "dir/file")
		if rec == "" {
			b.Fatal("no record written")
		}
		renameDone(rec)
	}
}

func BenchmarkRenameFile(b *testing.B) {
	for _, backend := range storetest.Backends() {
		if backend.Name == "faulty" {
			continue
		}
		b.Run(backend.Name, func(b *testing.B) {
			store := backend.New(b)
			putBlob(b, store, "a", []byte("content"), nil)
			mnt, _ := mountStore(b, store, Options{AttrTimeout: time.Hour, EntryTimeout: time.Hour})
			names := [2]string{join(mnt, "a"), join(mnt, "b")}
			i := 0
			for b.Loop() {
				if err := os.Rename(names[i%2], names[(i+1)%2]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
