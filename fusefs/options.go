package fusefs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/blobfs/blobfs/fusefs/cache"
	"github.com/blobfs/blobfs/fusefs/listing"
)

// Options configure one mount. The zero value (with CacheDir set by New to a
// temporary directory) gives the defaults documented on each field.
type Options struct {
	// CacheDir holds spill files of files being written. It must be on a
	// local disk with room for the files open for writing at once.
	// Default: a fresh directory under os.TempDir().
	CacheDir string
	// StoreID names the store (container and endpoint, never a secret) in
	// the record every spill file carries, so that a cache directory used
	// with another store later never uploads one store's data into
	// another: such orphans go to lost+found. Empty: not recorded.
	StoreID string
	// ForceOwner shows UID and GID as every file's owner and group,
	// whatever a blob stores (`--uid`/`--gid` given explicitly), and
	// ForcePerm shows the Umask-derived modes. chown and chmod are then
	// refused (EPERM): they could not be seen.
	ForceOwner, ForcePerm bool
	// FileMode and DirMode are the permissions of files and directories
	// that store none (0: 0666 and 0777 minus Umask); with ForcePerm, of
	// every one.
	FileMode, DirMode uint32
	// RootMode is the permission bits (07777) of the root directory, the
	// container itself, which has no blob to store them in: a chmod of
	// the root lasts for the mount's life only. 0: DirMode like any
	// directory. The CSI driver sets it, with GID, to give a pod's
	// fsGroup the root with the set-group-ID bit, so that new entries
	// inherit the group (newAttrsLocked).
	RootMode uint32
	// NoAttrWrites never writes POSIX attributes to the store: what blobs
	// carry is still shown; chmod and chown are refused (EPERM); utimensat
	// sets a file's mtime only (as before attributes were kept) and is
	// accepted without effect on a directory (tar and rsync set them); new
	// entries get the mount's defaults.
	NoAttrWrites bool
	// BlockCacheBytes bounds the in-memory read block cache, read-ahead
	// included. Default 256 MiB.
	BlockCacheBytes int64
	// ReadBlockSize is the size of one ranged GET and one cache block.
	// Default 8 MiB: per-request costs of the service dominate below it
	// (measured on Azurite: the SDK itself reads 2-3x slower with 4 MiB
	// ranges than with 8 MiB).
	ReadBlockSize int64
	// MaxReadAheadBlocks is the number of read-ahead fetches in flight
	// across the mount. A sequential reader's window of blocks fetched or
	// queued ahead is twice that, at most three quarters of the cache, so
	// that a slot takes the next block as soon as it frees up. Default:
	// half of the cache, at most 32 blocks (16 blocks of 8 MiB in the
	// default 256 MiB: a store that gives 32 MiB/s per stream with 20 ms
	// latency needs 16 ranged GETs in flight to match a parallel
	// download). At most half of the cache.
	MaxReadAheadBlocks int
	// PrefetchFiles is how many small files (of at most one read block)
	// beyond the one being opened are fetched ahead when a directory's
	// files are opened for reading one after another in name order.
	// Default 16; negative disables it.
	PrefetchFiles int
	// WalkAhead is how many names a tree walk (fusefs/listing: find, du,
	// ls -R, a data loader's scan, answered from one flat listing of the
	// walked tree) may list ahead of its walker. Default
	// DefaultWalkAhead; negative disables tree walks.
	WalkAhead int
	// DirectReadMinBytes: a read-only open of a file at least this large
	// bypasses the kernel's page cache (FOPEN_DIRECT_IO). Reads are then
	// answered from the block cache straight into the reader's buffer:
	// no page-cache pages to fill, one copy less, and about twice the
	// throughput of a sequential read when CPU is the limit. The cost:
	// re-reads of such a file come from the block cache (one FUSE round
	// trip each) instead of the page cache, and the kernel no longer
	// reads ahead, so very small reads of a large file each cost a round
	// trip (blobfs's own read-ahead still keeps the data coming). Smaller
	// files, files open for writing and mmap keep the page cache. Used
	// only where the kernel supports FUSE_DIRECT_IO_ALLOW_MMAP (Linux
	// 6.6), so that shared mappings keep working. Default: ReadBlockSize;
	// negative: never.
	DirectReadMinBytes int64
	// UploadBlockSize is the size of one staged block (a file being
	// written streams its blocks after the first 10,000 at twice that,
	// blockGrowAfter). Default 4 MiB, as the SDK's and rclone's: with
	// the same requests in flight and half the bytes, 1 GiB went to
	// Azurite 1.07-1.17 times as fast as in 8 MiB blocks, and 256 MiB to
	// the fake store at 20 ms a request 1.26-1.30 times
	// (docs/benchmarks.md, "4 MiB blocks").
	UploadBlockSize int64
	// UploadConcurrency is the number of blocks staged in parallel per
	// file at a commit; files being written sequentially stream up to
	// twice as many blocks at once, over all files, each holding an
	// UploadBlockSize buffer (128 MiB at the defaults; twice that while
	// files past 10,000 blocks stream, blockGrowAfter). Default 16: a
	// single stream to the store is slow (tens of MB/s to Azure), and
	// the writer waits for a free slot once all are taken, so the slots
	// must cover the time one block takes to stage.
	UploadConcurrency int

	// AttrTimeout is how long the kernel and blobfs trust a file's
	// attributes. EntryTimeout is the same for a name->node binding,
	// NegativeTimeout for "no such name", ListTimeout for a directory
	// listing. Zero means the default: 1s, 1s, 1s and 1s. A negative
	// value disables that cache.
	AttrTimeout, EntryTimeout, NegativeTimeout, ListTimeout time.Duration

	ReadOnly bool
	// UID, GID own every file; Umask masks the default modes 0777/0666.
	UID, GID uint32
	Umask    uint32

	// Logger receives operational messages. Default: slog.Default().
	Logger *slog.Logger `json:"-"`

	// WriteBack: close returns once a file's data is in its spill file;
	// the upload runs in the background (writeback.go). fsync still waits
	// for the store. WriteBackBytes bounds the bytes of closed files
	// waiting for upload: over it, close uploads first. Default 4 GiB.
	WriteBack      bool
	WriteBackBytes int64
	// NoContentCheck turns off the check of whole reads against the
	// blob's Content-MD5 (fusefs/contentsum), which costs an MD5 pass over
	// what readers fetch from offset 0.
	NoContentCheck bool
	// DiskCache, if not nil, keeps what reads fetch on a local disk
	// (fusefs/cache), shared with every mount of the process given the
	// same one; files held whole are opened with FUSE passthrough where
	// the kernel offers it (passthrough.go). Keyed by StoreID, so mounts
	// of one store share files; with no StoreID, this mount's files are
	// its own. Nil: reads are cached in memory only.
	DiskCache *cache.DiskCache `json:"-"`

	// State is the state region (see NewState) that lets another process
	// adopt this mount. If it holds the state of a previous process, New
	// rebuilds the tables from it and AdoptInit returns the mount's INIT
	// request. Nil: the mount dies with its process.
	State *os.File `json:"-"`
}

// DefaultWriteBackBytes bounds the bytes waiting for a write-back upload
// when Options.WriteBackBytes is 0.
const DefaultWriteBackBytes = 4 << 30

// DefaultBlockCacheBytes is the read block cache's size when
// Options.BlockCacheBytes is 0.
const DefaultBlockCacheBytes = 256 << 20

// DefaultReadBlockSize is the size of one ranged read when
// Options.ReadBlockSize is 0.
const DefaultReadBlockSize = defaultReadBlockSize

// DefaultUploadBlockSize is the size of one staged block when
// Options.UploadBlockSize is 0.
const DefaultUploadBlockSize = defaultUploadBlockSize

const (
	defaultReadBlockSize     = 8 << 20
	defaultUploadBlockSize   = 4 << 20
	defaultUploadConcurrency = 16
	defaultPrefetchFiles     = 16
	defaultTimeout           = time.Second
)

// withDefaults returns a copy of o with every zero field set and the whole
// validated.
func (o Options) withDefaults() (Options, error) {
	if o.BlockCacheBytes == 0 {
		o.BlockCacheBytes = DefaultBlockCacheBytes
	}
	if o.ReadBlockSize == 0 {
		o.ReadBlockSize = defaultReadBlockSize
	}
	if o.UploadBlockSize == 0 {
		o.UploadBlockSize = defaultUploadBlockSize
	}
	if o.DirectReadMinBytes == 0 {
		o.DirectReadMinBytes = o.ReadBlockSize
	}
	if o.UploadConcurrency == 0 {
		o.UploadConcurrency = defaultUploadConcurrency
	}
	if o.PrefetchFiles == 0 {
		o.PrefetchFiles = defaultPrefetchFiles
	}
	if o.WalkAhead == 0 {
		o.WalkAhead = listing.DefaultWalkAhead
	}
	if o.WriteBackBytes == 0 {
		o.WriteBackBytes = DefaultWriteBackBytes
	}
	if o.WriteBackBytes < 0 {
		return o, fmt.Errorf("write-back bound %d: must not be negative", o.WriteBackBytes)
	}
	if o.ReadBlockSize < 64<<10 || o.ReadBlockSize > 256<<20 {
		return o, fmt.Errorf("read block size %d out of range [64 KiB, 256 MiB]", o.ReadBlockSize)
	}
	if o.UploadBlockSize < 64<<10 || o.UploadBlockSize > 4000<<20 {
		return o, fmt.Errorf("upload block size %d out of range [64 KiB, 4000 MiB]", o.UploadBlockSize)
	}
	if o.BlockCacheBytes < 2*o.ReadBlockSize {
		return o, fmt.Errorf("block cache of %d bytes must hold at least two read blocks of %d bytes", o.BlockCacheBytes, o.ReadBlockSize)
	}
	if o.UploadConcurrency < 1 || o.UploadConcurrency > 256 {
		return o, fmt.Errorf("upload concurrency %d out of range [1, 256]", o.UploadConcurrency)
	}
	blocks := int(o.BlockCacheBytes / o.ReadBlockSize)
	if o.MaxReadAheadBlocks == 0 {
		o.MaxReadAheadBlocks = min(max(blocks/2, 1), 32)
	}
	if o.MaxReadAheadBlocks < 0 || o.MaxReadAheadBlocks > blocks/2 {
		o.MaxReadAheadBlocks = max(blocks/2, 1)
	}
	for _, t := range []*time.Duration{&o.AttrTimeout, &o.EntryTimeout, &o.NegativeTimeout, &o.ListTimeout} {
		switch {
		case *t == 0:
			*t = defaultTimeout
		case *t < 0:
			*t = 0
		}
	}
	if o.Umask&^0o777 != 0 {
		return o, errors.New("umask must be within 0777")
	}
	if o.FileMode&^0o7777 != 0 || o.DirMode&^0o7777 != 0 || o.RootMode&^0o7777 != 0 {
		return o, errors.New("file, directory and root modes must be within 07777")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CacheDir == "" {
		dir, err := os.MkdirTemp("", "blobfs-cache-")
		if err != nil {
			return o, fmt.Errorf("cache directory: %w", err)
		}
		o.CacheDir = dir
	}
	if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return o, fmt.Errorf("cache directory: %w", err)
	}
	return o, nil
}
