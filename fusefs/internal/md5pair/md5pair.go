// Package md5pair hashes bytes into two MD5s in one pass: a running MD5 of
// a whole stream and the MD5 of one part of it. blobfs uploads a file as
// blocks, each sent with its own Content-MD5 (the service checks it), and
// commits the blob with the MD5 of the whole; hashing each block twice with
// crypto/md5 made MD5 two thirds of blobfs's CPU time in a sequential write.
//
// MD5 is one long chain of dependent steps, so one state leaves most of a
// CPU's execution units idle. Two states over the same bytes, their steps
// interleaved (block2_amd64.s, written by gen.go), run in about the time
// of one: 663-729 MB/s for both MD5s against 379-408 MB/s for crypto/md5
// twice on this project's machines (BenchmarkWrite, BenchmarkCryptoTwice). Other architectures get the
// same interleaving in Go (block2_go.go).
package md5pair

import (
	"crypto/md5"
	"encoding"
	"encoding/binary"
	"hash"
)

//go:generate go run gen.go

// initState is MD5's initial state (RFC 1321, 3.3).
var initState = [4]uint32{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476}

// The layout of crypto/md5's marshaled state (its AppendBinary): magic,
// the state's words big-endian, the buffered partial block padded to 64
// bytes, the length hashed, big-endian.
const (
	magic         = "md5\x01"
	marshaledSize = len(magic) + 4*4 + md5.BlockSize + 8
)

// Write hashes p into h, a running MD5 from crypto/md5, and returns the
// MD5 of p alone, reading p once. If h is not crypto/md5's, or its state
// is not laid out as expected, it returns false and has done nothing.
//
// Where h has hashed a whole number of 64-byte blocks, both states run
// over the same blocks of p. Otherwise (a stream carried on after a short
// tail) h's partial block is completed from p first, and then the two run
// over p at their two alignments.
func Write(h hash.Hash, p []byte) (sum [md5.Size]byte, ok bool) {
	m, ok1 := h.(encoding.BinaryMarshaler)
	u, ok2 := h.(encoding.BinaryUnmarshaler)
	if !ok1 || !ok2 {
		return sum, false
	}
	state, err := m.MarshalBinary()
	if err != nil || len(state) != marshaledSize || string(state[:len(magic)]) != magic {
		return sum, false
	}
	hashed := binary.BigEndian.Uint64(state[marshaledSize-8:])
	whole := words(state)
	skip := 0
	if r := int(hashed % md5.BlockSize); r != 0 {
		skip = md5.BlockSize - r
		if skip > len(p) { // p does not complete h's block: nothing to share
			h.Write(p)
			return md5.Sum(p), true
		}
		var first [md5.BlockSize]byte
		buffered := state[len(magic)+4*4:]
		copy(first[:], buffered[:r])
		copy(first[r:], p[:skip])
		var unused [4]uint32
		block2(&whole, &unused, first[:], first[:])
	}
	n := (len(p) - skip) &^ (md5.BlockSize - 1)
	part := initState
	block2(&whole, &part, p[skip:skip+n], p[:n])
	// Neither unmarshal is expected to fail, given the layout h itself
	// marshaled; if one did, h would be as it was.
	rest := md5.New()
	restU, ok3 := rest.(encoding.BinaryUnmarshaler)
	if !ok3 || restU.UnmarshalBinary(marshal(part, uint64(n))) != nil ||
		u.UnmarshalBinary(marshal(whole, hashed+uint64(skip+n))) != nil {
		return sum, false
	}
	h.Write(p[skip+n:])
	rest.Write(p[n:])
	rest.Sum(sum[:0])
	return sum, true
}

func words(state []byte) (w [4]uint32) {
	for i := range w {
		w[i] = binary.BigEndian.Uint32(state[len(magic)+4*i:])
	}
	return w
}

// marshal is crypto/md5's marshaled state after n bytes, n a multiple of
// 64 (nothing buffered).
func marshal(w [4]uint32, n uint64) []byte {
	b := make([]byte, 0, marshaledSize)
	b = append(b, magic...)
	for _, v := range w {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	b = append(b, make([]byte, md5.BlockSize)...)
	return binary.BigEndian.AppendUint64(b, n)
}
