package fusefs

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// commitWithSum stores data as blob name in blocks of bs bytes, with the
// Content-MD5 sum: a writer that set a wrong one, or content that changed
// after it was hashed.
func commitWithSum(t *testing.T, s blobstore.Store, name string, data []byte, bs int, sum []byte) {
	t.Helper()
	ctx := t.Context()
	nonce := blobstore.NewBlockNonce()
	var ids []string
	for off := 0; off < len(data); off += bs {
		id := blobstore.BlockID(nonce, len(ids))
		if err := s.StageBlock(ctx, name, id, data[off:min(off+bs, len(data))]); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := s.CommitBlocks(ctx, name, ids, blobstore.PutOptions{ContentMD5: sum}); err != nil {
		t.Fatal(err)
	}
}

// Every file blobfs writes gets the MD5 of its whole content as its
// Content-MD5: a small file (one Put), a file streamed in blocks, and a
// file written out of order (uploaded whole from its spill file).
func TestContentMD5OfWrittenFiles(t *testing.T) {
	mem := blobstore.NewMemory()
	const bs = 1 << 20
	mnt, _ := mountStore(t, mem, Options{UploadBlockSize: bs})
	small := pattern(5000, 1)
	streamed := pattern(5*bs+1234, 2)
	scattered := pattern(3*bs+99, 3)
	mustWrite(t, join(mnt, "small"), small)
	mustWrite(t, join(mnt, "streamed"), streamed)

	f, err := os.Create(join(mnt, "scattered"))
	if err != nil {
		t.Fatal(err)
	}
	// The tail first, then the head: no block can be streamed.
	half := len(scattered) / 2
	if _, err := f.WriteAt(scattered[half:], int64(half)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(scattered[:half], 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"small": small, "streamed": streamed, "scattered": scattered} {
		a, err := mem.Stat(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if sum := md5.Sum(data); !bytes.Equal(a.ContentMD5, sum[:]) {
			t.Errorf("%s: Content-MD5 %x, want %x", name, a.ContentMD5, sum)
		}
	}
}

// A whole read is checked against the blob's Content-MD5, though its
// blocks are fetched in parallel and land out of order (a store whose
// requests take a random time). A mismatch fails the read of the last
// bytes and every later read of that version with EIO, and is counted; a
// blob that matches, or has no Content-MD5, reads as usual.
func TestContentMD5CheckedOnWholeReads(t *testing.T) {
	mem := blobstore.NewMemory()
	store := blobstore.NewFaulty(mem, blobstore.FaultOptions{Latency: time.Millisecond, Jitter: 20 * time.Millisecond})
	const block = 256 << 10
	good := pattern(20*block+777, 4)
	bad := pattern(20*block+777, 5)
	goodSum, wrongSum := md5.Sum(good), md5.Sum(append([]byte("x"), bad...))
	for i := range 3 {
		commitWithSum(t, mem, fmt.Sprintf("good%d", i), good, 3*block, goodSum[:])
	}
	commitWithSum(t, mem, "bad", bad, 3*block, wrongSum[:])
	commitWithSum(t, mem, "none", bad, 3*block, nil)
	commitWithSum(t, mem, "small-bad", bad[:3000], 3*block, wrongSum[:])
	mnt, fsys := mountStore(t, store, Options{ReadBlockSize: block, BlockCacheBytes: 64 * block})

	for i := range 3 {
		// A new blob each time, so that nothing is cached.
		name := fmt.Sprintf("good%d", i)
		before := fsys.Stats().ContentVerified
		if got := mustRead(t, join(mnt, name)); !bytes.Equal(got, good) {
			t.Fatal("good: content differs")
		}
		if v := fsys.Stats().ContentVerified; v != before+1 {
			t.Fatalf("good: verified whole reads %d -> %d, want one more", before, v)
		}
	}
	if got := mustRead(t, join(mnt, "none")); !bytes.Equal(got, bad) {
		t.Fatal("none: content differs")
	}

	for _, name := range []string{"bad", "small-bad"} {
		f, err := os.Open(join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		f.Close()
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("%s: whole read gave %d bytes and %v, want EIO", name, len(got), err)
		}
		// Again, from a new open: the kernel may keep the pages it
		// had, not the ones that failed.
		if got, err := os.ReadFile(join(mnt, name)); !errors.Is(err, syscall.EIO) {
			t.Fatalf("%s: second whole read gave %d bytes and %v, want EIO", name, len(got), err)
		}
	}
	if s := fsys.Stats(); s.ContentMismatches != 2 {
		t.Errorf("mismatches counted %d, want 2", s.ContentMismatches)
	}

	// Off, the same blob reads (as it did before blobfs checked).
	mnt2, fsys2 := mountStore(t, store, Options{ReadBlockSize: block, NoContentCheck: true})
	if got := mustRead(t, join(mnt2, "bad")); !bytes.Equal(got, bad) {
		t.Fatal("bad, unchecked: content differs")
	}
	if s := fsys2.Stats(); s.ContentVerified != 0 || s.ContentMismatches != 0 {
		t.Errorf("unchecked mount counted %+v", s)
	}
}

// A change to an existing blob loads its content first (an append, a
// write into the middle, a truncate that keeps some of it), and that
// download is checked against the blob's Content-MD5 like a whole read:
// a blob whose bytes do not match is not built on (EIO) and stays as it
// was in the store. The chunks land out of order (a store with jitter).
func TestContentMD5CheckedBeforeChange(t *testing.T) {
	mem := blobstore.NewMemory()
	store := blobstore.NewFaulty(mem, blobstore.FaultOptions{Latency: time.Millisecond, Jitter: 10 * time.Millisecond})
	const block = 256 << 10
	good := pattern(9*block+321, 6)
	bad := pattern(9*block+321, 7)
	goodSum, wrongSum := md5.Sum(good), md5.Sum(append([]byte("x"), bad...))
	commitWithSum(t, mem, "good", good, 2*block, goodSum[:])
	commitWithSum(t, mem, "bad-append", bad, 2*block, wrongSum[:])
	commitWithSum(t, mem, "bad-truncate", bad, 2*block, wrongSum[:])
	commitWithSum(t, mem, "none", bad, 2*block, nil)
	opts := Options{UploadBlockSize: block, ReadBlockSize: block}
	mnt, fsys := mountStore(t, store, opts)
	tail := []byte("appended")

	appendTo := func(mnt, name string) error {
		f, err := os.OpenFile(join(mnt, name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, werr := f.Write(tail)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		return werr
	}
	stored := func(name string) []byte { return blobContent(t, mem, name) }

	if err := appendTo(mnt, "good"); err != nil {
		t.Fatalf("good: append: %v", err)
	}
	if got := stored("good"); !bytes.Equal(got, append(slices.Clone(good), tail...)) {
		t.Fatal("good: stored content after the append differs")
	}
	if v := fsys.Stats().ContentVerified; v != 1 {
		t.Errorf("good: verified whole reads %d, want 1 (the download)", v)
	}
	if err := appendTo(mnt, "none"); err != nil {
		t.Fatalf("none: append: %v", err)
	}

	if err := appendTo(mnt, "bad-append"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("bad-append: append gave %v, want EIO", err)
	}
	if err := os.Truncate(join(mnt, "bad-truncate"), block); !errors.Is(err, syscall.EIO) {
		t.Fatalf("bad-truncate: truncate gave %v, want EIO", err)
	}
	for _, name := range []string{"bad-append", "bad-truncate"} {
		if got := stored(name); !bytes.Equal(got, bad) {
			t.Fatalf("%s: the store's content changed after a refused change", name)
		}
	}
	if s := fsys.Stats(); s.ContentMismatches != 2 {
		t.Errorf("mismatches counted %d, want 2", s.ContentMismatches)
	}
	// Known corrupt now: a second try fails at once, and so does a read.
	if err := appendTo(mnt, "bad-append"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("bad-append again: append gave %v, want EIO", err)
	}
	if got, err := os.ReadFile(join(mnt, "bad-append")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("bad-append: read after the refused change gave %d bytes and %v, want EIO", len(got), err)
	}

	// Unchecked, the change goes through, as before blobfs checked.
	opts.NoContentCheck = true
	mnt2, _ := mountStore(t, store, opts)
	if err := appendTo(mnt2, "bad-append"); err != nil {
		t.Fatalf("bad-append, unchecked: %v", err)
	}
	if got := stored("bad-append"); !bytes.Equal(got, append(slices.Clone(bad), tail...)) {
		t.Fatal("bad-append, unchecked: stored content differs")
	}
}

// BenchmarkWholeReadChecked reads a 256 MiB blob whole through a mount
// over the fake store of the faulty-read figure (20 ms a request, 32 MiB/s
// a stream), its Content-MD5 checked: into a buffer, and by an application
// that hashes what it reads as it goes (sha256sum). The check's hash runs
// beside the application's work, not in front of its reads. A new blob
// each iteration, so that nothing is cached.
func BenchmarkWholeReadChecked(b *testing.B) {
	const size = 256 << 20
	data := pattern(size, 3)
	sum := md5.Sum(data)
	for _, app := range []struct {
		name    string
		consume func([]byte)
	}{
		{"read", func([]byte) {}},
		{"sha256", func() func([]byte) {
			h := sha256.New()
			return func(p []byte) { h.Write(p) }
		}()},
	} {
		b.Run(app.name, func(b *testing.B) {
			mem := blobstore.NewMemory()
			store := blobstore.NewFaulty(mem, blobstore.FaultOptions{Seed: 1, Latency: 20 * time.Millisecond, Bandwidth: 32 << 20})
			mnt, fsys := mountStore(b, store, Options{})
			buf := make([]byte, 1<<20)
			b.SetBytes(size)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				name := fmt.Sprintf("f%d", i)
				if _, err := mem.Put(b.Context(), name, data, blobstore.PutOptions{ContentMD5: sum[:]}); err != nil {
					b.Fatal(err)
				}
				f, err := os.Open(join(mnt, name))
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				for {
					n, err := f.Read(buf)
					app.consume(buf[:n])
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				f.Close()
				if err := mem.Delete(b.Context(), name, blobstore.Conditions{}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if v := fsys.Stats().ContentVerified; v != int64(b.N) {
				b.Fatalf("%d whole reads verified, want %d", v, b.N)
			}
		})
	}
}
