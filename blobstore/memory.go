package blobstore

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"
)

// Memory is an in-memory Store for tests: a faithful fake of one Azure
// container, down to the details that code above it could come to rely on
// by accident (ETags that change on every write, Last-Modified with the
// service's one-second resolution, conditional writes, uncommitted blocks
// dropped on commit, paging and ordering of List, the service's name and
// metadata rules). It also counts requests per operation (Requests), so
// that tests can assert how many round trips an operation of the
// filesystem costs.
//
// One mutex guards everything; blob contents are immutable once stored (a
// write replaces the slice), so reads copy outside the lock.
type Memory struct {
	mu       sync.Mutex
	blobs    map[string]*memBlob          // committed blobs by name
	names    []string                     // keys of blobs, sorted, for List
	staged   map[string]map[string][]byte // uncommitted blocks: name -> id -> data
	requests map[Op]int64                 // requests served, by operation
	etagSeq  uint64                       // last ETag handed out; never reused
}

type memBlob struct {
	data memData // never modified once stored
	// blocks is the committed block list of a blob made by
	// CommitBlocks, its data shared with data; nil after a Put.
	blocks  []memBlock
	etag    string
	modTime time.Time
	md      map[string]string // owned by the store; copied in and out
	md5     []byte            // Content-MD5, never modified once stored
}

type memBlock struct {
	id   string
	data []byte
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	// A random start makes ETags differ between stores, so a test cannot
	// pass by comparing ETags of two different stores.
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	return &Memory{
		blobs:    make(map[string]*memBlob),
		staged:   make(map[string]map[string][]byte),
		requests: make(map[Op]int64),
		etagSeq:  binary.LittleEndian.Uint64(seed[:]) >> 16,
	}
}

// Requests returns how many requests of each operation the store has
// served so far (a copy). A request counts once its context was still live
// when it arrived, whether it then succeeded or not: that is what a real
// service would have seen. Compare two snapshots to count the requests of
// one action.
func (m *Memory) Requests() map[Op]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.requests)
}

// begin checks ctx and counts the request; it returns with m.mu held on
// success.
func (m *Memory) begin(ctx context.Context, op Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	m.requests[op]++
	return nil
}

// commitLocked stores data as name's new content, replacing any old one,
// and drops the name's uncommitted blocks, as every write in Azure does.
func (m *Memory) commitLocked(name string, data memData, md map[string]string, sum []byte) Attrs {
	m.etagSeq++
	b := &memBlob{
		data:    data,
		etag:    fmt.Sprintf(`"0x%X"`, m.etagSeq),
		modTime: time.Now().UTC().Truncate(time.Second),
		md:      cloneMetadata(md),
		md5:     slices.Clone(sum),
	}
	if _, ok := m.blobs[name]; !ok {
		i, _ := slices.BinarySearch(m.names, name)
		m.names = slices.Insert(m.names, i, name)
	}
	m.blobs[name] = b
	delete(m.staged, name)
	return b.attrs(name)
}

func (b *memBlob) attrs(name string) Attrs {
	return Attrs{
		Name:       name,
		Size:       b.data.size(),
		ModTime:    b.modTime,
		ETag:       b.etag,
		Metadata:   cloneMetadata(b.md),
		ContentMD5: slices.Clone(b.md5),
	}
}

func notFound(name string) error {
	return fmt.Errorf("%q: %w", name, ErrNotFound)
}

// Stat implements Store.
func (m *Memory) Stat(ctx context.Context, name string) (Attrs, error) {
	if err := m.begin(ctx, OpStat); err != nil {
		return Attrs{}, err
	}
	defer m.mu.Unlock()
	if err := ValidateName(name); err != nil {
		return Attrs{}, err
	}
	b, ok := m.blobs[name]
	if !ok {
		return Attrs{}, notFound(name)
	}
	return b.attrs(name), nil
}

// ReadAt implements Store.
func (m *Memory) ReadAt(ctx context.Context, name string, p []byte, off int64, etag string) (int, error) {
	if err := m.begin(ctx, OpReadAt); err != nil {
		return 0, err
	}
	b, ok := m.blobs[name]
	m.mu.Unlock()
	switch {
	case ValidateName(name) != nil:
		return 0, ValidateName(name)
	case !ok:
		return 0, notFound(name)
	case etag != "" && etag != b.etag:
		return 0, fmt.Errorf("%q: etag is not %s: %w", name, etag, ErrPreconditionFailed)
	}
	return b.data.readAt(p, off)
}

// memData is a blob's content: the one slice of a Put, or the staged
// blocks of a commit, in order. The slices are shared, never modified: a
// commit links its blocks instead of copying them, as Put Block List moves
// no data on a real store. Copying them made a commit of 256 MiB cost
// 0.1-0.9 s under the store's one lock (fresh memory faults in slowly on
// these machines), which the fake's latency and bandwidth model does not
// have and which swamped what the benchmarks over it measure.
type memData [][]byte

func (d memData) size() int64 {
	var n int64
	for _, seg := range d {
		n += int64(len(seg))
	}
	return n
}

// readAt implements the ReadAt contract over d.
func (d memData) readAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("blobstore: negative offset %d", off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	n := 0
	for _, seg := range d {
		if off >= int64(len(seg)) {
			off -= int64(len(seg))
			continue
		}
		n += copy(p[n:], seg[off:])
		off = 0
		if n == len(p) {
			return n, nil
		}
	}
	return n, io.EOF
}

// List implements Store.
func (m *Memory) List(ctx context.Context, opts ListOptions) (ListPage, error) {
	if err := m.begin(ctx, OpList); err != nil {
		return ListPage{}, err
	}
	defer m.mu.Unlock()
	seek := func(key string) (string, string, bool, error) {
		i, _ := slices.BinarySearch(m.names, key)
		if i == len(m.names) {
			return "", "", false, nil
		}
		return m.names[i], m.names[i], true, nil
	}
	names, prefixes, next, err := listPage(ctx, opts, seek)
	if err != nil {
		return ListPage{}, err
	}
	page := ListPage{Prefixes: prefixes, NextMarker: next}
	for _, name := range names {
		page.Blobs = append(page.Blobs, m.blobs[name].attrs(name))
	}
	return page, nil
}

// current returns whether name exists and its ETag, for evalConditions.
func (m *Memory) current(name string) (bool, string) {
	b, ok := m.blobs[name]
	if !ok {
		return false, ""
	}
	return true, b.etag
}

// Put implements Store.
func (m *Memory) Put(ctx context.Context, name string, data []byte, opts PutOptions) (Attrs, error) {
	data = slices.Clone(data) // before the lock: other requests go on meanwhile
	sum := md5.Sum(data)      // kept as the blob's Content-MD5, as Azure does
	if err := m.begin(ctx, OpPut); err != nil {
		return Attrs{}, err
	}
	defer m.mu.Unlock()
	if err := checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	exists, etag := m.current(name)
	if err := evalConditions(name, opts.Conditions, exists, etag); err != nil {
		return Attrs{}, err
	}
	return m.commitLocked(name, memData{data}, opts.Metadata, sum[:]), nil
}

// StageBlock implements Store.
func (m *Memory) StageBlock(ctx context.Context, name, blockID string, data []byte) error {
	data = slices.Clone(data) // before the lock: other requests go on meanwhile
	if err := m.begin(ctx, OpStageBlock); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := validateBlockID(blockID); err != nil {
		return err
	}
	blocks := m.staged[name]
	for id := range blocks {
		if err := sameBlockIDLength(name, blockID, id); err != nil {
			return err
		}
		break
	}
	if blocks == nil {
		blocks = make(map[string][]byte)
		m.staged[name] = blocks
	}
	blocks[blockID] = data
	return nil
}

// CommitBlocks implements Store.
func (m *Memory) CommitBlocks(ctx context.Context, name string, blockIDs []string, opts PutOptions) (Attrs, error) {
	if err := m.begin(ctx, OpCommitBlocks); err != nil {
		return Attrs{}, err
	}
	defer m.mu.Unlock()
	if err := checkWrite(name, opts); err != nil {
		return Attrs{}, err
	}
	if len(blockIDs) > MaxBlocks {
		return Attrs{}, fmt.Errorf("blobstore: %q: %d blocks, more than %d", name, len(blockIDs), MaxBlocks)
	}
	// Conditions first, as the service checks them: a commit on a blob
	// replaced meanwhile fails with ErrPreconditionFailed, not with the
	// committed blocks it names being gone.
	exists, etag := m.current(name)
	if err := evalConditions(name, opts.Conditions, exists, etag); err != nil {
		return Attrs{}, err
	}
	staged := m.staged[name]
	var committed map[string][]byte
	if b := m.blobs[name]; b != nil && len(b.blocks) > 0 {
		committed = make(map[string][]byte, len(b.blocks))
		for _, blk := range b.blocks {
			committed[blk.id] = blk.data
		}
	}
	data := make(memData, 0, len(blockIDs))
	blocks := make([]memBlock, 0, len(blockIDs))
	for _, id := range blockIDs {
		p, ok := staged[id]
		if !ok {
			if p, ok = committed[id]; !ok {
				return Attrs{}, fmt.Errorf("blobstore: commit %q: block %q is neither staged nor committed", name, id)
			}
		}
		if len(p) > 0 {
			data = append(data, p)
		}
		blocks = append(blocks, memBlock{id, p})
	}
	m.commitLocked(name, data, opts.Metadata, opts.ContentMD5)
	b := m.blobs[name]
	b.blocks = blocks
	return b.attrs(name), nil
}

// Delete implements Store.
func (m *Memory) Delete(ctx context.Context, name string, cond Conditions) error {
	if err := m.begin(ctx, OpDelete); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := checkConditions(cond); err != nil {
		return err
	}
	exists, etag := m.current(name)
	if !exists {
		return notFound(name)
	}
	if err := evalConditions(name, cond, exists, etag); err != nil {
		return err
	}
	delete(m.blobs, name)
	if i, ok := slices.BinarySearch(m.names, name); ok {
		m.names = slices.Delete(m.names, i, i+1)
	}
	delete(m.staged, name)
	return nil
}

// Copy implements Store.
func (m *Memory) Copy(ctx context.Context, dst, src string) (Attrs, error) {
	if err := m.begin(ctx, OpCopy); err != nil {
		return Attrs{}, err
	}
	defer m.mu.Unlock()
	if err := ValidateName(dst); err != nil {
		return Attrs{}, err
	}
	if err := ValidateName(src); err != nil {
		return Attrs{}, err
	}
	b, ok := m.blobs[src]
	if !ok {
		return Attrs{}, notFound(src)
	}
	// b.data is immutable, so the copy can share it.
	return m.commitLocked(dst, b.data, b.md, b.md5), nil
}

// SetMetadata implements Store.
func (m *Memory) SetMetadata(ctx context.Context, name string, md map[string]string, cond Conditions) (Attrs, error) {
	if err := m.begin(ctx, OpSetMetadata); err != nil {
		return Attrs{}, err
	}
	defer m.mu.Unlock()
	if err := ValidateName(name); err != nil {
		return Attrs{}, err
	}
	if err := ValidateMetadata(md); err != nil {
		return Attrs{}, err
	}
	if err := checkConditions(cond); err != nil {
		return Attrs{}, err
	}
	b, ok := m.blobs[name]
	if !ok {
		return Attrs{}, notFound(name)
	}
	if err := evalConditions(name, cond, true, b.etag); err != nil {
		return Attrs{}, err
	}
	// Setting metadata is a write: new ETag and Last-Modified, same
	// content. It does not touch uncommitted blocks.
	staged := m.staged[name]
	a := m.commitLocked(name, b.data, md, b.md5)
	if staged != nil {
		m.staged[name] = staged
	}
	m.blobs[name].blocks = b.blocks // as Azure, which keeps the list
	return a, nil
}

// Check implements Store: an in-memory container always exists.
func (m *Memory) Check(ctx context.Context) error {
	if err := m.begin(ctx, OpCheck); err != nil {
		return err
	}
	m.mu.Unlock()
	return nil
}
