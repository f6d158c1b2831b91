package kernel

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// pinned is a Pinned that counts its releases.
type pinned struct {
	data     []byte
	released int
}

func (p *pinned) Data() []byte { return p.data }
func (p *pinned) Release()     { p.released++ }

// TestZeroCopyReadWithoutSlot: a READ answered into a buffer no session
// reader offers (go-fuse's own buffers, a test) is copied, and the pinned
// bytes are released once, when the reply is done.
func TestZeroCopyReadWithoutSlot(t *testing.T) {
	p := &pinned{data: []byte("hello, blocks")}
	r := ZeroCopyRead(p)
	if r.Size() != len(p.data) {
		t.Fatalf("Size %d, want %d", r.Size(), len(p.data))
	}
	dst := make([]byte, 64)
	n, _ := r.(*cachedRead).Readv([][]byte{dst})
	if n != len(p.data) || !bytes.Equal(dst[:n], p.data) {
		t.Fatalf("Readv copied %q, want %q", dst[:n], p.data)
	}
	if p.released != 0 {
		t.Fatal("released before the reply was done")
	}
	r.Done()
	if p.released != 1 {
		t.Fatalf("released %d times after Done, want 1", p.released)
	}
}

// TestZeroCopyReadHandedToSlot: into a session reader's reply buffer, the
// bytes are handed to its slot instead of copied, and the slot (not Done)
// releases them once written.
func TestZeroCopyReadHandedToSlot(t *testing.T) {
	out := make([]byte, replyPayloadOffset+64)
	slot := newReplySlot(out)
	defer slot.close()
	p := &pinned{data: []byte("from the block")}
	r := ZeroCopyRead(p)
	n, _ := r.(*cachedRead).Readv([][]byte{out[replyPayloadOffset:]})
	if n != len(p.data) || slot.pending == nil {
		t.Fatalf("Readv gave %d bytes, pending %v: want the range handed to the slot", n, slot.pending)
	}
	if bytes.Contains(out, p.data) {
		t.Fatal("the bytes were copied into the reply buffer")
	}
	r.Done()
	if p.released != 0 {
		t.Fatal("Done released a range the slot holds")
	}
	slot.close()
	if p.released != 1 {
		t.Fatalf("released %d times after the slot closed, want 1", p.released)
	}
}

// TestKernelOffers reads capability bits of a raw INIT request: flags in
// bits 0-31, flags2 in bits 32-63.
func TestKernelOffers(t *testing.T) {
	init := make([]byte, 40+64)
	binary.LittleEndian.PutUint32(init[40+12:], 1<<3)
	binary.LittleEndian.PutUint32(init[40+16:], 1<<(39-32))
	for _, c := range []struct {
		flag uint64
		want bool
	}{{1 << 3, true}, {1 << 4, false}, {1 << 39, true}, {1 << 40, false}} {
		if got := kernelOffers(init, c.flag); got != c.want {
			t.Errorf("kernelOffers(%#x) = %v, want %v", c.flag, got, c.want)
		}
	}
	if !kernelHasResend(init) {
		t.Error("kernelHasResend: bit 39 set, got false")
	}
	if kernelOffers(init[:50], 1<<3) || kernelHasResend(init[:50]) {
		t.Error("a short INIT request offers nothing")
	}
}
