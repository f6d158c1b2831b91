package fusefs

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
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
