package upload

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// Uploader is what a mount's block streams share: the store, the mount's
// upload buffers and its count of bytes still to send.
type Uploader struct {
	Store blobstore.Store
	// BlockMD5: the store checks a Content-MD5 sent with each block
	// (blobstore.ChecksBlockMD5).
	BlockMD5 bool
	// BlockSize is a stream's first blocks' size (Options.UploadBlockSize).
	BlockSize int64
	// WriteBack: a WRITE that completes a block does not wait for a
	// buffer to stage it (the close uploads what was not staged).
	WriteBack bool
	Buffers   *memory.Uploads
	// Ctx ends with the mount: background stages stop.
	Ctx context.Context
	Log *slog.Logger
	// Uploading is the bytes still to upload: handed to the store and
	// not acknowledged, or still to be sent by a commit under way.
	Uploading atomic.Int64
}
