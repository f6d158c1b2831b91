package csi

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// TestPathStatusDeadFUSEMount: a FUSE mount whose server is gone reads as
// corrupted at once, even while the kernel still holds its root's
// attributes (stat of the root then succeeds without asking anyone).
func TestPathStatusDeadFUSEMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	ctx := context.Background()
	fsys, err := fusefs.New(blobstore.NewMemory(), fusefs.Options{CacheDir: t.TempDir(), AttrTimeout: time.Minute, EntryTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	if err := os.Mkdir(mnt, 0o750); err != nil {
		t.Fatal(err)
	}
	mp, err := openMountPoint(root, "mnt", mnt, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Unmount(mnt, unix.MNT_DETACH)
		fsys.Close()
	})
	if st := pathStatus(ctx, mp); st.State != PathMounted {
		t.Fatalf("live mount: %v, %v", st.State, st.Err)
	}
	// The server goes away without unmounting, as a killed driver's
	// does: its /dev/fuse fd is closed.
	sess.Stop()
	if err := sess.Wait(); err != nil {
		t.Fatal(err)
	}
	var attrs unix.Stat_t
	if err := unix.Stat(mnt, &attrs); err == nil {
		t.Log("stat of the dead mount's root succeeds from cached attributes")
	}
	if st := pathStatus(ctx, mp); st.State != PathCorrupted {
		t.Fatalf("dead mount: %v, %v; want corrupted", st.State, st.Err)
	}
}
