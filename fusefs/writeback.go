package fusefs

import (
	"context"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// Write-back (Options.WriteBack): close returns once a file's data is in
// its spill file, and the upload runs afterwards, in the background, in
// parallel across files (writeBackSlots at once). What makes it safe:
//   - fsync still waits for the store, as without write-back;
//   - the spill file and its journal record are what a successor process
//     restores (adopt.go retries a dirty file with no handle), so a crash
//     of the worker or the driver before the upload loses nothing; a crash
//     of the machine loses what was not fsync'd, as on a local disk whose
//     page cache is lost;
//   - an upload that fails is retried with backoff (retryCommit), and data
//     that can never be uploaded is kept in lost+found, logged and counted
//     (Stats.KeptFiles), as at close without write-back; the application
//     that closed the file does not hear of it;
//   - the bytes waiting for upload are bounded (Options.WriteBackBytes):
//     over the bound, close uploads before it returns, as without
//     write-back, so writers wait.
//
// A commit is conditional as always: a concurrent writer's change since
// the open is not overwritten (the loser's data goes to lost+found).

// writeBackSlots bounds the background uploads running at once, each of
// which stages up to Options.UploadConcurrency blocks.
const writeBackSlots = 4

// flushNow tells whether FLUSH (close) must upload h's file now: always
// without write-back; with it, only when the file's dirty bytes would pass
// the bound of bytes waiting for upload.
func (fs *FS) flushNow(h *handle) bool {
	if !fs.opts.WriteBack || !h.write || fs.ctx.Err() != nil {
		return true
	}
	of := h.of
	of.mu.Lock()
	dirty, size := of.dirty(), of.size
	of.mu.Unlock()
	return dirty && fs.writeBackPending.Load()+size > fs.opts.WriteBackBytes
}

// writeBackLater uploads of, whose last handle is gone and which is dirty,
// in the background, holding a reference meanwhile so that its data stays
// readable through the mount and the file is not dropped.
func (fs *FS) writeBackLater(of *openFile) {
	of.mu.Lock()
	size := of.size
	of.mu.Unlock()
	fs.writeBackPending.Add(size)
	fs.mu.Lock()
	of.refs++
	fs.mu.Unlock()
	fs.bg.Add(1)
	go func() {
		defer fs.bg.Done()
		fs.writeBackSlots <- struct{}{}
		// Not fs.ctx: at Close the uploads waiting here still run to
		// their end before the process exits.
		ctx, cf := context.WithTimeout(context.Background(), 30*time.Minute)
		err := of.commit(ctx)
		cf()
		<-fs.writeBackSlots
		fs.writeBackPending.Add(-size)
		if err != nil {
			if blobstore.Retryable(err) {
				fs.log.Warn("write-back upload failed; retrying in the background", "err", err)
				fs.retryCommit(of)
			} else {
				fs.keepFailed(of, err)
			}
		}
		fs.releaseFile(of)
	}()
}
