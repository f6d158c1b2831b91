package fusefs

import (
	"bytes"
	"crypto/md5"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Through a read-write mount: a file read once is read again from the disk
// cache, through blobfs, never from the store; writes work as without it.
func TestDiskCacheThroughMount(t *testing.T) {
	const size = 40 << 20 // five read blocks, more than the memory cache holds
	data := pattern(size, 9)
	mem := blobstore.NewMemory()
	putBlob(t, mem, "big", data, nil)
	dc := openDiskCache(t, 1<<30)
	mnt, fsys := mountStore(t, mem, Options{DiskCache: dc, StoreID: "mem", BlockCacheBytes: 16 << 20})
	path := join(mnt, "big")

	readAll(t, path, data)
	first := fsys.Stats()
	if first.FetchedBytes < size {
		t.Fatalf("first read fetched %d bytes of %d", first.FetchedBytes, size)
	}
	readAll(t, path, data)
	s := fsys.Stats()
	if s.FetchedBytes != first.FetchedBytes {
		t.Errorf("read from the store again (%d bytes) with the file on disk", s.FetchedBytes-first.FetchedBytes)
	}
	if got := s.DiskReadBytes - first.DiskReadBytes; got < size/2 {
		t.Errorf("%d bytes read from disk; want most of the file (the rest from the memory cache)", got)
	}
	if s.PassthroughOpens != 0 {
		t.Errorf("%d passthrough opens on a read-write mount", s.PassthroughOpens)
	}

	// A write through the mount replaces the blob; reads see it, not the
	// cache file of the version before.
	w, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	update := []byte("written through the mount")
	if _, err := w.WriteAt(update, size/2); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	copy(data[size/2:], update)
	readAll(t, path, data)
}

// waitReleased waits until every handle closed so far is released: the
// kernel sends RELEASE after close returns, and until it arrives the
// handle counts against passthrough (its io mode, passthrough.go).
func waitReleased(t *testing.T, fsys *FS) {
	t.Helper()
	waitFor(t, "the closed handles released", func() bool {
		fsys.mu.Lock()
		defer fsys.mu.Unlock()
		for _, n := range fsys.nodes.byID {
			if n.io.cached > 0 {
				return false
			}
		}
		return true
	})
}

// readAll reads path whole and compares it with want, then drops its pages
// from the kernel's cache so that the next read reaches the filesystem.
func readAll(t *testing.T, path string, want []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, %v; equal %v", len(got), err, bytes.Equal(got, want))
	}
	unix_fadviseDontNeed(f)
}

// On a read-only mount, a file the disk cache holds whole is opened with
// FUSE passthrough: the kernel reads the cache file, blobfs sees no READ.
// Opens of one file in every order: none fails (the kernel answers EIO
// when a server mixes passthrough and other opens of an inode), and each
// reads what passthrough.go says.
func TestPassthroughReadOnlyMount(t *testing.T) {
	data := pattern(20<<20, 2)
	mem := blobstore.NewMemory()
	putBlob(t, mem, "f", data, nil)
	dc := openDiskCache(t, 1<<30)
	mnt, fsys := mountStore(t, mem, Options{DiskCache: dc, StoreID: "mem", ReadOnly: true})
	path := join(mnt, "f")
	readAll(t, path, data)
	waitReleased(t, fsys)
	first := fsys.Stats()
	if first.PassthroughOpens != 0 {
		t.Fatalf("%d passthrough opens before the file was on disk", first.PassthroughOpens)
	}

	r1, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	if got, err := io.ReadAll(r1); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("passthrough read: %d bytes, %v", len(got), err)
	}
	s := fsys.Stats()
	if s.PassthroughOpens != 1 {
		t.Fatalf("passthrough opens %d, want 1 (is FUSE passthrough available? kernel %s)", s.PassthroughOpens, kernelRelease())
	}
	if s.ReadBytes != first.ReadBytes || s.FetchedBytes != first.FetchedBytes {
		t.Errorf("a passthrough read went through blobfs: read %d -> %d, fetched %d -> %d",
			first.ReadBytes, s.ReadBytes, first.FetchedBytes, s.FetchedBytes)
	}
	// mmap of a passthrough file.
	m, err := syscall.Mmap(int(r1.Fd()), 0, len(data), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap of a passthrough file: %v", err)
	}
	if !bytes.Equal(m[:1<<20], data[:1<<20]) {
		t.Error("the mapping differs from the blob")
	}
	syscall.Munmap(m)

	// A second open of the same version joins r1's backing file.
	r2, err := os.Open(path)
	if err != nil {
		t.Fatalf("second open of a passthrough file: %v", err)
	}
	defer r2.Close()
	if s := fsys.Stats(); s.PassthroughOpens != 2 {
		t.Errorf("passthrough opens %d after a second open of one version, want 2", s.PassthroughOpens)
	}

	// The blob replaced by another client while r1 and r2 are open: new
	// opens read the new version once the attribute timeout has passed
	// (as without passthrough; the kernel's open fails with EIO when a
	// server mixes passthrough and other opens of one inode, so they
	// must get a new one), while r1 and r2 keep reading the old version
	// and their fstat gives its size: one version per handle.
	other := pattern(1<<20, 8)
	putBlob(t, mem, "f", other, nil)
	var opens int
	waitFor(t, "new opens read the replaced blob while passthrough handles of the old one are open", func() bool {
		opens++
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("open %d after the blob was replaced: %v", opens, err)
		}
		defer f.Close()
		got, err := io.ReadAll(f)
		if err != nil {
			t.Fatalf("read of open %d after the blob was replaced: %v", opens, err)
		}
		if !bytes.Equal(got, other) && !bytes.Equal(got, data) {
			t.Fatalf("open %d read %d bytes of neither version", opens, len(got))
		}
		unix_fadviseDontNeed(f)
		return bytes.Equal(got, other)
	})
	if st, err := os.Stat(path); err != nil || st.Size() != int64(len(other)) {
		t.Errorf("stat of the name after the new version was read: %v, size %d, want %d", err, st.Size(), len(other))
	}
	for i, h := range []*os.File{r1, r2} {
		if st, err := h.Stat(); err != nil || st.Size() != int64(len(data)) {
			t.Errorf("fstat of held handle %d: %v, size %d, want the old version's %d", i+1, err, st.Size(), len(data))
		}
		tail := make([]byte, 4096)
		off := int64(len(data) - len(tail))
		if _, err := h.ReadAt(tail, off); err != nil || !bytes.Equal(tail, data[off:]) {
			t.Errorf("held handle %d read the old version's tail: %v, equal %v", i+1, err, bytes.Equal(tail, data[off:]))
		}
	}
	r2.Close()
	r1.Close()
	// RELEASE follows the last close asynchronously.
	waitFor(t, "no handle counted once all are closed", func() bool {
		fsys.mu.Lock()
		defer fsys.mu.Unlock()
		for _, n := range fsys.nodes.byID {
			if n.io != (ioOpens{}) {
				t.Logf("node %s: io modes %+v", n.name, n.io)
				return false
			}
		}
		return true
	})
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return "?"
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// A file read at random is fetched whole into the disk cache in the
// background: later random reads need no GET, and on a read-only mount the
// next open is passthrough.
func TestRandomReadsFillDiskCache(t *testing.T) {
	const size = 32 << 20
	data := pattern(size, 4)
	mem := blobstore.NewMemory()
	putBlob(t, mem, "r", data, nil)
	dc := openDiskCache(t, 1<<30)
	mnt, fsys := mountStore(t, mem, Options{DiskCache: dc, StoreID: "mem", ReadOnly: true})
	f, err := os.Open(join(mnt, "r"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	pread := func(off int64) {
		t.Helper()
		if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+4096]) {
			t.Fatalf("pread at %d: %v", off, err)
		}
	}
	pread(size / 2) // the first read not at 0: random
	waitFor(t, "the file whole in the disk cache", func() bool {
		tier := cache.NewDiskTier(dc, "mem")
		if e := tier.Complete("r", fsys.nodeETag(t, "r"), size); e != nil {
			tier.Unpin(e)
			return true
		}
		return false
	})
	before := fsys.Stats()
	if before.FetchedBytes > size+2*cache.RandomChunk {
		t.Errorf("fetched %d bytes for a file of %d", before.FetchedBytes, size)
	}
	for off := int64(12345); off < size-4096; off += 3 << 20 {
		pread(off)
	}
	if s := fsys.Stats(); s.FetchedBytes != before.FetchedBytes {
		t.Errorf("random reads of a file whole on disk fetched %d bytes", s.FetchedBytes-before.FetchedBytes)
	}
	f.Close()
	waitReleased(t, fsys)
	// The fill checks what it completed before the kernel may read it.
	waitFor(t, "the filled file checked", func() bool { return fsys.Stats().ContentVerified == 1 })
	readAll(t, join(mnt, "r"), data)
	if s := fsys.Stats(); s.PassthroughOpens != 1 {
		t.Errorf("passthrough opens %d after the fill, want 1", s.PassthroughOpens)
	}
}

// Passthrough hands reads to the kernel, which blobfs never sees: so a
// file whole in the disk cache is opened with it only once its content was
// checked against the blob's Content-MD5. A fill that a random read started
// skips what that read put on disk first, so no in-order hash covers it;
// the fill checks the file it completed. A version that does not match is
// dropped from the disk and never passthrough: its reads fail with EIO.
func TestPassthroughOnlyChecked(t *testing.T) {
	const size = 16 << 20
	good, bad := pattern(size, 5), pattern(size, 6)
	wrongSum := md5.Sum(good)
	mem := blobstore.NewMemory()
	putBlob(t, mem, "good", good, nil)
	commitWithSum(t, mem, "bad", bad, 4<<20, wrongSum[:])
	dc := openDiskCache(t, 1<<30)
	mnt, fsys := mountStore(t, mem, Options{DiskCache: dc, StoreID: "mem", ReadOnly: true})

	fillByRandomRead := func(name string, data []byte) {
		t.Helper()
		f, err := os.Open(join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		// Beyond the first read block: random, not a stream.
		const off = size - 1<<20
		buf := make([]byte, 4096)
		if _, err := f.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+4096]) {
			t.Fatalf("%s: pread: %v", name, err)
		}
		f.Close()
		waitReleased(t, fsys)
	}

	fillByRandomRead("good", good)
	waitFor(t, "good checked after its fill", func() bool { return fsys.Stats().ContentVerified == 1 })
	readAll(t, join(mnt, "good"), good)
	if s := fsys.Stats(); s.PassthroughOpens != 1 {
		t.Fatalf("good: passthrough opens %d after the checked fill, want 1 (kernel %s)", s.PassthroughOpens, kernelRelease())
	}

	fillByRandomRead("bad", bad)
	waitFor(t, "bad found not to match after its fill", func() bool { return fsys.Stats().ContentMismatches == 1 })
	tier := cache.NewDiskTier(dc, "mem")
	if e := tier.Complete("bad", fsys.nodeETag(t, "bad"), size); e != nil {
		tier.Unpin(e)
		t.Error("bad: still whole in the disk cache after the mismatch")
	}
	if got, err := os.ReadFile(join(mnt, "bad")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("bad: read gave %d bytes and %v, want EIO", len(got), err)
	}
	if s := fsys.Stats(); s.PassthroughOpens != 1 {
		t.Errorf("passthrough opens %d, want still 1: bad must not be passthrough", s.PassthroughOpens)
	}
}

// nodeETag is the ETag the mount knows for the file at path.
func (fs *FS) nodeETag(t *testing.T, path string) string {
	t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, n := range fs.nodes.byID {
		if n.name == path && n.kind == meta.KindFile {
			return n.etag
		}
	}
	t.Fatalf("no node %s", path)
	return ""
}

// A passthrough handle outlives its server: it reads while no process
// serves the mount (the kernel reads the cache file), and the next server
// lets new opens join its backing file (any other open would fail with
// EIO) and closes the backing id once it is released.
func TestPassthroughAcrossServerKill(t *testing.T) {
	h := newRestartHarness(t, "BLOBFS_TEST_READONLY=1", "BLOBFS_TEST_DISK_CACHE="+t.TempDir())
	data := pattern(8<<20, 6)
	putBlob(t, h.localStore(), "data", data, nil)
	h.start()
	path := join(h.mnt, "data")
	readAll(t, path, data) // now whole in the disk cache
	// The first handle's RELEASE follows its close: until the server has
	// it, a new open is not passthrough (passthrough.go).
	waitFor(t, "the server to have the first handle's RELEASE", func() bool { return h.handles().Cached == 0 })
	r1, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.handles(); got.Passthrough != 1 {
		r1.Close()
		t.Fatalf("an open of a file whole in the disk cache: %+v, want one passthrough handle (kernel %s)", got, kernelRelease())
	}
	h.kill()
	// No server: only a passthrough handle can read now, and it must.
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, len(data))
		n, err := r1.ReadAt(buf, 0)
		if err == nil && !bytes.Equal(buf[:n], data) {
			err = io.ErrUnexpectedEOF
		}
		unix_fadviseDontNeed(r1)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read through the passthrough handle with no server: %v", err)
		}
	case <-time.After(time.Minute):
		h.start() // the read goes on
		<-done
		t.Fatal("the read through a passthrough handle waited for a server")
	}
	defer r1.Close()

	h.start()
	r2, err := os.Open(path)
	if err != nil {
		t.Fatalf("open after the restart, a passthrough handle of the previous server still open: %v", err)
	}
	head := make([]byte, 1<<20)
	if _, err := r2.ReadAt(head, 0); err != nil || !bytes.Equal(head, data[:len(head)]) {
		t.Fatalf("read through the joining handle: %v", err)
	}
	r2.Close()
	r1.Close()
	// Once both are released the inode has no backing file: opens work
	// whatever mode the new server chooses.
	for range 3 {
		readAll(t, path, data)
	}
}

// TestResentOpenGetsItsHandle: the serving process dies after it made and
// journaled a passthrough handle and before the OPEN's reply left. The
// kernel sends the OPEN again to the next server, which must answer with
// that handle: a new one would leave the journaled handle open forever (no
// RELEASE comes for it), and every later open of the file would join its
// backing file, serving the old content after the blob changed.
func TestResentOpenGetsItsHandle(t *testing.T) {
	h := newRestartHarness(t, "BLOBFS_TEST_READONLY=1", "BLOBFS_TEST_DISK_CACHE="+t.TempDir())
	old, next := pattern(4<<20, 1), pattern(4<<20, 2)
	putBlob(t, h.localStore(), "data", old, nil)
	path := join(h.mnt, "data")
	// The first open reads the file whole into the disk cache; the
	// second, once the first is released, is passthrough, and the server
	// dies before its reply.
	h.start("BLOBFS_TEST_CRASH=open/reply/data", "BLOBFS_TEST_CRASH_AFTER=1")
	readAll(t, path, old)
	waitFor(t, "the server to have the first open's RELEASE", func() bool { return h.handles().Cached == 0 })
	opened := make(chan *os.File, 1)
	go func() {
		f, err := os.Open(path)
		if err != nil {
			t.Error(err)
		}
		opened <- f
	}()
	h.waitExit()
	h.start()
	var f *os.File
	select {
	case f = <-opened:
	case <-time.After(time.Minute):
		t.Fatal("the open did not return after the restart")
	}
	if f == nil {
		t.FailNow()
	}
	buf := make([]byte, len(old))
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, old) {
		t.Fatalf("read through the resent open's handle: %v", err)
	}
	f.Close()

	// The blob changes; once every handle is released, an open sees it.
	// A handle of the dead server's that the resent open did not take
	// over is never released.
	waitFor(t, "every handle released, the journaled one included", func() bool {
		got := h.handles()
		return got.Cached == 0 && got.Passthrough == 0
	})
	putBlob(t, h.localStore(), "data", next, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(1100 * time.Millisecond) // attributes expire after 1 s
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(got, next) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("opens still read the old content: a handle of the dead server was left open on its backing file")
		}
	}
}

func openDiskCache(t *testing.T, capacity int64) *cache.DiskCache {
	t.Helper()
	c, err := cache.OpenDiskCache(t.TempDir(), capacity)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
