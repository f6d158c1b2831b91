package fusefs

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSpillPool: a spill file given back is emptied, kept under a pooled
// name, and handed out again under its own name; the pool is bounded; a
// new pool removes what a dead process pooled, and close removes the rest.
func TestSpillPool(t *testing.T) {
	dir := t.TempDir()
	p := newSpillPool(dir)
	f, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	name := f.Name()
	if _, err := f.WriteAt([]byte("acknowledged bytes"), 0); err != nil {
		t.Fatal(err)
	}
	p.put(f)
	if _, err := os.Stat(name); !os.IsNotExist(err) {
		t.Fatalf("a pooled file is still under its spill name: %v", err)
	}
	pooled := filepath.Join(dir, pooledPrefix+filepath.Base(name)[len(spillPrefix):])
	if st, err := os.Stat(pooled); err != nil || st.Size() != 0 {
		t.Fatalf("pooled file %s: %v, size %v; want it there and empty", pooled, err, st)
	}
	g, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	if g != f || g.Name() != name {
		t.Fatalf("got %s, want the pooled %s back", g.Name(), name)
	}
	if st, err := os.Stat(name); err != nil || st.Size() != 0 {
		t.Fatalf("reused file under %s: %v, size %v; want it there and empty", name, err, st)
	}

	// More files back than the pool holds: the rest are removed.
	files := []*os.File{g}
	for range maxPooledSpills + 3 {
		f, err := p.get()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	for _, f := range files {
		p.put(f)
	}
	if left := countFiles(t, dir); left != maxPooledSpills {
		t.Fatalf("%d files in the spill directory, want the %d pooled", left, maxPooledSpills)
	}

	// A process that died with its pool: the next one removes it.
	q := newSpillPool(dir)
	if left := countFiles(t, dir); left != 0 {
		t.Fatalf("%d files left after a new pool started, want 0", left)
	}
	f, err = q.get()
	if err != nil {
		t.Fatal(err)
	}
	q.put(f)
	q.close()
	if left := countFiles(t, dir); left != 0 {
		t.Fatalf("%d files left after close, want 0", left)
	}
}

func countFiles(t *testing.T, dir string) int {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestSpillPoolClearsRecord: a spill file given back to the pool keeps no
// record of the file it held, but its attribute is overwritten, not
// removed (clearSpillRecord says why): padded to the old record's length
// and naming the spill file. Read back, it is no record at all, so a
// process adopting the mount takes nothing from it, and orphan recovery
// removes such a file, emptied, without a word.
func TestSpillPoolClearsRecord(t *testing.T) {
	dir := t.TempDir()
	p := newSpillPool(dir)
	f, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	rec := spillRecord{Store: "s", Blob: "some/dir/a-file-with-a-long-name.txt", Dirty: true, IfNoneMatch: true, Nonce: newCommitNonce(), Attrs: map[string]string{"mode": "0644", "uid": "1000"}}
	b, _ := json.Marshal(rec)
	if err := unix.Fsetxattr(int(f.Fd()), spillRecordXattr, b, 0); err != nil {
		t.Skipf("the temporary directory keeps no extended attributes: %v", err)
	}
	if got, ok := readSpillRecord(f); !ok || got.Blob != rec.Blob {
		t.Fatalf("record before pooling = %+v (ok %v), want %+v", got, ok, rec)
	}
	f.WriteAt([]byte("acknowledged bytes"), 0)
	p.put(f)

	raw := make([]byte, 4096)
	n, err := unix.Fgetxattr(int(f.Fd()), spillRecordXattr, raw)
	if err != nil {
		t.Fatalf("the pooled file's attribute was removed (%v); want it overwritten", err)
	}
	var cleared spillRecord
	if err := json.Unmarshal(raw[:n], &cleared); err != nil || cleared.Dirty || cleared.Blob != "" || cleared.Attrs != nil || cleared.Pooled != filepath.Base(f.Name()) {
		t.Fatalf("pooled record %q (%v): want one that names no blob, holds nothing and names %s", raw[:n], err, filepath.Base(f.Name()))
	}
	if n < len(b) {
		t.Fatalf("pooled record is %d bytes, shorter than the %d it replaced", n, len(b))
	}
	if got, ok := readSpillRecord(f); ok {
		t.Fatalf("a pooled file's record reads as %+v; want none", got)
	}

	// Handed out again and left behind by a dead process before its
	// first record: nothing to save, removed.
	g, err := p.get()
	if err != nil || g != f {
		t.Fatalf("get = %v, %v; want the pooled file", g, err)
	}
	fs := &FS{opts: Options{StoreID: "s"}, log: slog.New(slog.DiscardHandler)}
	if out, err := fs.recoverOrphan(t.Context(), g.Name()); err != nil || out != orphanNothingToSave {
		t.Fatalf("recoverOrphan of a reused spill file = %v, %v; want nothing to save", out, err)
	}
	if _, err := os.Stat(g.Name()); !os.IsNotExist(err) {
		t.Fatalf("the reused spill file is still there: %v", err)
	}

	// Left by a process that died on its way to the pool, after the
	// record was cleared and before the data was emptied: its data was
	// committed or given up, so it is removed too, not kept.
	h, err := p.get()
	if err != nil {
		t.Fatal(err)
	}
	unix.Fsetxattr(int(h.Fd()), spillRecordXattr, b, 0)
	h.WriteAt([]byte("committed already"), 0)
	clearSpillRecord(h)
	if out, err := fs.recoverOrphan(t.Context(), h.Name()); err != nil || out != orphanNothingToSave {
		t.Fatalf("recoverOrphan of a cleared spill file holding data = %v, %v; want nothing to save", out, err)
	}
}
