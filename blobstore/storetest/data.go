package storetest

import (
	"context"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// Pattern is n bytes that differ from one seed to the next, and from one
// offset to the next within a block-sized stretch: a misplaced range shows.
func Pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// PutBlob stores data as blob name with metadata md, or fails the test.
func PutBlob(t testing.TB, s blobstore.Store, name string, data []byte, md map[string]string) {
	t.Helper()
	if _, err := s.Put(context.Background(), name, data, blobstore.PutOptions{Metadata: md}); err != nil {
		t.Fatalf("put %q: %v", name, err)
	}
}
