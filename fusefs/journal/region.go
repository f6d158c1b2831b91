package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// The state region lets a new process take over a live mount: everything the
// kernel may still refer to after the serving process dies — node ids, file
// handles, the spill files behind handles, the INIT request — is journaled
// into it before the reply that hands it to the kernel. The region is a memfd
// (memory, no disk) that a keeper process holds beside the /dev/fuse fd; the
// adopting process replays it into fresh tables.
//
// Layout: a 4 KiB header, then a log of records from start to end. The
// header holds the magic, the INIT request, and the log bounds. A record is
// appended with one pwrite, then the header's end is updated with another;
// a process killed in between loses only the unacknowledged record (its
// reply was never sent). When the log has grown well past the live state, a
// checkpoint appends the whole table as fresh records, moves start to them,
// and punches the old part out of memory: offsets grow, memory does not.
//
// Locking: none here. The file system writes the region under the lock
// that guards the tables it mirrors (FS.mu).

const (
	stateMagic      = "blobfs-state-v1\x00"
	stateHeaderSize = 4096
	// header fields
	offStart   = 16
	offEnd     = 24
	offInitLen = 32
	offInit    = 40
	maxInitLen = stateHeaderSize - offInit
)

// Record types.
const (
	recNode       byte = 1 // a node's binding and lookup count
	RecNodeDrop   byte = 2 // a node the kernel forgot
	recHandle     byte = 3 // an open handle
	RecHandleDrop byte = 4 // a released handle
	recFile       byte = 5 // a node's spill file and upload state
	recIDs        byte = 6 // ids reserved: never hand out ids below these again
	recCheckpoint byte = 7 // the records after it are a whole table
	recIntent     byte = 8 // a namespace change about to touch the store
	recIntentDone byte = 9 // that change completed: what its reply carries
	RecIntentDrop byte = 10
	// A spill file about to be removed: journaled before the removal, so
	// that a successor finishes it if the process dies in between.
	recSpillRemoved byte = 11
)

type Region struct {
	f          *os.File
	start, end int64
	liveBytes  int64 // bytes of the last checkpoint, to decide the next
	err        error // first write error: the region is no longer trusted
	// batching > 0 collects appends in pending, written with one pwrite
	// when the outermost batch ends: a process killed meanwhile leaves
	// all of them or none.
	batching int
	pending  []byte
}

// NewRegion creates an empty region in a new memfd.
func NewRegion() (*Region, error) {
	fd, err := unix.MemfdCreate("blobfs-state", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "blobfs-state")
	r := &Region{f: f, start: stateHeaderSize, end: stateHeaderSize}
	hdr := make([]byte, stateHeaderSize)
	copy(hdr, stateMagic)
	binary.LittleEndian.PutUint64(hdr[offStart:], uint64(r.start))
	binary.LittleEndian.PutUint64(hdr[offEnd:], uint64(r.end))
	if _, err := f.WriteAt(hdr, 0); err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// File returns the region's file, to hand to a keeper.
func (r *Region) File() *os.File { return r.f }

func (r *Region) SetInit(init []byte) error {
	if len(init) > maxInitLen {
		return fmt.Errorf("INIT request of %d bytes does not fit the state header", len(init))
	}
	b := make([]byte, 8+len(init))
	binary.LittleEndian.PutUint64(b, uint64(len(init)))
	copy(b[8:], init)
	_, err := r.f.WriteAt(b, offInitLen)
	return err
}

// recordWriter builds one record.
type recordWriter struct{ b []byte }

func (w *recordWriter) u8(v byte)    { w.b = append(w.b, v) }
func (w *recordWriter) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *recordWriter) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *recordWriter) str(s string) { w.u32(uint32(len(s))); w.b = append(w.b, s...) }

// Append writes records (each already framed) and then moves the end.
func (r *Region) Append(records []byte) {
	if r.err != nil || len(records) == 0 {
		return
	}
	if r.batching > 0 {
		r.pending = append(r.pending, records...)
		return
	}
	if _, err := r.f.WriteAt(records, r.end); err != nil {
		r.err = err
		return
	}
	r.end += int64(len(records))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(r.end))
	if _, err := r.f.WriteAt(b[:], offEnd); err != nil {
		r.err = err
	}
}

// BeginBatch starts collecting appends; endBatch writes them at once.
// Batches nest.
func (r *Region) BeginBatch() { r.batching++ }

func (r *Region) EndBatch() {
	r.batching--
	if r.batching == 0 {
		records := r.pending
		r.pending = nil
		r.Append(records)
	}
}

// frame prefixes a record body with its length and type.
func frame(dst []byte, typ byte, body []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(body)+1))
	dst = append(dst, typ)
	return append(dst, body...)
}

// Checkpoint replaces the log by the records in snapshot: they are appended,
// start moves to them, and the memory of what came before is released.
func (r *Region) Checkpoint(snapshot []byte) {
	if r.err != nil {
		return
	}
	at := r.end
	r.Append(frame(nil, recCheckpoint, nil))
	r.Append(snapshot)
	if r.err != nil {
		return
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(at))
	if _, err := r.f.WriteAt(b[:], offStart); err != nil {
		r.err = err
		return
	}
	old := r.start
	r.start = at
	r.liveBytes = r.end - at
	// Page-align the hole; the rest is reclaimed next time.
	lo := (old + 4095) &^ 4095
	hi := at &^ 4095
	if hi > lo {
		unix.Fallocate(int(r.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, lo, hi-lo)
	}
}

// NeedsCheckpoint tells when the log has grown past four times the live
// state (and past 1 MiB, so small mounts do not checkpoint constantly).
func (r *Region) NeedsCheckpoint() bool {
	if r.batching > 0 {
		return false // the checkpoint moves start at once; wait for the batch
	}
	size := r.end - r.start
	return size > 1<<20 && size > 4*r.liveBytes
}

// --- reading -------------------------------------------------------------

// SavedNode and savedFile are what a region says about the tables.
type SavedNode struct {
	ID, Parent, Lookups uint64
	Kind                byte // the file system's node kind
	Name                string
}

type SavedHandle struct {
	FH, Node uint64
	Write    bool
	Dir      bool
	// IO is the handle's IO mode, backingID its backing file's id when
	// passthrough (fusefs/passthrough.go). Records written before IO modes
	// existed say ioCached, the mode that blocks passthrough.
	IO        IOMode
	BackingID int32
	Opened    OpenReply
}

type SavedFile struct {
	Node      uint64
	SpillPath string
	BaseETag  string
	Dirty     bool
	Exclusive bool
	// CommitNonce names a commit that may have reached the store without
	// its answer reaching the dead process.
	CommitNonce string
	// SeenSum and SeenSize are the content the file's condition stands
	// for (its Content-MD5; zero: not known): a commit whose condition
	// fails because only the blob's metadata changed (another client's
	// chmod) goes on over it, in a successor as in the process that
	// opened the file. Added after the first release: regions written
	// before lack it, and readers before it ignore it (it comes last).
	SeenSum  [16]byte
	SeenSize int64
}

type Saved struct {
	Init    []byte
	Nodes   map[uint64]SavedNode
	Handles map[uint64]SavedHandle
	Files   map[uint64]SavedFile
	Intents *IntentLog
	// RemovedSpills are spill files whose removal was journaled since the
	// last checkpoint; some may still exist.
	RemovedSpills []string
	NextID        uint64
	NextHandle    uint64
}

// ReadRegion replays a region left by another process.
func ReadRegion(f *os.File) (*Region, *Saved, error) {
	hdr := make([]byte, stateHeaderSize)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, nil, fmt.Errorf("state header: %w", err)
	}
	if string(hdr[:len(stateMagic)]) != stateMagic {
		return nil, nil, errors.New("not a blobfs state region")
	}
	start := int64(binary.LittleEndian.Uint64(hdr[offStart:]))
	end := int64(binary.LittleEndian.Uint64(hdr[offEnd:]))
	initLen := binary.LittleEndian.Uint64(hdr[offInitLen:])
	if start < stateHeaderSize || end < start || initLen > maxInitLen {
		return nil, nil, errors.New("corrupt state header")
	}
	st := &Saved{
		Init:    append([]byte(nil), hdr[offInit:offInit+int(initLen)]...),
		Nodes:   map[uint64]SavedNode{},
		Handles: map[uint64]SavedHandle{},
		Files:   map[uint64]SavedFile{},
		Intents: NewIntentLog(),
	}
	log := make([]byte, end-start)
	if _, err := f.ReadAt(log, start); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("state log: %w", err)
	}
	for len(log) > 0 {
		if len(log) < 5 {
			return nil, nil, errors.New("truncated state record")
		}
		n := int(binary.LittleEndian.Uint32(log))
		if n < 1 || 4+n > len(log) {
			return nil, nil, errors.New("corrupt state record length")
		}
		if err := st.apply(log[4], log[5:4+n]); err != nil {
			return nil, nil, err
		}
		log = log[4+n:]
	}
	r := &Region{f: f, start: start, end: end, liveBytes: end - start}
	return r, st, nil
}

type recordReader struct {
	b   []byte
	err error
}

func (r *recordReader) u8() byte {
	if len(r.b) < 1 {
		r.err = io.ErrUnexpectedEOF
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *recordReader) u32() uint32 {
	if len(r.b) < 4 {
		r.err = io.ErrUnexpectedEOF
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *recordReader) u64() uint64 {
	if len(r.b) < 8 {
		r.err = io.ErrUnexpectedEOF
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *recordReader) str() string {
	n := int(r.u32())
	if r.err != nil || len(r.b) < n {
		r.err = io.ErrUnexpectedEOF
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (st *Saved) apply(typ byte, body []byte) error {
	r := &recordReader{b: body}
	switch typ {
	case recCheckpoint:
		clear(st.Nodes)
		clear(st.Handles)
		clear(st.Files)
		st.Intents = NewIntentLog()
		st.RemovedSpills = nil
	case recNode:
		n := SavedNode{ID: r.u64(), Parent: r.u64(), Lookups: r.u64(), Kind: r.u8(), Name: r.str()}
		st.Nodes[n.ID] = n
		st.NextID = max(st.NextID, n.ID+1)
	case RecNodeDrop:
		id := r.u64()
		delete(st.Nodes, id)
		delete(st.Files, id)
	case recHandle:
		h := SavedHandle{FH: r.u64(), Node: r.u64()}
		flags := r.u8()
		h.Write, h.Dir = flags&1 != 0, flags&2 != 0
		switch {
		case flags&4 != 0:
			h.IO = IODirect
		case flags&8 != 0:
			h.IO, h.BackingID = IOPassthrough, int32(r.u32())
		}
		if flags&16 != 0 {
			h.Opened = OpenReply{Unique: r.u64(), Flags: r.u32()}
		}
		st.Handles[h.FH] = h
		st.NextHandle = max(st.NextHandle, h.FH+1)
	case RecHandleDrop:
		delete(st.Handles, r.u64())
	case recFile:
		f := SavedFile{Node: r.u64(), SpillPath: r.str(), BaseETag: r.str()}
		flags := r.u8()
		f.Dirty, f.Exclusive = flags&1 != 0, flags&2 != 0
		if len(r.b) > 0 { // regions written before commit nonces lack it
			f.CommitNonce = r.str()
		}
		if len(r.b) >= len(f.SeenSum)+8 { // and before the seen content
			copy(f.SeenSum[:], r.b)
			r.b = r.b[len(f.SeenSum):]
			f.SeenSize = int64(r.u64())
		}
		if f.SpillPath == "" {
			delete(st.Files, f.Node)
		} else {
			st.Files[f.Node] = f
		}
	case recIDs:
		st.NextID = max(st.NextID, r.u64())
		st.NextHandle = max(st.NextHandle, r.u64())
	case recIntent:
		it := Intent{Unique: r.u64(), Op: r.u32(), Parent: r.u64(), NewParent: r.u64(), Name: r.str(), NewName: r.str()}
		if r.err == nil {
			st.Intents.Put(it)
		}
	case recIntentDone:
		unique, node, fh := r.u64(), r.u64(), r.u64()
		if r.err == nil {
			st.Intents.Complete(unique, node, fh)
		}
	case RecIntentDrop:
		st.Intents.Drop(r.u64())
	case recSpillRemoved:
		if path := r.str(); r.err == nil {
			st.RemovedSpills = append(st.RemovedSpills, path)
		}
	default:
		return fmt.Errorf("unknown state record type %d", typ)
	}
	return r.err
}

// --- writing the tables' changes -----------------------------------------

func NodeRecord(dst []byte, n SavedNode) []byte {
	w := recordWriter{b: make([]byte, 0, 40+len(n.Name))}
	w.u64(n.ID)
	w.u64(n.Parent)
	w.u64(n.Lookups)
	w.u8(n.Kind)
	w.str(n.Name)
	return frame(dst, recNode, w.b)
}

func HandleRecord(dst []byte, h SavedHandle) []byte {
	var w recordWriter
	w.u64(h.FH)
	w.u64(h.Node)
	var flags byte
	if h.Write {
		flags |= 1
	}
	if h.Dir {
		flags |= 2
	}
	switch h.IO {
	case IODirect:
		flags |= 4
	case IOPassthrough:
		flags |= 8
	}
	if h.Opened.Unique != 0 {
		flags |= 16
	}
	w.u8(flags)
	if h.IO == IOPassthrough {
		w.u32(uint32(h.BackingID))
	}
	if h.Opened.Unique != 0 {
		w.u64(h.Opened.Unique)
		w.u32(h.Opened.Flags)
	}
	return frame(dst, recHandle, w.b)
}

func IDRecord(dst []byte, typ byte, id uint64) []byte {
	var w recordWriter
	w.u64(id)
	return frame(dst, typ, w.b)
}

func FileRecord(dst []byte, f SavedFile) []byte {
	var w recordWriter
	w.u64(f.Node)
	w.str(f.SpillPath)
	w.str(f.BaseETag)
	var flags byte
	if f.Dirty {
		flags |= 1
	}
	if f.Exclusive {
		flags |= 2
	}
	w.u8(flags)
	w.str(f.CommitNonce)
	if f.SeenSum != ([16]byte{}) {
		// Last, and only when known: a record without it is the
		// earlier release's, byte for byte.
		w.b = append(w.b, f.SeenSum[:]...)
		w.u64(uint64(f.SeenSize))
	}
	return frame(dst, recFile, w.b)
}

func IDsRecord(dst []byte, nextID, nextHandle uint64) []byte {
	var w recordWriter
	w.u64(nextID)
	w.u64(nextHandle)
	return frame(dst, recIDs, w.b)
}

func IntentRecord(dst []byte, it Intent) []byte {
	w := recordWriter{b: make([]byte, 0, 48+len(it.Name)+len(it.NewName))}
	w.u64(it.Unique)
	w.u32(it.Op)
	w.u64(it.Parent)
	w.u64(it.NewParent)
	w.str(it.Name)
	w.str(it.NewName)
	return frame(dst, recIntent, w.b)
}

func IntentDoneRecord(dst []byte, it Intent) []byte {
	var w recordWriter
	w.u64(it.Unique)
	w.u64(it.Node)
	w.u64(it.FH)
	return frame(dst, recIntentDone, w.b)
}

func SpillRemovedRecord(dst []byte, path string) []byte {
	var w recordWriter
	w.str(path)
	return frame(dst, recSpillRemoved, w.b)
}
