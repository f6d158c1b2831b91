package fusefs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/journal"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// Exactly once across a restart.
//
// When the serving process dies, the kernel still waits for the answers to
// the requests that process had read. The adopting process sends
// FUSE_NOTIFY_RESEND and the kernel queues those requests again, with the
// same unique but bit 63 set. Most requests are harmless to run twice (a
// read, a lookup, a write of the same bytes at the same offset), but a
// namespace change is not: a MKDIR that the dead process completed would
// fail with EEXIST the second time, an UNLINK with ENOENT, although the
// application's call succeeded.
//
// So every namespace change (mkdir, mknod, symlink, create, unlink, rmdir,
// rename) journals an intent in the state region before it touches the
// store: the request's unique, opcode, directories and names. When the
// change is done, a completion record (the node id and handle the reply
// carries) is written in one batch with the table changes it goes with. A
// resent request whose unique matches an intent runs as usual, except where
// the first run explains what it finds: the name already there (mkdir,
// mknod, symlink), already gone (unlink, rmdir) or already moved (rename) is
// success, answered with a fresh entry. When the completion was journaled,
// the answer carries the very node id and handle the first reply would have
// (its lookup reference is already counted). A resent request with no
// intent (the dead process had not got that far) simply runs again.
//
// This layer does not see the reply being written, so an intent is not
// retired when its answer reaches the kernel: the last maxIntents are kept,
// oldest dropped first. Only a request whose answer was lost comes back, and
// each reader goroutine holds at most one such request, so a few hundred
// would do; a failed change is retired at once.
//
// File content has its own guard: openFile.commit writes a per-commit nonce
// into the blob's metadata (blobstore.MetaCommit), journaled before the
// upload, and treats a failed ETag condition on a blob carrying its own
// nonce as its own earlier commit (ownEarlierCommit).

// resendBit marks a request the kernel queued again after FUSE_NOTIFY_RESEND
// (FUSE_UNIQUE_RESEND).
const resendBit = 1 << 63

// opCreate is FUSE_CREATE: an unfinished create leaves a spill file that
// restore must not upload.
const opCreate = 35

// resentIntent returns the intent that a resent request h left in the
// state region, if it is one and the dead process got that far.
func (fs *FS) resentIntent(h *fuse.InHeader, parent, newParent uint64, name, newName string) (journal.Intent, bool) {
	if h.Unique&resendBit == 0 {
		return journal.Intent{}, false
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	it, ok := fs.intents.Get(h.Unique &^ resendBit)
	if !ok || it.Op != h.Opcode || it.Parent != parent || it.NewParent != newParent || it.Name != name || it.NewName != newName {
		// Not the same request: the kernel never reuses a unique on a
		// connection, so this would be a bug; run it as new.
		return journal.Intent{}, false
	}
	fs.log.Info("resent request of the previous process", "op", h.Opcode, "name", name, "completed", it.Done)
	return it, true
}

// beginIntent journals that request h is about to change the store and
// returns the unique that completes or drops the intent (0 when the mount
// keeps no state). A resent request keeps the intent its first run left.
func (fs *FS) beginIntent(h *fuse.InHeader, parent, newParent uint64, name, newName string) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.nodes.state == nil {
		return 0
	}
	unique := h.Unique &^ resendBit
	if _, ok := fs.intents.Get(unique); ok {
		return unique
	}
	it := journal.Intent{Unique: unique, Op: h.Opcode, Parent: parent, NewParent: newParent, Name: name, NewName: newName}
	fs.intents.Put(it)
	fs.nodes.state.Append(journal.IntentRecord(nil, it))
	return unique
}

// completeIntentLocked records that the change of unique is done and what
// its reply carries. Call it inside the batch of the table changes.
func (fs *FS) completeIntentLocked(unique, node, fh uint64) {
	if unique == 0 || fs.nodes.state == nil {
		return
	}
	fs.intents.Complete(unique, node, fh)
	fs.nodes.state.Append(journal.IntentDoneRecord(nil, journal.Intent{Unique: unique, Node: node, FH: fh}))
}

// dropIntent retires the intent of a change that failed: its error is the
// answer, and a resent copy may as well run again.
func (fs *FS) dropIntent(unique uint64) {
	if unique == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.intents.Drop(unique)
	if fs.nodes.state != nil {
		fs.nodes.state.Append(journal.IDRecord(nil, journal.RecIntentDrop, unique))
	}
}

// batchLocked runs fn, whose journal records are written at once.
func (fs *FS) batchLocked(fn func()) {
	if fs.nodes.state == nil {
		fn()
		return
	}
	fs.nodes.state.BeginBatch()
	defer fs.nodes.state.EndBatch()
	fn()
}

// answerResent answers a resent mkdir, mknod or symlink whose name the
// first run made: n is the node now bound to it. If the first run's
// completion was journaled, n's lookup reference for this reply is counted
// already.
func (fs *FS) answerResent(it journal.Intent, n *node, out *fuse.EntryOut) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if !it.Done || it.Node != n.id {
		fs.batchLocked(func() {
			fs.nodes.ref(n)
			fs.completeIntentLocked(it.Unique, n.id, 0)
		})
	}
	fs.fillEntry(n, out)
}

// unfinishedCreate tells whether the restored state holds a create of n
// that never completed: its reply never reached the kernel, so no
// application wrote through it.
func (fs *FS) unfinishedCreate(n *node) bool {
	return fs.intents.Any(func(it journal.Intent) bool {
		return it.Op == opCreate && !it.Done && it.Parent == n.parent && it.Name == n.name
	})
}

// crashPoint lets tests kill the serving process at a chosen point of a
// request (fs.crashHook is nil otherwise): where is "op/point/name".
func (fs *FS) crashPoint(op, point, name string) {
	if fs.crashHook != nil {
		fs.crashHook(op + "/" + point + "/" + name)
	}
}

// newCommitNonce names one commit of a file (blobstore.MetaCommit).
func newCommitNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ownEarlierCommit tells whether the blob at path was written by the
// commit named nonce, and returns its attributes: a commit whose ETag
// condition failed because its own earlier attempt (whose answer was lost)
// changed the blob.
func (of *openFile) ownEarlierCommit(ctx context.Context, path, nonce string) (blobstore.Attrs, bool) {
	if nonce == "" {
		return blobstore.Attrs{}, false
	}
	a, err := of.fs.store.Stat(ctx, path)
	if err != nil {
		return blobstore.Attrs{}, false
	}
	v, ok := meta.Value(a.Metadata, blobstore.MetaCommit)
	return a, ok && v == nonce
}

// putNew makes the blob path, which must not exist yet (If-None-Match: *),
// for a mkdir, mknod or symlink, with a commit nonce in its metadata: when
// the store made the blob but its answer was lost (a connection reset
// after the request was served) and the retry finds the blob there, the
// nonce tells that the blob is this very Put's, which then succeeds
// instead of answering EEXIST for the application's own work. md is the
// caller's own map, and gets the nonce.
func (fs *FS) putNew(ctx context.Context, path string, data []byte, md map[string]string) (blobstore.Attrs, error) {
	nonce := newCommitNonce()
	meta.Set(md, blobstore.MetaCommit, nonce)
	a, err := fs.store.Put(ctx, path, data, blobstore.PutOptions{Metadata: md, Conditions: blobstore.Conditions{IfNoneMatch: true}})
	if !errors.Is(err, blobstore.ErrAlreadyExists) {
		return a, err
	}
	found, serr := fs.store.Stat(ctx, path)
	if v, ok := meta.Value(found.Metadata, blobstore.MetaCommit); serr == nil && ok && v == nonce {
		fs.log.Debug("a retried create found its own blob (the first answer was lost)", "path", path)
		return found, nil
	}
	return a, err
}
