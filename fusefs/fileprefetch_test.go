package fusefs

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// TestPrefetchFilesInNameOrder: a directory's small files opened one after
// another in name order are fetched ahead, so that most reads find their
// file in the cache; files read in another order, or with prefetch off,
// are each fetched when read. Every file reads back its own content.
func TestPrefetchFilesInNameOrder(t *testing.T) {
	const files = 60
	content := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 3000+i) }
	for _, tc := range []struct {
		name      string
		opts      Options
		order     func(i int) int
		minHits   uint64
		maxHits   uint64
		wantReads int64
	}{
		{"name order", Options{}, func(i int) int { return i }, files - 4, files, files},
		{"reverse order", Options{}, func(i int) int { return files - 1 - i }, 0, 0, files},
		{"disabled", Options{PrefetchFiles: -1}, func(i int) int { return i }, 0, 0, files},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := blobstore.NewMemory()
			for i := range files {
				putBlob(t, mem, fmt.Sprintf("d/f%03d", i), content(i), nil)
			}
			putBlob(t, mem, "d/zz-large", make([]byte, 9<<20), nil) // more than one read block: never prefetched
			mnt, fsys := mountStore(t, mem, tc.opts)
			for k := range files {
				i := tc.order(k)
				got := mustRead(t, join(mnt, "d", fmt.Sprintf("f%03d", i)))
				if !bytes.Equal(got, content(i)) {
					t.Fatalf("f%03d: wrong content", i)
				}
			}
			hits, _ := fsys.blocks.Stats()
			if hits < tc.minHits || hits > tc.maxHits {
				t.Errorf("%d cache hits, want %d..%d", hits, tc.minHits, tc.maxHits)
			}
			// Nothing is fetched twice, nothing that was not read.
			if got := mem.Requests()[blobstore.OpReadAt]; got != tc.wantReads {
				t.Errorf("%d reads from the store, want %d", got, tc.wantReads)
			}
		})
	}
}
