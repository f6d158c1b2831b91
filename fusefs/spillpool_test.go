package fusefs

import (
	"os"
	"path/filepath"
	"testing"
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
