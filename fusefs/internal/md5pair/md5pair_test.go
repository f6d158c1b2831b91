package md5pair

import (
	"bytes"
	"crypto/md5"
	"fmt"
	"hash"
	"math/rand/v2"
	"testing"
)

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed)})
	r.Read(b)
	return b
}

// TestWrite: the part's MD5 and the running MD5 are crypto/md5's, for
// parts of every kind of length after prefixes of whole blocks and of
// parts of one, and the running hash goes on correctly after it.
func TestWrite(t *testing.T) {
	data := randomBytes(3<<20, 1)
	for _, before := range []int{0, 1, 63, 64, 100, 4096, 1<<20 + 5} {
		for _, size := range []int{0, 1, 63, 64, 65, 127, 128, 1000, 64 << 10, 1<<20 + 17} {
			t.Run(fmt.Sprintf("after%d/%d", before, size), func(t *testing.T) {
				h := md5.New()
				h.Write(data[:before])
				part := data[before : before+size]
				sum, ok := Write(h, part)
				if !ok {
					t.Fatal("Write refused a crypto/md5 hash")
				}
				if want := md5.Sum(part); sum != want {
					t.Fatalf("part's MD5 %x, want %x", sum, want)
				}
				if got, want := h.Sum(nil), md5.Sum(data[:before+size]); !bytes.Equal(got, want[:]) {
					t.Fatalf("running MD5 %x, want %x", got, want)
				}
				h.Write(data[before+size : before+size+100])
				if got, want := h.Sum(nil), md5.Sum(data[:before+size+100]); !bytes.Equal(got, want[:]) {
					t.Fatalf("running MD5 after more bytes %x, want %x", got, want)
				}
			})
		}
	}
}

// TestWriteRefuses: with a hash that is not crypto/md5's, Write does
// nothing and says so.
func TestWriteRefuses(t *testing.T) {
	var other hash.Hash = fnvLike{}
	if _, ok := Write(other, randomBytes(1000, 2)); ok {
		t.Fatal("Write took a hash that is not crypto/md5's")
	}
}

type fnvLike struct{ hash.Hash }

// TestBlock2MatchesGo: the assembly and the Go version agree, from any
// states, over many blocks, the two streams at different alignments.
func TestBlock2MatchesGo(t *testing.T) {
	data := randomBytes(64*1000+5, 3)
	s0, s1 := [4]uint32{1, 2, 3, 4}, [4]uint32{0xdeadbeef, 0, 0xffffffff, 7}
	g0, g1 := s0, s1
	// The second stream 7 bytes on, as after a short tail.
	block2(&s0, &s1, data[:64*999], data[7:])
	block2Go(&g0, &g1, data[:64*999], data[7:])
	if s0 != g0 || s1 != g1 {
		t.Fatalf("block2 %x %x, block2Go %x %x", s0, s1, g0, g1)
	}
}

var benchData = randomBytes(8<<20, 4)

// BenchmarkWrite: an 8 MiB block into a running MD5 and its own, in one
// pass; against BenchmarkCryptoTwice, the two with crypto/md5.
func BenchmarkWrite(b *testing.B) {
	h := md5.New()
	b.SetBytes(int64(len(benchData)))
	for b.Loop() {
		Write(h, benchData)
	}
}

func BenchmarkCryptoTwice(b *testing.B) {
	h := md5.New()
	b.SetBytes(int64(len(benchData)))
	for b.Loop() {
		h.Write(benchData)
		md5.Sum(benchData)
	}
}

// FuzzWrite: Write against crypto/md5 for any prefix, part and bytes
// after, a second Write in a row included.
func FuzzWrite(f *testing.F) {
	f.Add([]byte("abc"), uint16(0), uint16(3), uint16(5))
	f.Add(make([]byte, 300), uint16(64), uint16(200), uint16(7))
	f.Add([]byte("tail"), uint16(100), uint16(1000), uint16(130))
	f.Fuzz(func(t *testing.T, seed []byte, pre, size, after uint16) {
		data := make([]byte, int(pre)+int(size)+int(after))
		for i := range data {
			data[i] = byte(i*131 + i>>8)
			if len(seed) > 0 {
				data[i] ^= seed[i%len(seed)]
			}
		}
		part, rest := data[pre:int(pre)+int(size)], data[int(pre)+int(size):]
		h := md5.New()
		h.Write(data[:pre])
		sum, ok := Write(h, part)
		if !ok {
			t.Fatal("Write refused a crypto/md5 hash")
		}
		if want := md5.Sum(part); sum != want {
			t.Fatalf("part's MD5 %x, want %x (prefix %d, part %d)", sum, want, pre, size)
		}
		if sum2, ok := Write(h, rest); !ok || sum2 != md5.Sum(rest) {
			t.Fatalf("second Write: ok %v, MD5 %x, want %x", ok, sum2, md5.Sum(rest))
		}
		if got, want := h.Sum(nil), md5.Sum(data); !bytes.Equal(got, want[:]) {
			t.Fatalf("running MD5 %x, want %x (prefix %d, part %d, after %d)", got, want, pre, size, after)
		}
	})
}
