package journal

import (
	"bytes"
	"io"
	"os"
	"reflect"
	"testing"
)

// earlierRegion is a region written by release 2293705 (the last before
// this package existed), with every record type: see earlierRecords.
const earlierRegion = "testdata/region-2293705.bin"

// earlierRecords are the records of earlierRegion, written with this
// release's functions. Kinds are fusefs's: 1 a file, 2 a directory.
func earlierRecords() []byte {
	var b []byte
	b = NodeRecord(b, SavedNode{ID: 1, Parent: 0, Lookups: 1, Kind: 2, Name: ""})
	b = NodeRecord(b, SavedNode{ID: 7, Parent: 1, Lookups: 3, Kind: 1, Name: "a file"})
	b = NodeRecord(b, SavedNode{ID: 8, Parent: 1, Lookups: 1, Kind: 1, Name: "gone"})
	b = IDRecord(b, RecNodeDrop, 8)
	b = HandleRecord(b, SavedHandle{FH: 3, Node: 7, Write: true, IO: IOCached, Opened: OpenReply{Unique: 100, Flags: 1}})
	b = HandleRecord(b, SavedHandle{FH: 4, Node: 7, IO: IOPassthrough, BackingID: 42})
	b = HandleRecord(b, SavedHandle{FH: 5, Node: 1, Dir: true, IO: IODirect})
	b = HandleRecord(b, SavedHandle{FH: 6, Node: 7})
	b = IDRecord(b, RecHandleDrop, 6)
	b = FileRecord(b, SavedFile{Node: 7, SpillPath: "/cache/spill-7", BaseETag: "0xETAG", Dirty: true, CommitNonce: "nonce-1"})
	b = IDsRecord(b, 20, 10)
	b = IntentRecord(b, Intent{Unique: 200, Op: 9, Parent: 1, Name: "dir"})
	b = IntentRecord(b, Intent{Unique: 201, Op: 12, Parent: 1, NewParent: 1, Name: "a", NewName: "b"})
	b = IntentDoneRecord(b, Intent{Unique: 200, Node: 9})
	b = IntentRecord(b, Intent{Unique: 202, Op: 10, Parent: 1, Name: "x"})
	b = IDRecord(b, RecIntentDrop, 202)
	b = SpillRemovedRecord(b, "/cache/spill-old")
	return b
}

// TestReadsEarlierRegion: a driver adopts the region its predecessor
// wrote in a rolling upgrade, so this release reads an earlier release's
// region to the same tables.
func TestReadsEarlierRegion(t *testing.T) {
	f, err := os.Open(earlierRegion)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, st, err := ReadRegion(f)
	if err != nil {
		t.Fatalf("reading %s: %v", earlierRegion, err)
	}
	if string(st.Init) != "INIT-request-bytes" {
		t.Errorf("INIT %q", st.Init)
	}
	wantNodes := map[uint64]SavedNode{
		1: {ID: 1, Parent: 0, Lookups: 1, Kind: 2, Name: ""},
		7: {ID: 7, Parent: 1, Lookups: 3, Kind: 1, Name: "a file"},
	}
	if !reflect.DeepEqual(st.Nodes, wantNodes) {
		t.Errorf("nodes %+v\nwant %+v", st.Nodes, wantNodes)
	}
	wantHandles := map[uint64]SavedHandle{
		3: {FH: 3, Node: 7, Write: true, IO: IOCached, Opened: OpenReply{Unique: 100, Flags: 1}},
		4: {FH: 4, Node: 7, IO: IOPassthrough, BackingID: 42},
		5: {FH: 5, Node: 1, Dir: true, IO: IODirect},
	}
	if !reflect.DeepEqual(st.Handles, wantHandles) {
		t.Errorf("handles %+v\nwant %+v", st.Handles, wantHandles)
	}
	wantFiles := map[uint64]SavedFile{7: {Node: 7, SpillPath: "/cache/spill-7", BaseETag: "0xETAG", Dirty: true, CommitNonce: "nonce-1"}}
	if !reflect.DeepEqual(st.Files, wantFiles) {
		t.Errorf("files %+v\nwant %+v", st.Files, wantFiles)
	}
	if st.NextID != 20 || st.NextHandle != 10 {
		t.Errorf("next id %d, handle %d; want 20, 10", st.NextID, st.NextHandle)
	}
	if it, ok := st.Intents.Get(200); !ok || !it.Done || it.Node != 9 || it.Name != "dir" {
		t.Errorf("intent 200: %+v %v, want done with node 9", it, ok)
	}
	if it, ok := st.Intents.Get(201); !ok || it.Done || it.NewName != "b" || it.Op != 12 {
		t.Errorf("intent 201: %+v %v, want a rename under way", it, ok)
	}
	if _, ok := st.Intents.Get(202); ok {
		t.Error("intent 202 was dropped, but is there")
	}
	if !reflect.DeepEqual(st.RemovedSpills, []string{"/cache/spill-old"}) {
		t.Errorf("removed spills %q", st.RemovedSpills)
	}
}

// TestWritesEarlierRegion: the same records written by this release are
// the earlier release's bytes, so an earlier driver can still adopt from a
// newer one (a rollback).
func TestWritesEarlierRegion(t *testing.T) {
	r, err := NewRegion()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetInit([]byte("INIT-request-bytes")); err != nil {
		t.Fatal(err)
	}
	r.Append(earlierRecords())
	got, err := io.ReadAll(io.NewSectionReader(r.File(), 0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(earlierRegion)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("this release writes %d bytes, release 2293705 wrote %d, or other bytes: the state region's format changed", len(got), len(want))
	}
}

// TestCheckpointReplaysToTheSameTables: after a checkpoint of the live
// tables, a reader sees the tables and not the log before it.
func TestCheckpointReplaysToTheSameTables(t *testing.T) {
	r, err := NewRegion()
	if err != nil {
		t.Fatal(err)
	}
	r.Append(NodeRecord(nil, SavedNode{ID: 2, Parent: 1, Lookups: 1, Kind: 2, Name: "old"}))
	r.Append(IDRecord(nil, RecNodeDrop, 2))
	r.Checkpoint(NodeRecord(nil, SavedNode{ID: 3, Parent: 1, Lookups: 2, Kind: 2, Name: "live"}))
	_, st, err := ReadRegion(r.File())
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint64]SavedNode{3: {ID: 3, Parent: 1, Lookups: 2, Kind: 2, Name: "live"}}
	if !reflect.DeepEqual(st.Nodes, want) {
		t.Fatalf("nodes after a checkpoint %+v, want %+v", st.Nodes, want)
	}
	if st.NextID != 4 {
		t.Errorf("next id %d, want 4", st.NextID)
	}
}

// TestReadRegionRefusesOtherFiles: a file that is not a region, or whose
// header is corrupt, is refused, not replayed.
func TestReadRegionRefusesOtherFiles(t *testing.T) {
	want, err := os.ReadFile(earlierRegion)
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(b []byte){
		"magic":      func(b []byte) { b[0] = 'x' },
		"end":        func(b []byte) { b[offEnd+1] = 0 },
		"init len":   func(b []byte) { b[offInitLen+1] = 0xff },
		"record len": func(b []byte) { b[stateHeaderSize] = 0xff },
	} {
		b := append([]byte(nil), want...)
		mutate(b)
		path := t.TempDir() + "/region"
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ReadRegion(f); err == nil {
			t.Errorf("%s corrupted: read without error", name)
		}
		f.Close()
	}
}

// TestFileRecordSeenContent: a file record with the content its condition
// stands for reads back with it; one without reads back without it (and is
// the earlier release's bytes: TestWritesEarlierRegion).
func TestFileRecordSeenContent(t *testing.T) {
	r, err := NewRegion()
	if err != nil {
		t.Fatal(err)
	}
	sum := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	with := SavedFile{Node: 3, SpillPath: "/s/3", BaseETag: "0x3", Dirty: true, CommitNonce: "n", SeenSum: sum, SeenSize: 1 << 40}
	without := SavedFile{Node: 4, SpillPath: "/s/4", BaseETag: "0x4"}
	r.Append(FileRecord(FileRecord(nil, with), without))
	_, st, err := ReadRegion(r.File())
	if err != nil {
		t.Fatal(err)
	}
	if st.Files[3] != with || st.Files[4] != without {
		t.Fatalf("read back %+v and %+v, want %+v and %+v", st.Files[3], st.Files[4], with, without)
	}
}
