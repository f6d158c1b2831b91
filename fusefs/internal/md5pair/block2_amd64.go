//go:build !purego

package md5pair

// block2 runs the MD5 compression function on s0 and on s1 over each
// whole 64-byte block of p (the rest is ignored).
//
//go:noescape
func block2(s0, s1 *[4]uint32, p []byte)
