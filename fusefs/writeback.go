package fusefs

import (
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// Write-back (Options.WriteBack): close returns once a file's data is in
// its spill file; the upload starts when the file's last writer handle is
// released (a reader holding the file open does not hold it back) and runs
// in the background, in parallel across files (writeBackSlots at once).
// What makes it safe:
//   - fsync still waits for the store, as without write-back;
//   - the spill file and its journal record are what a successor process
//     restores (adopt.go retries a dirty file with no handle), so a crash
//     of the worker or the driver before the upload loses nothing, and a
//     handoff (Close without Sync) leaves the uploads to the successor
//     (abandonWriteBack); a crash of the machine loses what was not
//     fsync'd, as on a local disk whose page cache is lost;
//   - an upload that fails is retried with backoff, and data that can
//     never be uploaded is kept in lost+found, logged and counted
//     (Stats.KeptFiles), as at close without write-back; the application
//     that closed the file does not hear of it;
//   - what waits for upload is bounded (Options.WriteBackBytes, each file
//     counting at least writeBackMinCharge, until its upload ends, retries
//     included): over the bound, close uploads before it returns, as
//     without write-back, so writers wait.
//
// A commit is conditional as always: a concurrent writer's change since
// the open is not overwritten (the loser's data goes to lost+found).

// writeBackSlots bounds the background uploads running at once, each of
// which stages up to Options.UploadConcurrency blocks.
const writeBackSlots = 4

// writeBackMinCharge is what a file counts against Options.WriteBackBytes
// at least, so that many small (or empty) files are bounded too: 4096 files
// at the default bound.
const writeBackMinCharge = 1 << 20

func writeBackCharge(size int64) int64 { return max(size, writeBackMinCharge) }

// flushNow tells whether FLUSH (close) must upload h's file now: always
// without write-back; with it, only when the file would pass the bound of
// bytes waiting for upload. A file left for later is counted against the
// bound here (of.writeBackReserved), so that the next close sees it.
func (fs *FS) flushNow(h *handle) bool {
	if !fs.opts.WriteBack || !h.write || fs.ctx.Err() != nil {
		return true
	}
	of := h.of
	of.mu.Lock()
	defer of.mu.Unlock()
	if !of.dirty() || of.writeBackQueued {
		return false // nothing to upload, or its upload runs already
	}
	extra := writeBackCharge(of.size) - of.writeBackReserved
	for extra > 0 {
		pending := fs.writeBackPending.Load()
		if pending+extra > fs.opts.WriteBackBytes {
			return true
		}
		if fs.writeBackPending.CompareAndSwap(pending, pending+extra) {
			of.writeBackReserved += extra
			break
		}
	}
	return false
}

// writeBackLater uploads of, which is dirty, in the background, with a
// reference of its own (taken here, or handed over by the caller with
// handedRef) so that its data stays readable through the mount and the
// file is not dropped meanwhile. It is called when the last writer handle
// goes (a reader may keep the file open for days: the upload must not wait
// for it) and when the last reference goes. One upload per file at a time.
func (fs *FS) writeBackLater(of *openFile, handedRef bool) {
	of.mu.Lock()
	if of.writeBackQueued || !of.dirty() {
		// What a FLUSH reserved goes with the upload that runs, or is
		// not needed: the file was committed since (fsync, a close over
		// the bound).
		fs.writeBackPending.Add(-of.writeBackReserved)
		of.writeBackReserved = 0
		of.mu.Unlock()
		if handedRef {
			fs.releaseFile(of)
		}
		return
	}
	of.writeBackQueued = true
	charge := writeBackCharge(of.size)
	// The charge, less what the FLUSH reserved already.
	fs.writeBackPending.Add(charge - of.writeBackReserved)
	of.writeBackReserved = 0
	of.mu.Unlock()
	if !handedRef {
		fs.mu.Lock()
		of.refs++
		fs.mu.Unlock()
	}
	if !fs.startBackground() {
		// Closed meanwhile (a RELEASE arrives after close(2) returned):
		// the spill file stays for the successor, as at Close.
		fs.writeBackPending.Add(-charge)
		of.mu.Lock()
		of.writeBackQueued = false
		of.mu.Unlock()
		fs.releaseFile(of)
		return
	}
	go func() {
		defer fs.bg.Done()
		// The bytes stay counted while the upload is retried: during an
		// outage closes upload first (flushNow), instead of piling up.
		defer fs.writeBackPending.Add(-charge)
		defer func() {
			of.mu.Lock()
			of.writeBackQueued = false
			of.mu.Unlock()
		}()
		delay := time.Second
		for {
			select {
			case fs.writeBackSlots <- struct{}{}:
			case <-fs.ctx.Done():
				fs.abandonWriteBack(of)
				return
			}
			err := of.commit(fs.ctx)
			<-fs.writeBackSlots
			switch {
			case err == nil:
				fs.releaseFile(of)
				return
			case fs.ctx.Err() != nil:
				fs.abandonWriteBack(of)
				return
			case !blobstore.Retryable(err):
				fs.keepFailed(of, err)
				fs.releaseFile(of)
				return
			}
			fs.log.Warn("write-back upload failed; retrying", "err", err, "in", delay)
			select {
			case <-time.After(delay):
			case <-fs.ctx.Done():
				fs.abandonWriteBack(of)
				return
			}
			delay = min(2*delay, time.Minute)
		}
	}()
}

// abandonWriteBack lets go of a file whose upload had not ended when the
// filesystem closed without a Sync (a handoff to another process, which
// restores the file from the state region and uploads it; or a process
// without one, whose successor on the cache directory recovers the spill
// file, spillrecover.go). The spill file stays where it is.
func (fs *FS) abandonWriteBack(of *openFile) {
	fs.mu.Lock()
	of.refs--
	fs.mu.Unlock()
}
