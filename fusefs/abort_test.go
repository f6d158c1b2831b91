package fusefs

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// hangingStatFs answers nothing to statfs: a request that waits forever,
// as one does whose server died after reading it.
type hangingStatFs struct {
	fuse.RawFileSystem
	asked chan struct{}
	never chan struct{}
}

func (h *hangingStatFs) StatFs(cancel <-chan struct{}, in *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	close(h.asked)
	<-h.never
	return fuse.OK
}

// TestAbortConnection: a request nobody will answer is ended by aborting
// the connection, found by the mount's device without asking the mount;
// the waiting caller gets an error, and the mount answers ENOTCONN after.
func TestAbortConnection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (fusectl)")
	}
	h := &hangingStatFs{RawFileSystem: fuse.NewDefaultRawFileSystem(), asked: make(chan struct{}), never: make(chan struct{})}
	mnt := t.TempDir()
	sess, err := kernel.Mount(mnt, h, kernel.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer kernel.Unmount(mnt, true)
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, mnt, unix.AT_STATX_DONT_SYNC, 0, &st); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var s unix.Statfs_t
		done <- unix.Statfs(mnt, &s)
	}()
	<-h.asked
	select {
	case err := <-done:
		t.Fatalf("statfs returned (%v) before the abort", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := kernel.AbortConnection(st.Dev_major, st.Dev_minor); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("statfs succeeded after the abort")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("statfs still waits 10 s after the connection was aborted")
	}
	var s unix.Statfs_t
	if err := unix.Statfs(mnt, &s); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("statfs of the aborted mount: %v, want ENOTCONN", err)
	}
	close(h.never) // the handler returns; its answer goes nowhere
	sess.Wait()
	if err := kernel.AbortConnection(1, 2); err == nil {
		t.Error("AbortConnection accepted a device that is not anonymous")
	}
}
