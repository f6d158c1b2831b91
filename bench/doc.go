// Package bench measures blobfs against the raw azblob SDK on the same
// backend, side by side in one run, and reports every figure as a ratio.
//
// Figures (Config.Figures selects them; see FigureIDs):
//
//   - seq-read, seq-write: one large file (1 GiB by default) read or
//     written through a `blobfs mount --foreground` subprocess over Azurite,
//     against the fastest of several SDK strategies (DownloadStream,
//     DownloadBuffer/DownloadFile, UploadBuffer/UploadStream with a few
//     block sizes and concurrencies) on the same Azurite.
//   - seq-write-own-cpu: seq-write with Azurite's threads on a CPU of
//     their own and the clients (this process, the mounts it starts) on
//     the others, as a store elsewhere is: on shared CPUs Azurite's one
//     JavaScript thread decides seq-write for both sides, here each meets
//     its own bound, the store's CPU or the client's (cpuSplit; needs
//     Azurite on this machine and 2 CPUs).
//   - seq-read-warm (informational): seq-read on one mount for every
//     repetition, after an untimed read, round a ring of blobs large
//     enough that none is in the block cache when read: the read without
//     the cost of a fresh process's memory.
//   - small-create, small-list, small-read: 1,000 files of 4 KiB created
//     until durable, listed cold with a stat of each (ls -l), and read,
//     against the SDK doing the same requests one after another.
//   - faulty-read, faulty-write: the same large-file transfers through an
//     in-process mount over blobstore.NewFaulty (latency and a per-stream
//     bandwidth cap over the in-memory store), against direct serial and
//     parallel transfers on the same fake that do blobfs's checksum work
//     (the MD5 of the whole set on upload, checked on a whole read): how
//     well blobfs uses parallelism where one stream is slow.
//   - fuse: sequential read through an in-process mount over
//     blobstore.NewMemory, in GB/s, against go-fuse's own fuse.Server
//     serving a file from memory: the cost of blobfs's FUSE path.
//   - memory: peak RSS (VmHWM) of a `blobfs mount --foreground` process
//     while a file (4 GiB by default) is streamed through it from a local
//     directory store, against its --block-cache-mb plus 64 MiB.
//
// Other FUSE clients (blobfuse2, rclone) found on PATH are measured in the
// same run on the Azurite figures.
//
// The restart benchmark (RunRestart, cmd/blobfs-restart-bench, make
// bench-restart) is separate: real `blobfs keeper` and `blobfs csi` node
// driver processes, driven over gRPC as kubelet drives them. It times a
// driver restarted after SIGKILL from its start until it serves 1, 10 and
// 100 mounts adopted from the keeper, against a fresh driver staging them
// all again, and the pause that a streaming reader sees across a SIGKILL +
// restart and a graceful handoff; see restart.go.
//
// # Method
//
// The machine is shared and noisy, so absolute numbers mean little. Each
// figure times blobfs and its baseline in the same run, interleaved
// repetition by repetition, keeps the best (shortest) time of each, and
// reports their ratio. Every "cold" measurement uses a fresh mount, and
// the page cache is dropped before each timed phase (Config.DropCaches;
// root only; it affects the whole machine). Data read back is compared
// with what was written, so a fast wrong answer fails the run.
//
// # Hazards
//
//   - The in-process mounts (fuse, faulty-*) are read by goroutines of this
//     process. That is safe only because fusefs disables FUSE poll and
//     reads are never issued from a FUSE reader goroutine; see
//     kernel.Session.
//   - Azurite with --inMemoryPersistence frees deleted blobs only in its
//     garbage collection pass, every 10 minutes. A full run uploads about
//     ten times Config.Size; use an Azurite of your own (AZURITE_PORT=...
//     .ci/azurite.sh start) rather than one that others test against.
//   - A run that is interrupted still unmounts what it mounted and deletes
//     its container, as long as Run's context is cancelled rather than the
//     process killed.
package bench
