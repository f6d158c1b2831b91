package fusefs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

func TestToStatus(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, tc := range []struct {
		name string
		err  error
		want fuse.Status
	}{
		{"ok", nil, fuse.OK},
		{"not found", fmt.Errorf("stat: %w", blobstore.ErrNotFound), fuse.ENOENT},
		{"changed by another writer", fmt.Errorf("commit: %w", blobstore.ErrPreconditionFailed), fuse.Status(syscall.ESTALE)},
		{"created by another writer since this mount created it", fmt.Errorf("rename: %w", commitConflict{fmt.Errorf("put: %w", blobstore.ErrAlreadyExists)}), fuse.Status(syscall.ESTALE)},
		{"name taken", fmt.Errorf("create: %w", blobstore.ErrAlreadyExists), fuse.Status(syscall.EEXIST)},
		{"denied", blobstore.ErrUnauthorized, fuse.EACCES},
		{"store unreachable", fmt.Errorf("list: %w (%w)", blobstore.ErrTransient, reset), fuse.EIO},
		{"throttled", fmt.Errorf("put: %w (%w)", blobstore.ErrThrottled, reset), fuse.EIO},
		{"spill disk full", &os.PathError{Op: "write", Path: "spill", Err: syscall.ENOSPC}, fuse.Status(syscall.ENOSPC)},
		{"caller gone", context.Canceled, fuse.EINTR},
		{"unknown", fmt.Errorf("something"), fuse.EIO},
	} {
		if got := toStatus(tc.err); got != tc.want {
			t.Errorf("%s: toStatus(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestTruncateTooLargeIsEFBIG: a truncate beyond the largest file the
// spill directory can hold is the caller's mistake: it fails with EFBIG,
// by path and through an open file, leaves the file as it was, and blobfs
// logs nothing at WARN or above for it.
func TestTruncateTooLargeIsEFBIG(t *testing.T) {
	const huge = math.MaxInt64 // the kernel's limit for FUSE: it passes it on
	cache := t.TempDir()
	probe, err := os.CreateTemp(cache, "probe")
	if err != nil {
		t.Fatal(err)
	}
	err = probe.Truncate(huge)
	probe.Close()
	os.Remove(probe.Name())
	if !errors.Is(err, syscall.EFBIG) {
		t.Skipf("the cache directory's filesystem takes a %d-byte file (%v): no EFBIG to test", int64(huge), err)
	}
	s := storetest.Memory(t)
	putBlob(t, s, "f", []byte("kept"), nil)
	log, logged := capturingLogger(t)
	mnt, _ := mountStore(t, s, Options{Logger: log, CacheDir: cache})

	wantErrno(t, os.Truncate(join(mnt, "f"), huge), syscall.EFBIG)
	f, err := os.OpenFile(join(mnt, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantErrno(t, f.Truncate(huge), syscall.EFBIG)
	// A write ending past the largest file the cache directory holds.
	_, err = f.WriteAt([]byte("x"), huge-1)
	wantErrno(t, err, syscall.EFBIG)
	if err := f.Close(); err != nil {
		t.Fatalf("close after a refused ftruncate: %v", err)
	}
	if b, err := os.ReadFile(join(mnt, "f")); err != nil || string(b) != "kept" {
		t.Errorf("f after refused truncates: %q, %v; want %q", b, err, "kept")
	}
	// The log line, if any, was written before the reply.
	for _, l := range strings.Split(logged.String(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			t.Errorf("logged for a truncate or write beyond the largest file: %s", l)
		}
	}
}

// TestMakeNameErrorOrder: the calls that make a name check, in order, the
// directory (an unknown node id: ESTALE, which makes the kernel look the
// name up again), the mount's writability, their own arguments, and the
// name.
func TestMakeNameErrorOrder(t *testing.T) {
	fs, err := New(blobstore.NewMemory(), Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	const unknown = 999
	var out fuse.EntryOut
	for _, c := range []struct {
		what string
		st   fuse.Status
		want fuse.Status
	}{
		{"mknod, unknown directory, bad mode", fs.Mknod(nil, &fuse.MknodIn{InHeader: fuse.InHeader{NodeId: unknown}, Mode: 0o170000}, "x", &out), fuse.Status(syscall.ESTALE)},
		{"mkdir, unknown directory", fs.Mkdir(nil, &fuse.MkdirIn{InHeader: fuse.InHeader{NodeId: unknown}}, "x", &out), fuse.Status(syscall.ESTALE)},
		{"symlink, unknown directory", fs.Symlink(nil, &fuse.InHeader{NodeId: unknown}, "t", "x", &out), fuse.Status(syscall.ESTALE)},
		{"mknod, bad mode, bad name", fs.Mknod(nil, &fuse.MknodIn{InHeader: fuse.InHeader{NodeId: 1}, Mode: 0o170000}, "bad.", &out), fuse.EINVAL},
		{"mknod, bad name", fs.Mknod(nil, &fuse.MknodIn{InHeader: fuse.InHeader{NodeId: 1}, Mode: syscall.S_IFREG}, "bad.", &out), fuse.EINVAL},
	} {
		if c.st != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.st, c.want)
		}
	}
}
