package blobstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

func TestMemoryRequests(t *testing.T) {
	m := blobstore.NewMemory()
	ctx := t.Context()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	cases := []struct {
		name string
		do   func() error
		want map[blobstore.Op]int64 // requests added by do
	}{
		{"put", func() error { _, err := m.Put(ctx, "d/a", []byte("x"), blobstore.PutOptions{}); return err },
			map[blobstore.Op]int64{blobstore.OpPut: 1}},
		{"stat", func() error { _, err := m.Stat(ctx, "d/a"); return err },
			map[blobstore.Op]int64{blobstore.OpStat: 1}},
		{"failed stat counts too", func() error {
			if _, err := m.Stat(ctx, "missing"); !errors.Is(err, blobstore.ErrNotFound) {
				return err
			}
			return nil
		}, map[blobstore.Op]int64{blobstore.OpStat: 1}},
		{"cancelled call is not sent", func() error {
			if _, err := m.Stat(cancelled, "d/a"); !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		}, map[blobstore.Op]int64{}},
		{"list", func() error { _, err := m.List(ctx, blobstore.ListOptions{Delimiter: "/"}); return err },
			map[blobstore.Op]int64{blobstore.OpList: 1}},
		{"upload in blocks", func() error {
			_, err := blobstore.Upload(ctx, m, "big", bytes.NewReader(make([]byte, 10)), 10,
				blobstore.UploadOptions{BlockSize: 4, SingleShotLimit: -1})
			return err
		}, map[blobstore.Op]int64{blobstore.OpStageBlock: 3, blobstore.OpCommitBlocks: 1}},
		{"copy, set metadata, delete, check", func() error {
			if _, err := m.Copy(ctx, "d/b", "d/a"); err != nil {
				return err
			}
			if _, err := m.SetMetadata(ctx, "d/b", nil, blobstore.Conditions{}); err != nil {
				return err
			}
			if err := m.Delete(ctx, "d/b", blobstore.Conditions{}); err != nil {
				return err
			}
			return m.Check(ctx)
		}, map[blobstore.Op]int64{blobstore.OpCopy: 1, blobstore.OpSetMetadata: 1, blobstore.OpDelete: 1, blobstore.OpCheck: 1}},
		{"read", func() error { _, err := m.ReadAt(ctx, "d/a", make([]byte, 1), 0, ""); return err },
			map[blobstore.Op]int64{blobstore.OpReadAt: 1}},
	}
	for _, c := range cases {
		before := m.Requests()
		if err := c.do(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		after := m.Requests()
		diff := map[blobstore.Op]int64{}
		for op, n := range after {
			if d := n - before[op]; d != 0 {
				diff[op] = d
			}
		}
		if !maps.Equal(diff, c.want) {
			t.Errorf("%s: requests %v, want %v", c.name, diff, c.want)
		}
	}
	// The snapshot is a copy.
	snap := m.Requests()
	snap[blobstore.OpPut] = 1000
	if m.Requests()[blobstore.OpPut] == 1000 {
		t.Error("Requests returned the live map")
	}
}

// TestFakeBlockRules checks rules of Azure's block API that the fakes
// enforce, so that the filesystem's uploader cannot come to depend on
// their absence. (Azurite does not enforce all of them.)
func TestFakeBlockRules(t *testing.T) {
	fakes := map[string]func(t *testing.T) blobstore.Store{
		"memory": func(*testing.T) blobstore.Store { return blobstore.NewMemory() },
		"local": func(t *testing.T) blobstore.Store {
			s, err := blobstore.NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	b64 := base64.StdEncoding.EncodeToString
	for name, newStore := range fakes {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			ctx := t.Context()
			if err := s.StageBlock(ctx, "f", b64([]byte("0001")), []byte("a")); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct{ why, id string }{
				{"different length", b64([]byte("00002"))},
				{"not base64", "not base64!"},
				{"empty", ""},
				{"too long", b64(bytes.Repeat([]byte("x"), blobstore.MaxBlockIDLength+1))},
			} {
				if err := s.StageBlock(ctx, "f", c.id, []byte("b")); err == nil {
					t.Errorf("StageBlock with a block id that is %s (%q) succeeded", c.why, c.id)
				}
			}
			// Another blob has its own ids.
			if err := s.StageBlock(ctx, "g", b64([]byte("00002")), []byte("b")); err != nil {
				t.Errorf("StageBlock of another blob: %v", err)
			}
			ids := make([]string, blobstore.MaxBlocks+1)
			for i := range ids {
				ids[i] = b64([]byte("0001"))
			}
			if _, err := s.CommitBlocks(ctx, "f", ids, blobstore.PutOptions{}); err == nil || !strings.Contains(err.Error(), "blocks") {
				t.Errorf("committing %d blocks: %v, want an error", len(ids), err)
			}
			if _, err := s.CommitBlocks(ctx, "f", []string{b64([]byte("0001"))}, blobstore.PutOptions{}); err != nil {
				t.Errorf("the block survives failed commits: %v", err)
			}
			// Put discards the blob's staged blocks, as Azure does.
			if err := s.StageBlock(ctx, "h", b64([]byte("0001")), []byte("a")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Put(ctx, "h", []byte("put"), blobstore.PutOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.CommitBlocks(ctx, "h", []string{b64([]byte("0001"))}, blobstore.PutOptions{}); err == nil {
				t.Error("a block staged before a Put could still be committed")
			}
		})
	}
}

func TestMemoryETagsNeverRepeat(t *testing.T) {
	m := blobstore.NewMemory()
	ctx := t.Context()
	seen := map[string]bool{}
	for range 50 {
		a, err := m.Put(ctx, "f", []byte("same"), blobstore.PutOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if seen[a.ETag] {
			t.Fatalf("ETag %s handed out twice", a.ETag)
		}
		seen[a.ETag] = true
		if err := m.Delete(ctx, "f", blobstore.Conditions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMemoryReadsAcrossCommittedBlocks: a blob committed from blocks (kept
// as its blocks, not copied into one slice) reads back whole and in any
// range, across block boundaries, a block listed twice, and its end; a
// staged block changed by its caller afterwards changes nothing.
func TestMemoryReadsAcrossCommittedBlocks(t *testing.T) {
	m := blobstore.NewMemory()
	ctx := t.Context()
	id := func(i int) string { return base64.StdEncoding.EncodeToString([]byte{byte(i), 0, 0, 0}) }
	parts := [][]byte{[]byte("abc"), []byte("defgh"), {}, []byte("ij")}
	for i, p := range parts {
		if err := m.StageBlock(ctx, "b", id(i), p); err != nil {
			t.Fatal(err)
		}
	}
	parts[0][0] = 'X' // the store holds its own copy
	a, err := m.CommitBlocks(ctx, "b", []string{id(0), id(1), id(2), id(3), id(1)}, blobstore.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const want = "abcdefghijdefgh"
	if a.Size != int64(len(want)) {
		t.Fatalf("size %d, want %d", a.Size, len(want))
	}
	for off := 0; off <= len(want); off++ {
		for n := 0; n <= len(want)-off+2; n++ {
			p := make([]byte, n)
			got, err := m.ReadAt(ctx, "b", p, int64(off), "")
			wantN := min(n, len(want)-off)
			if got != wantN || string(p[:got]) != want[off:off+wantN] {
				t.Fatalf("ReadAt(%d bytes at %d) = %d %q, want %d %q", n, off, got, p[:got], wantN, want[off:off+wantN])
			}
			if short := n > len(want)-off; short != errors.Is(err, io.EOF) && n > 0 {
				t.Fatalf("ReadAt(%d bytes at %d): err %v, want io.EOF only when short", n, off, err)
			}
		}
	}
}
