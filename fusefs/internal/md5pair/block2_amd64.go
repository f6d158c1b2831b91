//go:build !purego

package md5pair

// block2 runs the MD5 compression function on s0 over the whole 64-byte
// blocks of p0, and on s1 over as many blocks of p1 (which must have
// them).
//
//go:noescape
func block2(s0, s1 *[4]uint32, p0, p1 []byte)
