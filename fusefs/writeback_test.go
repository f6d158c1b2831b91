package fusefs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

func storeHas(t *testing.T, s blobstore.Store, name string, want []byte) bool {
	t.Helper()
	a, err := s.Stat(context.Background(), name)
	if err != nil || a.Size != int64(len(want)) {
		return false
	}
	got := make([]byte, len(want))
	n, err := s.ReadAt(context.Background(), name, got, 0, "")
	return (err == nil || n == len(want)) && bytes.Equal(got[:n], want)
}

// With write-back, close returns before the upload, which follows in the
// background; fsync still waits for the store; the data reads back
// through the mount meanwhile; over the bound, close uploads first.
func TestWriteBack(t *testing.T) {
	mem := blobstore.NewMemory()
	const latency = 300 * time.Millisecond
	slow := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	mnt, fsys := mountStore(t, slow, Options{WriteBack: true, WriteBackBytes: 8 << 20})
	slow.SetOptions(blobstore.FaultOptions{Latency: latency})

	data := pattern(3<<20, 1)
	start := time.Now()
	if err := os.WriteFile(join(mnt, "a"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if storeHas(t, mem, "a", data) {
		t.Fatal("the blob is in the store when close returns: close waited for the upload")
	}
	t.Logf("create, write 3 MiB and close: %v (a store call takes %v)", took, latency)
	if got, err := os.ReadFile(join(mnt, "a")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back before the upload: %v", err)
	}
	if s := fsys.Stats(); s.WriteBackBytes == 0 && !storeHas(t, mem, "a", data) {
		t.Error("no write-back bytes counted while the upload waits")
	}
	waitFor(t, "the background upload", func() bool { return storeHas(t, mem, "a", data) })

	// fsync waits for the store.
	f, err := os.Create(join(mnt, "b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if !storeHas(t, mem, "b", data) {
		t.Error("the blob is not in the store when fsync returns")
	}
	f.Close()

	// Over the bound (8 MiB): close uploads before it returns.
	big := pattern(12<<20, 2)
	if err := os.WriteFile(join(mnt, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if !storeHas(t, mem, "big", big) {
		t.Error("a file over the write-back bound is not in the store when close returns")
	}
	waitFor(t, "no write-back bytes left", func() bool { return fsys.Stats().WriteBackBytes == 0 })
}

// Many files closed at once are uploaded in the background, in parallel,
// and every one lands; Sync (before unmount) waits for those still going.
func TestWriteBackManyFiles(t *testing.T) {
	mem := blobstore.NewMemory()
	slow := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	mnt, fsys := mountStore(t, slow, Options{WriteBack: true})
	slow.SetOptions(blobstore.FaultOptions{Latency: 50 * time.Millisecond})
	const n = 40
	if err := os.Mkdir(join(mnt, "f"), 0o755); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return fmt.Sprintf("f/%02d", i) }
	start := time.Now()
	for i := range n {
		if err := os.WriteFile(join(mnt, name(i)), pattern(4096, byte(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d files written and closed in %v", n, time.Since(start))
	if err := fsys.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !storeHas(t, mem, name(i), pattern(4096, byte(i))) {
			t.Errorf("%s not in the store after Sync", name(i))
		}
	}
}

// An upload that can never succeed is retried, then kept in lost+found,
// and counted; the application's close did not fail.
func TestWriteBackFailureKept(t *testing.T) {
	mem := blobstore.NewMemory()
	faulty := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	cache := t.TempDir()
	mnt, fsys := mountStore(t, faulty, Options{WriteBack: true, CacheDir: cache})
	faulty.SetOptions(blobstore.FaultOptions{OpErrorRate: map[blobstore.Op]float64{blobstore.OpPut: 1}, Err: blobstore.ErrUnauthorized})
	data := pattern(5000, 3)
	if err := os.WriteFile(join(mnt, "denied"), data, 0o644); err != nil {
		t.Fatalf("close with write-back: %v", err)
	}
	waitFor(t, "the file kept in lost+found", func() bool { return fsys.Stats().KeptFiles == 1 })
	faulty.SetOptions(blobstore.FaultOptions{})
	found := false
	filepath.Walk(filepath.Join(cache, "lost+found"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Equal(b, data) {
				found = true
			}
		}
		return nil
	})
	if !found {
		t.Error("the data of the failed upload is not in lost+found")
	}
}

// The serving process is SIGKILLed while write-back uploads are pending:
// its successor finds the spill files in the state region and uploads
// them; nothing the application closed is lost.
func TestWriteBackServerKilled(t *testing.T) {
	h := newRestartHarness(t, "BLOBFS_TEST_WRITEBACK=1")
	h.start("BLOBFS_TEST_LATENCY=1s")
	files := map[string][]byte{}
	for i := range 3 {
		name := fmt.Sprintf("wb-%d", i)
		files[name] = pattern(1<<20+i, byte(i))
		if err := os.WriteFile(join(h.mnt, name), files[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.kill()
	store := h.localStore()
	pending := 0
	for name, data := range files {
		if !storeHas(t, store, name, data) {
			pending++
		}
	}
	if pending == 0 {
		t.Fatal("every upload ended before the kill: the test shows nothing")
	}
	h.start()
	waitFor(t, "every closed file in the store", func() bool {
		for name, data := range files {
			if !storeHas(t, store, name, data) {
				return false
			}
		}
		return true
	})
	t.Logf("%d of %d uploads were pending at the kill; all are in the store", pending, len(files))
}

// A reader holding the file open does not hold the upload back: it starts
// when the last writer goes.
func TestWriteBackWithReaderOpen(t *testing.T) {
	mem := blobstore.NewMemory()
	mnt, _ := mountStore(t, mem, Options{WriteBack: true})
	path := join(mnt, "log")
	if err := os.WriteFile(path, []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path) // as tail -f would
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := []byte("first\nsecond\n")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the upload while a reader holds the file", func() bool { return storeHas(t, mem, "log", data) })
}

// Many small files count at least writeBackMinCharge each: past the bound,
// closes upload before they return.
func TestWriteBackBoundCountsFiles(t *testing.T) {
	mem := blobstore.NewMemory()
	slow := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	mnt, _ := mountStore(t, slow, Options{WriteBack: true, WriteBackBytes: 2 * writeBackMinCharge})
	if err := os.Mkdir(join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	slow.SetOptions(blobstore.FaultOptions{Latency: 500 * time.Millisecond})
	const n = 6
	for i := range n {
		if err := os.WriteFile(join(mnt, fmt.Sprintf("d/%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := 0
	for i := range n {
		if storeHas(t, mem, fmt.Sprintf("d/%d", i), []byte("x")) {
			in++
		}
	}
	if in < n-2 {
		t.Errorf("%d of %d tiny files in the store after their closes; with room for 2 waiting, want at least %d", in, n, n-2)
	}
}

// A file left for later counts against the bound at its close, not at
// the RELEASE that follows it asynchronously (or, here, when its other
// writer handle goes): closes in a row each see the files before them.
func TestWriteBackBoundCountsAtClose(t *testing.T) {
	mem := blobstore.NewMemory()
	mnt, fsys := mountStore(t, mem, Options{WriteBack: true, WriteBackBytes: 2 * writeBackMinCharge})
	const n = 6
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	for i := range n {
		path := join(mnt, fmt.Sprintf("%d", i))
		w, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		// A second writer: the upload of a file left for later waits
		// for it, so no RELEASE counts the file before the next close.
		hold, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, hold)
		if _, err := w.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	in := 0
	for i := range n {
		if storeHas(t, mem, fmt.Sprintf("%d", i), []byte("x")) {
			in++
		}
	}
	if in != n-2 {
		t.Errorf("%d of %d files in the store after their closes; with room for 2 waiting, want %d", in, n, n-2)
	}
	for _, f := range held {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	held = nil
	waitFor(t, "every file in the store", func() bool {
		for i := range n {
			if !storeHas(t, mem, fmt.Sprintf("%d", i), []byte("x")) {
				return false
			}
		}
		return true
	})
	waitFor(t, "nothing counted against the bound", func() bool { return fsys.Stats().WriteBackBytes == 0 })
}

// Close without Sync (a handoff to another process) does not wait for
// write-back uploads, and does not move their data to lost+found: the
// spill file stays, and a successor on the cache directory uploads it.
func TestWriteBackAbandonedAtClose(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	mem := blobstore.NewMemory()
	slow := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
	cache := t.TempDir()
	fsys, err := New(slow, Options{WriteBack: true, CacheDir: cache, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	slow.SetOptions(blobstore.FaultOptions{Latency: 3 * time.Second})
	data := pattern(100_000, 5)
	f, err := os.Create(join(mnt, "late"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the upload under way", func() bool { return fsys.Stats().WriteBackBytes > 0 })
	start := time.Now()
	fsys.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v: it waited for the upload", d)
	}
	sess.Unmount(true)
	if storeHas(t, mem, "late", data) {
		t.Fatal("uploaded before Close returned: the test shows nothing")
	}
	if kept, _ := filepath.Glob(filepath.Join(cache, "lost+found", "*")); len(kept) != 0 {
		t.Errorf("abandoned upload moved to lost+found: %v", kept)
	}
	// The successor on the same cache directory uploads the spill file.
	slow.SetOptions(blobstore.FaultOptions{})
	next, err := New(slow, Options{CacheDir: cache, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	waitFor(t, "the successor's upload", func() bool { return storeHas(t, mem, "late", data) })
}
