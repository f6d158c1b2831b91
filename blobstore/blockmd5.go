package blobstore

import (
	"context"
	"crypto/md5"
	"unsafe"
)

// A block's Content-MD5, computed by the caller.
//
// Azure checks a Put Block against the Content-MD5 sent with it, and
// Azure.StageBlock computes it from the block. A caller that hashes the
// block anyway (blobfs hashes each block into the blob's MD5 as well) can
// compute both in one pass and hand the block's over with WithBlockMD5,
// through every wrapper, instead of having it computed again.

// BlockMD5Checker is implemented by a store that sends each block's
// Content-MD5 for the service to check: there, a caller's WithBlockMD5
// saves a hash of the block. Wrappers pass the question on (Unwrap).
type BlockMD5Checker interface {
	ChecksBlockMD5() bool
}

// ChecksBlockMD5 says whether StageBlock on s, or on the store s wraps,
// sends each block's Content-MD5: whether WithBlockMD5 is worth a hash.
func ChecksBlockMD5(s Store) bool {
	for s != nil {
		if c, ok := s.(BlockMD5Checker); ok {
			return c.ChecksBlockMD5()
		}
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			return false
		}
		s = u.Unwrap()
	}
	return false
}

type blockMD5Key struct{}

// blockMD5 is the MD5 of the block whose first byte is at data and that
// is n bytes long.
type blockMD5 struct {
	data *byte
	n    int
	sum  [md5.Size]byte
}

// WithBlockMD5 returns a context under which StageBlock of data, this very
// slice, sends sum as its Content-MD5 rather than computing it. sum must be
// the MD5 of data: a wrong one fails the upload (Azure refuses the block),
// it is never kept. A StageBlock of any other slice ignores it.
func WithBlockMD5(ctx context.Context, data []byte, sum [md5.Size]byte) context.Context {
	return context.WithValue(ctx, blockMD5Key{}, blockMD5{unsafe.SliceData(data), len(data), sum})
}

// BlockMD5 returns the MD5 of data given by WithBlockMD5, if it was: for
// a store that sends it, or a test that checks it.
func BlockMD5(ctx context.Context, data []byte) ([]byte, bool) {
	b, ok := ctx.Value(blockMD5Key{}).(blockMD5)
	if !ok || b.data != unsafe.SliceData(data) || b.n != len(data) {
		return nil, false
	}
	return b.sum[:], true
}
