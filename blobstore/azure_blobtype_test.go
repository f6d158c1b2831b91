package blobstore

import (
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
)

// An append or page blob's Content-MD5 is the one it was created with,
// not its content's: it must not be checked against what is read.
func TestBlockBlobMD5(t *testing.T) {
	sum := []byte("0123456789abcdef")
	for _, c := range []struct {
		typ  *blob.BlobType
		want bool
	}{
		{nil, true},
		{ptr(blob.BlobTypeBlockBlob), true},
		{ptr(blob.BlobTypeAppendBlob), false},
		{ptr(blob.BlobTypePageBlob), false},
	} {
		if got := blockBlobMD5(c.typ, sum); (got != nil) != c.want {
			t.Errorf("type %v: kept %v, want %v", c.typ, got != nil, c.want)
		}
	}
}
