package fusefs

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// toStatus maps an error from the store or the local disk to the errno the
// application sees. It is the only place that does so: go-fuse's own
// fuse.ToStatus does not unwrap %w chains.
func toStatus(err error) fuse.Status {
	var errno syscall.Errno
	switch {
	case err == nil:
		return fuse.OK
	case errors.As(err, new(commitConflict)):
		return fuse.Status(syscall.ESTALE)
	case errors.Is(err, blobstore.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fuse.ENOENT
	case errors.Is(err, blobstore.ErrAlreadyExists), errors.Is(err, fs.ErrExist):
		return fuse.Status(syscall.EEXIST)
	case errors.Is(err, blobstore.ErrPreconditionFailed):
		// Someone else changed the blob under an open file.
		return fuse.Status(syscall.ESTALE)
	case errors.Is(err, blobstore.ErrUnauthorized):
		return fuse.EACCES
	case errors.Is(err, blobstore.ErrInvalidName):
		return fuse.EINVAL
	case errors.Is(err, context.Canceled):
		return fuse.EINTR
	case errors.Is(err, blobstore.ErrTransient), errors.Is(err, blobstore.ErrThrottled):
		// A store that cannot be reached: EIO, as for a failing disk.
		// The errno inside (ECONNRESET, ECONNREFUSED) is the network's,
		// not the file's, and applications do not expect it from a file.
		return fuse.EIO
	case errors.As(err, &errno):
		return fuse.Status(errno)
	default:
		// Anything unknown: EIO, the errno of a failing device.
		return fuse.EIO
	}
}

// commitConflict is a commit that failed its condition (isConflict):
// another writer changed, created or deleted the blob since this file's
// writers saw it. It is ESTALE whatever the store answered, a failed
// If-Match or an If-None-Match that found a blob: the errno of close and
// fsync for it (FS.commit), and of a rename that commits the file first,
// where EEXIST would say something else (rename(2): a non-empty target
// directory).
type commitConflict struct{ err error }

func (c commitConflict) Error() string { return c.err.Error() }
func (c commitConflict) Unwrap() error { return c.err }
