// Package cache is the read side of a mount: where the bytes a READ
// returns come from when the file is not open for writing here.
//
//   - BlockCache: blocks of ReadBlockSize in memory, fetched on demand
//     and by read-ahead (a window per handle, a queue of fetch slots),
//     each READ answered from one pinned block without a copy when it
//     can (PinnedRange).
//   - ChunkCache: the 64 KiB pieces random reads fetch, so that a 4 KiB
//     read does not cost a block's GET.
//   - DiskCache and DiskTier: a directory of cache files under both, one
//     per blob version, filled by reads and by whole-file fills
//     (Sources.FillDisk) for files read at random, and handed to the
//     kernel for FUSE passthrough once whole and checked.
//   - Sources: where all three read, the disk cache then the store, with
//     every whole read checked against the blob's Content-MD5
//     (contentsum).
//
// It takes its memory from package memory and knows nothing of FUSE,
// nodes or handles: fusefs asks it for bytes by blob name, ETag and size.
package cache
