package journal

// maxIntents bounds the intents kept: the last maxIntents, oldest dropped
// first. Only a request whose answer was lost comes back, and each reader
// goroutine of the session holds at most one such request, so a few
// hundred would do.
const maxIntents = 1024

// Intent is a namespace change journaled before it touched the store.
type Intent struct {
	Unique    uint64 // the request's unique without the resend bit
	Op        uint32 // FUSE opcode
	Parent    uint64 // directory of name
	NewParent uint64 // rename: directory of newName
	Name      string
	NewName   string

	Done bool   // the change completed
	Node uint64 // the node id its reply carries (mkdir, mknod, symlink, create)
	FH   uint64 // create: the handle its reply carries
}

// IntentLog holds the intents, oldest first. Not safe for concurrent use:
// the file system guards it with FS.mu.
type IntentLog struct {
	byUnique map[uint64]*Intent
	order    []uint64 // may hold uniques already dropped
}

func NewIntentLog() *IntentLog { return &IntentLog{byUnique: map[uint64]*Intent{}} }

func (l *IntentLog) Get(unique uint64) (Intent, bool) {
	it, ok := l.byUnique[unique]
	if !ok {
		return Intent{}, false
	}
	return *it, true
}

func (l *IntentLog) Put(it Intent) {
	if _, ok := l.byUnique[it.Unique]; !ok {
		l.order = append(l.order, it.Unique)
	}
	l.byUnique[it.Unique] = &it
	for len(l.byUnique) > maxIntents {
		delete(l.byUnique, l.order[0])
		l.order = l.order[1:]
	}
	if len(l.order) > 4*maxIntents {
		live := l.order[:0]
		for _, u := range l.order {
			if _, ok := l.byUnique[u]; ok {
				live = append(live, u)
			}
		}
		l.order = live
	}
}

func (l *IntentLog) Complete(unique, node, fh uint64) {
	if it := l.byUnique[unique]; it != nil {
		it.Done, it.Node, it.FH = true, node, fh
	}
}

func (l *IntentLog) Drop(unique uint64) { delete(l.byUnique, unique) }

// Any tells whether an intent of the log satisfies match.
func (l *IntentLog) Any(match func(Intent) bool) bool {
	for _, it := range l.byUnique {
		if match(*it) {
			return true
		}
	}
	return false
}

// Records appends the log, oldest first, for a checkpoint.
func (l *IntentLog) Records(dst []byte) []byte {
	for _, u := range l.order {
		it, ok := l.byUnique[u]
		if !ok {
			continue
		}
		dst = IntentRecord(dst, *it)
		if it.Done {
			dst = IntentDoneRecord(dst, *it)
		}
	}
	return dst
}
