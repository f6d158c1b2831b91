package fusefs

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// TestInodeNumberSurvivesForget: a file, directory, symlink or FIFO keeps
// its inode number when the kernel forgets its inode (drop_caches, as
// memory pressure does) and looks the name up again, also after a rename
// away and back (pjdfstest rename/10.t checks `lstat inode` so). Before,
// every lookup after a FORGET made a new node id: 4, then 7.
func TestInodeNumberSurvivesForget(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("drop_caches needs root")
	}
	storetest.Run(t, func(t *testing.T, s blobstore.Store) {
		mnt, fsys := mountStore(t, s, conflictMountOptions)
		mustWrite(t, join(mnt, "file"), []byte("x"))
		if err := os.Mkdir(join(mnt, "dir"), 0o755); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, join(mnt, "dir", "inner"), []byte("y"))
		if err := os.Symlink("file", join(mnt, "link")); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(join(mnt, "fifo"), syscall.S_IFIFO|0o644, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(join(mnt, "away"), 0o1777); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"file", "dir", "dir/inner", "link", "fifo"} {
			p, away := join(mnt, name), join(mnt, "away", "moved")
			want := lstat(t, p).Ino
			if err := os.Rename(p, away); err != nil {
				t.Fatal(err)
			}
			forgetAll(t, fsys, want)
			if got := lstat(t, away).Ino; got != want {
				t.Errorf("%s: inode %d after a rename and a forget, was %d", name, got, want)
			}
			if err := os.Rename(away, p); err != nil {
				t.Fatal(err)
			}
			forgetAll(t, fsys, want)
			if got := lstat(t, p).Ino; got != want {
				t.Errorf("%s: inode %d after a rename back and a forget, was %d", name, got, want)
			}
		}
	})
}

// forgetAll makes the kernel evict its unused dentries and inodes, and
// waits for the FORGET of node id: a test that saw no FORGET would prove
// nothing.
func forgetAll(t *testing.T, fsys *FS, id uint64) {
	t.Helper()
	forgotten := pollUntil(30*time.Second, func() bool {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
			t.Fatal(err)
		}
		fsys.mu.Lock()
		defer fsys.mu.Unlock()
		return fsys.nodes.get(id) == nil
	})
	if !forgotten {
		t.Fatalf("node %d still live 30s after drop_caches", id)
	}
}

// TestRememberedIDsAreBounded: the table gives a dropped name its id
// back, for the last rememberedIDs names dropped, and never an id that is
// live or of another kind.
func TestRememberedIDsAreBounded(t *testing.T) {
	tbl := newNodeTable()
	root := uint64(1)
	drop := func(name string) uint64 {
		n := tbl.bind(root, name, meta.KindFile)
		tbl.maybeDrop(n) // no lookups, no file: dropped at once
		if tbl.get(n.id) != nil {
			t.Fatalf("%s not dropped", name)
		}
		return n.id
	}
	first := drop("f0")
	if n := tbl.bind(root, "f0", meta.KindFile); n.id != first {
		t.Fatalf("f0 came back as %d, was %d", n.id, first)
	}
	// Consumed: a second node of the name while the first lives is the
	// same node; a node of another kind gets a new id.
	dirID := drop("d")
	if n := tbl.bind(root, "d", meta.KindDir); n.id == dirID {
		t.Fatalf("a directory took a file's remembered id %d", dirID)
	}
	ids := map[string]uint64{}
	for i := range rememberedIDs + 10 {
		name := fmt.Sprintf("g%d", i)
		ids[name] = drop(name)
	}
	if n := tbl.bind(root, "g0", meta.KindFile); n.id == ids["g0"] {
		t.Errorf("the oldest of %d dropped names kept its id", rememberedIDs+10)
	}
	last := fmt.Sprintf("g%d", rememberedIDs+9)
	if n := tbl.bind(root, last, meta.KindFile); n.id != ids[last] {
		t.Errorf("the newest dropped name got id %d, was %d", n.id, ids[last])
	}
	if len(tbl.remembered) > rememberedIDs || len(tbl.forgotten) > rememberedIDs {
		t.Errorf("%d remembered, %d in the ring: more than %d", len(tbl.remembered), len(tbl.forgotten), rememberedIDs)
	}
}
