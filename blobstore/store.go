// Package blobstore is blobfs's object-store client: one small interface over
// a flat namespace of named blobs in one container, with sentinel errors that
// callers test with errors.Is.
//
// Backends: Azure Blob Storage through the azblob SDK (also Azurite), a local
// directory (the embedded default), an in-memory fake, and wrappers that inject
// faults and latency or retry transient failures. Every backend passes the
// same conformance suite (conformance_test.go).
//
// The package knows nothing of FUSE, gRPC or Kubernetes. Names are blob names:
// "/"-separated, no leading "/". Directories exist only as name prefixes and
// as zero-length marker blobs carrying metadata hdi_isfolder=true (the layout
// blobfuse2 uses), which this package treats as ordinary blobs.
package blobstore

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors. Backends wrap them with %w so that the cause (status code,
// service error code) stays available for logs.
var (
	// ErrNotFound: the blob (or the container) does not exist.
	ErrNotFound = errors.New("blob not found")
	// ErrPreconditionFailed: an If-Match condition did not hold; another
	// writer changed the blob.
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrAlreadyExists: an If-None-Match:* condition did not hold.
	ErrAlreadyExists = errors.New("blob already exists")
	// ErrThrottled: the service asked us to slow down (HTTP 429/503).
	// Retryable.
	ErrThrottled = errors.New("throttled by the store")
	// ErrUnauthorized: credentials are missing, wrong or lack permission.
	ErrUnauthorized = errors.New("not authorized")
	// ErrTransient: a failure worth retrying (timeout, connection reset,
	// HTTP 5xx).
	ErrTransient = errors.New("transient store error")
	// ErrInvalidName: the name cannot be represented in this store.
	ErrInvalidName = errors.New("invalid blob name")
)

// Retryable reports whether err is worth another attempt.
func Retryable(err error) bool {
	return errors.Is(err, ErrThrottled) || errors.Is(err, ErrTransient)
}

// Metadata keys of the storage layout shared with blobfuse2.
const (
	MetaIsFolder  = "hdi_isfolder" // "true" on a directory marker blob
	MetaIsSymlink = "is_symlink"   // "true" on a symlink blob; content is the target
	// MetaMtime overrides Last-Modified as the file's modification time
	// (set by utimes/touch): decimal Unix nanoseconds.
	MetaMtime = "blobfs_mtime"
	// MetaCommit names the blobfs commit that wrote the blob (a random
	// nonce). A writer whose answer from the store was lost (a timeout, or
	// its process was killed) recognises its own commit by it when the
	// retry's ETag condition fails.
	MetaCommit = "blobfs_commit"

	// POSIX attributes (fusefs reads and writes them; a blob without them
	// shows the mount's defaults). Numbers are decimal, times Unix
	// nanoseconds.
	MetaMode  = "blobfs_mode"  // st_mode in octal, file type included ("100755")
	MetaUID   = "blobfs_uid"   // owner
	MetaGID   = "blobfs_gid"   // group
	MetaAtime = "blobfs_atime" // last access, when set explicitly
	MetaCtime = "blobfs_ctime" // last status change; absent: the content's time
	MetaRdev  = "blobfs_rdev"  // device number of a device node
	// MetaRcloneMtime is rclone's modification time (RFC 3339), read when
	// blobfs_mtime is absent so that containers written by rclone show
	// their times.
	MetaRcloneMtime = "mtime"
)

// Attrs describes one blob.
type Attrs struct {
	Name     string
	Size     int64
	ModTime  time.Time // Last-Modified
	ETag     string    // opaque; changes on every write
	Metadata map[string]string
	// ContentMD5 is the MD5 of the whole content the store keeps with
	// the blob (Azure's Content-MD5), or nil when it has none: Put
	// Blob stores one, Put Block List only when the writer sends it
	// (PutOptions.ContentMD5). Readers of the whole blob check it.
	ContentMD5 []byte
}

// ListOptions selects one page of a listing.
type ListOptions struct {
	Prefix     string // only names starting with Prefix
	Delimiter  string // "" lists recursively; "/" groups deeper names into Prefixes
	Marker     string // continuation token from the previous page's NextMarker
	MaxResults int    // page size; 0 means the backend's default (up to 5000)
}

// ListPage is one page of a listing, in lexical order of names.
type ListPage struct {
	Blobs      []Attrs  // blobs directly matched, with metadata
	Prefixes   []string // common prefixes, each ending with the delimiter
	NextMarker string   // "" when this is the last page
}

// Conditions make a write or delete conditional. The zero value is
// unconditional.
type Conditions struct {
	IfMatch     string // act only if the blob's current ETag is this
	IfNoneMatch bool   // act only if the blob does not exist (If-None-Match: *)
}

// PutOptions configure Put and CommitBlocks.
type PutOptions struct {
	Metadata map[string]string
	// ContentMD5, if set, is kept as the blob's Content-MD5 by
	// CommitBlocks: the MD5 of the whole content, which the service
	// cannot compute from the blocks. Put ignores it and keeps the MD5
	// of its body, as Azure does.
	ContentMD5 []byte
	Conditions
}

// Store is one container. Implementations are safe for concurrent use.
// Every method that does I/O takes a context first and honours its
// cancellation.
type Store interface {
	// Stat returns a blob's attributes and metadata.
	Stat(ctx context.Context, name string) (Attrs, error)
	// ReadAt reads len(p) bytes starting at off. It returns the number of
	// bytes read; fewer than len(p) only at the end of the blob, with
	// io.EOF. If etag is not empty and the blob has changed, it fails
	// with ErrPreconditionFailed.
	ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error)
	// List returns one page of names under opts.Prefix.
	List(ctx context.Context, opts ListOptions) (ListPage, error)
	// Put writes a whole blob in one request.
	Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error)
	// StageBlock uploads one uncommitted block of a blob. Block ids are
	// opaque strings of equal length within one blob.
	StageBlock(ctx context.Context, name, blockID string, data []byte) error
	// CommitBlocks makes the blob the concatenation of the blocks
	// listed, in order, and drops the blob's other uncommitted blocks.
	// An id names the block staged under it or, when none is, the block
	// of that id in the blob's committed block list (Azure's "Latest"),
	// so that a commit can keep the blocks of the last one without
	// sending them again. The committed block list is the one of the
	// last CommitBlocks, kept by SetMetadata; a Put leaves none. (Whether
	// a Copy's destination gets it differs between backends: do not rely
	// on it.) An id found nowhere fails the commit and leaves the blob as
	// it was.
	CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error)
	// Delete removes a blob.
	Delete(ctx context.Context, name string, cond Conditions) error
	// Copy copies src to dst on the server side, replacing dst, and returns
	// dst's new attributes. Metadata is copied too.
	Copy(ctx context.Context, dst, src string) (Attrs, error)
	// SetMetadata replaces a blob's metadata.
	SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error)
	// Check verifies that the container exists and the credentials can
	// read it: the pre-mount validation.
	Check(ctx context.Context) error
}
