package csi

import "sync"

// volumeLocks serializes operations on one volume without a global lock:
// a second operation on a busy volume fails at once (the RPC answers
// Aborted and the CO retries), as the CSI spec recommends, instead of
// queueing behind a mount that may take long.
type volumeLocks struct {
	mu   sync.Mutex
	busy map[string]struct{} // guarded by mu
}

func newVolumeLocks() *volumeLocks {
	return &volumeLocks{busy: map[string]struct{}{}}
}

// tryLock takes the lock of id; false when it is held.
func (l *volumeLocks) tryLock(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.busy[id]; ok {
		return false
	}
	l.busy[id] = struct{}{}
	return true
}

func (l *volumeLocks) unlock(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.busy, id)
}
