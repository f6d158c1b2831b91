//go:build !amd64 || purego

package md5pair

func block2(s0, s1 *[4]uint32, p0, p1 []byte) { block2Go(s0, s1, p0, p1) }
