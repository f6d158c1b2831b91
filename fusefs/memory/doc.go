// Package memory is the one place a blobfs process takes memory for file
// data: the block buffers (mapped outside the Go heap, pooled between
// mounts), the process-wide budget that the read caches of every mount
// share (SetBudget), and each mount's upload buffers (Uploads).
//
// It imports no other package of the project. The read caches register
// with it (Register) and give memory back when another mount needs it
// (ReadCache.Reclaim); the upload path borrows and returns buffers through
// Uploads.
package memory
