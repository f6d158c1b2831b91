package blobstore_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// TestConformance runs every case against every backend (storetest.Run):
// the behaviour the filesystem relies on, whatever the store. Run one
// backend with -run 'TestConformance/.*/local'.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s blobstore.Store)
	}{
		{"Stat", testStat},
		{"ReadAt", testReadAt},
		{"PutOverwrite", testPutOverwrite},
		{"MetadataNotAliased", testMetadataNotAliased},
		{"Conditions", testConditions},
		{"ListPaging", testListPaging},
		{"ListInterleaved", testListInterleaved},
		{"ListAttrs", testListAttrs},
		{"Blocks", testBlocks},
		{"CommittedBlocks", testCommittedBlocks},
		{"Delete", testDelete},
		{"BlobAndPrefix", testBlobAndPrefix},
		{"Copy", testCopy},
		{"SetMetadata", testSetMetadata},
		{"FolderMarkerAndSymlink", testFolderMarkerAndSymlink},
		{"NameRoundTrip", testNameRoundTrip},
		{"InvalidNames", testInvalidNames},
		{"InvalidMetadata", testInvalidMetadata},
		{"Check", testCheck},
		{"Upload", testUpload},
		{"ContentMD5", testContentMD5},
		{"ConcurrentIncrements", testConcurrentIncrements},
		{"ConcurrentCreate", testConcurrentCreate},
		{"ConcurrentTree", testConcurrentTree},
		{"Cancelled", testCancelled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, c.fn)
		})
	}
}

// --- helpers ---

func put(t *testing.T, s blobstore.Store, name string, data []byte, md map[string]string) blobstore.Attrs {
	t.Helper()
	a, err := s.Put(t.Context(), name, data, blobstore.PutOptions{Metadata: md})
	if err != nil {
		t.Fatalf("Put(%q): %v", name, err)
	}
	return a
}

func stat(t *testing.T, s blobstore.Store, name string) blobstore.Attrs {
	t.Helper()
	a, err := s.Stat(t.Context(), name)
	if err != nil {
		t.Fatalf("Stat(%q): %v", name, err)
	}
	return a
}

// readAll reads a whole blob through ReadAt.
func readAll(t *testing.T, s blobstore.Store, name string) []byte {
	t.Helper()
	a := stat(t, s, name)
	buf := make([]byte, a.Size)
	n, err := s.ReadAt(t.Context(), name, buf, 0, a.ETag)
	if err != nil && !(err == io.EOF && a.Size == 0) {
		t.Fatalf("ReadAt(%q, 0..%d): %d, %v", name, a.Size, n, err)
	}
	return buf[:n]
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func sameMetadata(a, b map[string]string) bool {
	return len(a) == len(b) && maps.Equal(a, b)
}

// putAll creates every name (content: the name) with some parallelism.
func putAll(t *testing.T, s blobstore.Store, names []string) {
	t.Helper()
	g, ctx := errgroup.WithContext(t.Context())
	g.SetLimit(16)
	for _, n := range names {
		g.Go(func() error {
			_, err := s.Put(ctx, n, []byte(n), blobstore.PutOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("putting %d blobs: %v", len(names), err)
	}
}

// listAll lists every page of opts and returns blob names and prefixes
// merged in order (prefixes end with the delimiter, names never do), and
// the number of pages. It checks the paging contract on the way.
func listAll(t *testing.T, s blobstore.Store, opts blobstore.ListOptions) ([]string, int) {
	t.Helper()
	var all []string
	limit := opts.MaxResults
	if limit == 0 {
		limit = blobstore.MaxListResults
	}
	for pages := 1; ; pages++ {
		page, err := s.List(t.Context(), opts)
		if err != nil {
			t.Fatalf("List(%+v) page %d: %v", opts, pages, err)
		}
		var items []string
		for _, b := range page.Blobs {
			items = append(items, b.Name)
		}
		if !slices.IsSorted(items) || !slices.IsSorted(page.Prefixes) {
			t.Fatalf("List page %d not in order: blobs %q prefixes %q", pages, items, page.Prefixes)
		}
		items = append(items, page.Prefixes...)
		slices.Sort(items)
		if len(items) > limit {
			t.Fatalf("List page %d has %d entries, MaxResults %d", pages, len(items), limit)
		}
		if len(items) > 0 && len(all) > 0 && items[0] <= all[len(all)-1] {
			t.Fatalf("List page %d starts at %q, not after the previous page's %q", pages, items[0], all[len(all)-1])
		}
		all = append(all, items...)
		if page.NextMarker == "" {
			return all, pages
		}
		if pages > 10000 {
			t.Fatalf("List never ends")
		}
		opts.Marker = page.NextMarker
	}
}

// expectList is the reference listing: names with prefix, rolled up at
// delim, in byte order.
func expectList(names []string, prefix, delim string) []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		if !strings.HasPrefix(n, prefix) {
			continue
		}
		if i := strings.Index(n[len(prefix):], delim); delim != "" && i >= 0 {
			n = n[:len(prefix)+i+len(delim)]
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// --- cases ---

func testStat(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	md := map[string]string{"color": "blue", "n": "1"}
	before := time.Now()
	p := put(t, s, "dir/file.txt", []byte("hello"), md)
	after := time.Now()
	got := stat(t, s, "dir/file.txt")
	if got.Name != "dir/file.txt" || got.Size != 5 || got.ETag == "" {
		t.Errorf("Stat = %+v, want name dir/file.txt, size 5, an ETag", got)
	}
	if got.ETag != p.ETag || got.Size != p.Size || !got.ModTime.Equal(p.ModTime) {
		t.Errorf("Stat = %+v, Put returned %+v", got, p)
	}
	// Last-Modified has one-second resolution; allow for a clock skew
	// with a service on another machine.
	if got.ModTime.Before(before.Add(-5*time.Second)) || got.ModTime.After(after.Add(5*time.Second)) {
		t.Errorf("ModTime %v, want between %v and %v", got.ModTime, before, after)
	}
	if !sameMetadata(got.Metadata, md) {
		t.Errorf("Metadata = %v, want %v", got.Metadata, md)
	}
	for _, name := range []string{"nope", "dir", "dir/file", "dir/file.txt/below"} {
		_, err := s.Stat(ctx, name)
		wantErr(t, fmt.Sprintf("Stat(%q)", name), err, blobstore.ErrNotFound)
	}
}

func testReadAt(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	a := put(t, s, "ten", []byte("0123456789"), nil)
	put(t, s, "empty", nil, nil)
	cases := []struct {
		name    string
		blob    string
		off     int64
		len     int
		want    string
		wantErr error // io.EOF compared with ==, others with errors.Is
	}{
		{"start", "ten", 0, 4, "0123", nil},
		{"middle", "ten", 3, 4, "3456", nil},
		{"up to the end", "ten", 6, 4, "6789", nil},
		{"whole", "ten", 0, 10, "0123456789", nil},
		{"past the end", "ten", 8, 4, "89", io.EOF},
		{"larger than blob", "ten", 0, 20, "0123456789", io.EOF},
		{"at the end", "ten", 10, 4, "", io.EOF},
		{"beyond the end", "ten", 25, 4, "", io.EOF},
		{"empty buffer", "ten", 0, 0, "", nil},
		{"empty blob", "empty", 0, 4, "", io.EOF},
		{"missing blob", "missing", 0, 4, "", blobstore.ErrNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := make([]byte, c.len)
			n, err := s.ReadAt(ctx, c.blob, p, c.off, "")
			if c.wantErr == io.EOF {
				if err != io.EOF {
					t.Fatalf("ReadAt(%d, %d) err = %v, want exactly io.EOF", c.off, c.len, err)
				}
			} else if !errors.Is(err, c.wantErr) {
				t.Fatalf("ReadAt(%d, %d) err = %v, want %v", c.off, c.len, err, c.wantErr)
			}
			if got := string(p[:n]); got != c.want {
				t.Fatalf("ReadAt(%d, %d) = %q, want %q", c.off, c.len, got, c.want)
			}
		})
	}
	t.Run("etag", func(t *testing.T) {
		p := make([]byte, 3)
		if n, err := s.ReadAt(ctx, "ten", p, 1, a.ETag); err != nil || string(p[:n]) != "123" {
			t.Fatalf("ReadAt with current ETag = %q, %v", p[:n], err)
		}
		put(t, s, "ten", []byte("changed!"), nil)
		_, err := s.ReadAt(ctx, "ten", p, 1, a.ETag)
		wantErr(t, "ReadAt with stale ETag", err, blobstore.ErrPreconditionFailed)
	})
	t.Run("negative offset", func(t *testing.T) {
		if _, err := s.ReadAt(ctx, "ten", make([]byte, 1), -1, ""); err == nil {
			t.Fatal("ReadAt at offset -1 succeeded")
		}
	})
	t.Run("large random ranges", func(t *testing.T) {
		data := randomBytes(1, 3<<20+17)
		put(t, s, "large", data, nil)
		r := rand.New(rand.NewPCG(2, 2))
		for range 20 {
			off := r.Int64N(int64(len(data)))
			p := make([]byte, r.IntN(1<<20))
			n, err := s.ReadAt(ctx, "large", p, off, "")
			want := data[off:min(int(off)+len(p), len(data))]
			if n != len(want) || !bytes.Equal(p[:n], want) {
				t.Fatalf("ReadAt(%d, %d): got %d bytes (%v), want %d", off, len(p), n, err, len(want))
			}
			if (n < len(p)) != (err == io.EOF) || (err != nil && err != io.EOF) {
				t.Fatalf("ReadAt(%d, %d) = %d, %v: io.EOF must come exactly with a short read", off, len(p), n, err)
			}
		}
	})
}

func testPutOverwrite(t *testing.T, s blobstore.Store) {
	a1 := put(t, s, "f", []byte("same"), map[string]string{"k": "v"})
	a2 := put(t, s, "f", []byte("same"), nil)
	if a1.ETag == a2.ETag {
		t.Errorf("ETag %s unchanged by an overwrite with the same content", a1.ETag)
	}
	got := stat(t, s, "f")
	if got.ETag != a2.ETag {
		t.Errorf("Stat ETag %s, want the last Put's %s", got.ETag, a2.ETag)
	}
	if len(got.Metadata) != 0 {
		t.Errorf("metadata after overwrite without metadata = %v, want none (replaced, not merged)", got.Metadata)
	}
	a3 := put(t, s, "f", []byte("longer content"), nil)
	if a3.ETag == a2.ETag || a3.Size != 14 {
		t.Errorf("third Put = %+v", a3)
	}
	if b := readAll(t, s, "f"); string(b) != "longer content" {
		t.Errorf("content %q", b)
	}
	put(t, s, "f", []byte("short"), nil)
	if b := readAll(t, s, "f"); string(b) != "short" {
		t.Errorf("content after shrinking overwrite %q", b)
	}
}

func testMetadataNotAliased(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	md := map[string]string{"k": "v"}
	a := put(t, s, "f", nil, md)
	md["k"] = "changed by caller"
	md["extra"] = "x"
	a.Metadata["k"] = "changed through Put's result"
	got := stat(t, s, "f")
	got.Metadata["k"] = "changed through Stat's result"
	page, err := s.List(ctx, blobstore.ListOptions{})
	if err != nil || len(page.Blobs) != 1 {
		t.Fatalf("List = %+v, %v", page, err)
	}
	page.Blobs[0].Metadata["k"] = "changed through List's result"
	if got := stat(t, s, "f").Metadata; !sameMetadata(got, map[string]string{"k": "v"}) {
		t.Errorf("stored metadata = %v, want k=v: a caller's map is aliased", got)
	}
}

func testConditions(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	cur := put(t, s, "c", []byte("v1"), nil)
	stale := cur.ETag
	cur = put(t, s, "c", []byte("v2"), nil)
	if stale == cur.ETag {
		t.Fatal("ETag did not change")
	}
	// Every case starts from the blob "c" with ETag cur.ETag; a case that
	// succeeds in writing it moves cur on.
	cases := []struct {
		name string
		op   func() error
		want error // nil: must succeed
	}{
		{"Put IfNoneMatch on existing", func() error {
			_, err := s.Put(ctx, "c", []byte("x"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}})
			return err
		}, blobstore.ErrAlreadyExists},
		{"Put IfNoneMatch on missing", func() error {
			_, err := s.Put(ctx, "new", []byte("x"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}})
			return err
		}, nil},
		{"Put IfMatch stale", func() error {
			_, err := s.Put(ctx, "c", []byte("x"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: stale}})
			return err
		}, blobstore.ErrPreconditionFailed},
		{"Put IfMatch on missing", func() error {
			_, err := s.Put(ctx, "missing", []byte("x"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: stale}})
			return err
		}, blobstore.ErrPreconditionFailed},
		{"Put IfMatch current", func() error {
			a, err := s.Put(ctx, "c", []byte("v3"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: cur.ETag}})
			if err == nil {
				cur = a
			}
			return err
		}, nil},
		{"SetMetadata IfMatch stale", func() error {
			_, err := s.SetMetadata(ctx, "c", map[string]string{"a": "b"}, blobstore.Conditions{IfMatch: stale})
			return err
		}, blobstore.ErrPreconditionFailed},
		{"SetMetadata IfMatch current", func() error {
			a, err := s.SetMetadata(ctx, "c", map[string]string{"a": "b"}, blobstore.Conditions{IfMatch: cur.ETag})
			if err == nil {
				cur = a
			}
			return err
		}, nil},
		{"CommitBlocks IfNoneMatch on existing", func() error {
			id := blobstore.BlockID(blobstore.NewBlockNonce(), 0)
			if err := s.StageBlock(ctx, "c", id, []byte("x")); err != nil {
				return fmt.Errorf("StageBlock: %v", err) // unexpected: fails the case
			}
			_, err := s.CommitBlocks(ctx, "c", []string{id}, blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}})
			return err
		}, blobstore.ErrAlreadyExists},
		{"CommitBlocks IfMatch stale", func() error {
			id := blobstore.BlockID(blobstore.NewBlockNonce(), 0)
			if err := s.StageBlock(ctx, "c", id, []byte("x")); err != nil {
				return fmt.Errorf("StageBlock: %v", err)
			}
			_, err := s.CommitBlocks(ctx, "c", []string{id}, blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: stale}})
			return err
		}, blobstore.ErrPreconditionFailed},
		{"Delete IfMatch stale", func() error {
			return s.Delete(ctx, "c", blobstore.Conditions{IfMatch: stale})
		}, blobstore.ErrPreconditionFailed},
		{"ReadAt stale", func() error {
			_, err := s.ReadAt(ctx, "c", make([]byte, 1), 0, stale)
			return err
		}, blobstore.ErrPreconditionFailed},
	}
	for _, c := range cases {
		before := stat(t, s, "c")
		err := c.op()
		if c.want == nil && err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
		after := stat(t, s, "c")
		if c.want != nil && after.ETag != before.ETag {
			t.Errorf("%s failed but changed the blob: ETag %s -> %s", c.name, before.ETag, after.ETag)
		}
		if after.ETag != cur.ETag {
			t.Errorf("%s: ETag %s, want %s", c.name, after.ETag, cur.ETag)
		}
	}
	if b := readAll(t, s, "c"); string(b) != "v3" {
		t.Errorf("content %q after the conditional writes, want v3", b)
	}
	if err := s.Delete(ctx, "c", blobstore.Conditions{IfMatch: cur.ETag}); err != nil {
		t.Errorf("Delete IfMatch current: %v", err)
	}
	_, err := s.Stat(ctx, "c")
	wantErr(t, "Stat after conditional Delete", err, blobstore.ErrNotFound)
}

// listingNames returns 2,520 names: many directories and files plus names
// that sort around a prefix ("d05-x" < "d05.txt" < "d05/" < "d050") and a
// blob that is also a prefix.
func listingNames() []string {
	var names []string
	for d := range 40 {
		for f := range 50 {
			names = append(names, fmt.Sprintf("big/d%02d/f%03d", d, f))
		}
	}
	for f := range 500 {
		names = append(names, fmt.Sprintf("big/f%03d", f))
	}
	names = append(names, "big/d05", "big/d05-x", "big/d05.txt", "big/d050", "big/d05/sub/deep",
		"big/D05", "big/é", "big/z", "big/d39/zz/zz", "big/d00/a/b/c", "top", "top-level",
		"big/d05/sub/deeper", "big/d12/", "big/d20/x", "big/d20/x/y", "big/!", "big/~", "big/A", "bigger")
	// "big/d12/" is not a valid name; it documents that such names are
	// skipped here.
	names = slices.DeleteFunc(names, func(n string) bool { return strings.HasSuffix(n, "/") })
	slices.Sort(names)
	return slices.Compact(names)
}

func testListPaging(t *testing.T, s blobstore.Store) {
	names := listingNames()
	if len(names) < 2500 {
		t.Fatalf("only %d names", len(names))
	}
	putAll(t, s, names)
	cases := []struct {
		opts      blobstore.ListOptions
		wantPages int // 0: do not check
	}{
		{blobstore.ListOptions{MaxResults: 1000}, 3},
		{blobstore.ListOptions{}, 1}, // default page size (5000)
		{blobstore.ListOptions{Prefix: "big/", Delimiter: "/", MaxResults: 37}, 0},
		{blobstore.ListOptions{Delimiter: "/"}, 1},
		{blobstore.ListOptions{Prefix: "big/d05", Delimiter: "/", MaxResults: 2}, 0},
		{blobstore.ListOptions{Prefix: "big/d05/", MaxResults: 1}, 52},
		{blobstore.ListOptions{Prefix: "big/d2", Delimiter: "/", MaxResults: 3}, 0},
		{blobstore.ListOptions{Prefix: "big/d20/x", Delimiter: "/"}, 1},
		{blobstore.ListOptions{Prefix: "top"}, 1},
		{blobstore.ListOptions{Prefix: "nomatch", Delimiter: "/"}, 1},
		{blobstore.ListOptions{Prefix: "big/d39/", Delimiter: "/", MaxResults: 50}, 2},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q,%q,%d", c.opts.Prefix, c.opts.Delimiter, c.opts.MaxResults), func(t *testing.T) {
			got, pages := listAll(t, s, c.opts)
			want := expectList(names, c.opts.Prefix, c.opts.Delimiter)
			if !slices.Equal(got, want) {
				t.Fatalf("listing differs:\n got %d: %.400q\nwant %d: %.400q", len(got), got, len(want), want)
			}
			if c.wantPages != 0 && pages != c.wantPages {
				t.Errorf("%d pages, want %d", pages, c.wantPages)
			}
			if c.opts.MaxResults > 0 && len(want) > c.opts.MaxResults && pages < 2 {
				t.Errorf("%d entries in %d page(s) of at most %d", len(want), pages, c.opts.MaxResults)
			}
		})
	}
}

func testListInterleaved(t *testing.T, s blobstore.Store) {
	putAll(t, s, []string{"a", "a/b", "a-b", "a0", "a/c/d", "b", "a.txt", "b/c"})
	// One entry per page: the marker after the prefix "a/" must skip
	// everything below it, and blobs and prefixes interleave in byte
	// order.
	got, pages := listAll(t, s, blobstore.ListOptions{Delimiter: "/", MaxResults: 1})
	want := []string{"a", "a-b", "a.txt", "a/", "a0", "b", "b/"}
	if !slices.Equal(got, want) || pages != len(want) {
		t.Errorf("got %q in %d pages, want %q in %d", got, pages, want, len(want))
	}
	got, _ = listAll(t, s, blobstore.ListOptions{MaxResults: 2})
	want = []string{"a", "a-b", "a.txt", "a/b", "a/c/d", "a0", "b", "b/c"}
	if !slices.Equal(got, want) {
		t.Errorf("recursive: got %q, want %q", got, want)
	}
}

func testListAttrs(t *testing.T, s blobstore.Store) {
	put(t, s, "d/one", []byte("1"), map[string]string{"hdi_isfolder": "true"})
	put(t, s, "d/two", []byte("22"), map[string]string{"k": "v"})
	page, err := s.List(t.Context(), blobstore.ListOptions{Prefix: "d/", Delimiter: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Blobs) != 2 || page.NextMarker != "" || len(page.Prefixes) != 0 {
		t.Fatalf("List = %+v", page)
	}
	for _, b := range page.Blobs {
		st := stat(t, s, b.Name)
		if b.Size != st.Size || b.ETag != st.ETag || !b.ModTime.Equal(st.ModTime) || !sameMetadata(b.Metadata, st.Metadata) {
			t.Errorf("List entry %+v differs from Stat %+v: listings must carry what Stat does", b, st)
		}
	}
}

func testBlocks(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	nonce := blobstore.NewBlockNonce()
	id := func(i int) string { return blobstore.BlockID(nonce, i) }
	for i, data := range []string{"aaa", "bbb", "ccc", "zzz"} {
		if err := s.StageBlock(ctx, "b/blob", id(i), []byte(data)); err != nil {
			t.Fatalf("StageBlock %d: %v", i, err)
		}
	}
	_, err := s.Stat(ctx, "b/blob")
	wantErr(t, "Stat before commit", err, blobstore.ErrNotFound)
	if page, err := s.List(ctx, blobstore.ListOptions{}); err != nil || len(page.Blobs)+len(page.Prefixes) != 0 {
		t.Fatalf("List before commit = %+v, %v: uncommitted blocks must be invisible", page, err)
	}
	md := map[string]string{"k": "v"}
	a, err := s.CommitBlocks(ctx, "b/blob", []string{id(2), id(0), id(1)}, blobstore.PutOptions{Metadata: md})
	if err != nil {
		t.Fatalf("CommitBlocks: %v", err)
	}
	if a.Size != 9 || a.ETag == "" {
		t.Errorf("CommitBlocks = %+v", a)
	}
	if got := stat(t, s, "b/blob"); got.ETag != a.ETag || !sameMetadata(got.Metadata, md) {
		t.Errorf("Stat after commit = %+v, commit returned %+v", got, a)
	}
	if b := readAll(t, s, "b/blob"); string(b) != "cccaaabbb" {
		t.Errorf("content %q, want cccaaabbb (blocks in the order listed)", b)
	}
	// Block 3 was staged but not committed: gone now.
	_, err = s.CommitBlocks(ctx, "b/blob", []string{id(3)}, blobstore.PutOptions{})
	if err == nil {
		t.Error("committing a block dropped by the previous commit succeeded")
	}
	_, err = s.CommitBlocks(ctx, "b/blob", []string{blobstore.BlockID(nonce, 99)}, blobstore.PutOptions{})
	if err == nil {
		t.Error("committing a block that was never staged succeeded")
	}
	// A new upload's staged blocks leave the blob alone until committed.
	nonce2 := blobstore.NewBlockNonce()
	if err := s.StageBlock(ctx, "b/blob", blobstore.BlockID(nonce2, 0), []byte("new")); err != nil {
		t.Fatal(err)
	}
	if got := stat(t, s, "b/blob"); got.ETag != a.ETag {
		t.Errorf("failed commits or staging changed the blob: %+v", got)
	}
	if b := readAll(t, s, "b/blob"); string(b) != "cccaaabbb" {
		t.Errorf("content %q after failed commits, want cccaaabbb", b)
	}
	a2, err := s.CommitBlocks(ctx, "b/blob", []string{blobstore.BlockID(nonce2, 0), blobstore.BlockID(nonce2, 0)}, blobstore.PutOptions{})
	if err != nil {
		t.Fatalf("CommitBlocks with a block listed twice: %v", err)
	}
	if b := readAll(t, s, "b/blob"); string(b) != "newnew" || a2.ETag == a.ETag || len(stat(t, s, "b/blob").Metadata) != 0 {
		t.Errorf("after second commit: content %q, attrs %+v", b, a2)
	}
}

// testCommittedBlocks: a commit may name blocks of the blob's committed
// block list, which is how a file fsync'ed again keeps the blocks it
// already sent.
func testCommittedBlocks(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	const name = "cb/blob"
	nonce := blobstore.NewBlockNonce()
	id := func(i int) string { return blobstore.BlockID(nonce, i) }
	stage := func(i int, data string) {
		t.Helper()
		if err := s.StageBlock(ctx, name, id(i), []byte(data)); err != nil {
			t.Fatalf("StageBlock %d: %v", i, err)
		}
	}
	commit := func(what string, want string, ids ...int) blobstore.Attrs {
		t.Helper()
		list := make([]string, len(ids))
		for i, n := range ids {
			list[i] = id(n)
		}
		a, err := s.CommitBlocks(ctx, name, list, blobstore.PutOptions{})
		if err != nil {
			t.Fatalf("%s: CommitBlocks: %v", what, err)
		}
		if b := readAll(t, s, name); string(b) != want || a.Size != int64(len(want)) {
			t.Fatalf("%s: content %q, size %d; want %q", what, b, a.Size, want)
		}
		return a
	}
	refused := func(what string, ids ...int) {
		t.Helper()
		before := stat(t, s, name)
		list := make([]string, len(ids))
		for i, n := range ids {
			list[i] = id(n)
		}
		if _, err := s.CommitBlocks(ctx, name, list, blobstore.PutOptions{}); err == nil {
			t.Fatalf("%s: CommitBlocks succeeded", what)
		}
		if after := stat(t, s, name); after.ETag != before.ETag {
			t.Fatalf("%s: a failed commit changed the blob", what)
		}
	}

	stage(0, "aaa")
	stage(1, "bbb")
	a := commit("staged", "aaabbb", 0, 1)
	// Block 0 stays as committed, 2 is new; 1 leaves the list.
	stage(2, "ccc")
	commit("committed and staged", "aaaccc", 0, 2)
	// Committed blocks only, reordered and repeated.
	a2 := commit("committed only", "cccaaaccc", 2, 0, 2)
	refused("a block the last commit left out", 1)
	// A block staged under a committed id wins ("Latest").
	stage(0, "AAA")
	commit("staged over committed", "AAAccc", 0, 2)
	// Setting metadata keeps the list.
	if _, err := s.SetMetadata(ctx, name, map[string]string{"k": "v"}, blobstore.Conditions{}); err != nil {
		t.Fatal(err)
	}
	commit("after SetMetadata", "cccAAA", 2, 0)
	// Conditions are checked first: a stale If-Match fails as such.
	_, err := s.CommitBlocks(ctx, name, []string{id(0)}, blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: a.ETag}})
	wantErr(t, "commit on a stale ETag", err, blobstore.ErrPreconditionFailed)
	if a2.ETag == a.ETag {
		t.Fatal("commits kept the ETag")
	}
	// A Put leaves no committed blocks, and neither does a deleted blob.
	put(t, s, name, []byte("put"), nil)
	refused("after a Put", 0)
	stage(3, "ddd")
	commit("after a Put, staged", "ddd", 3)
	if err := s.Delete(ctx, name, blobstore.Conditions{}); err != nil {
		t.Fatal(err)
	}
	stage(4, "eee")
	if _, err := s.CommitBlocks(ctx, name, []string{id(3), id(4)}, blobstore.PutOptions{}); err == nil {
		t.Fatal("a deleted blob's blocks were committed")
	}
}

func testDelete(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	putAll(t, s, []string{"d/x/y", "d/x/z", "d/w", "d/x/deep/er"})
	steps := []struct {
		del  string
		want []string // List(Prefix "d/", Delimiter "/") afterwards
	}{
		{"d/x/y", []string{"d/w", "d/x/"}},
		{"d/x/deep/er", []string{"d/w", "d/x/"}},
		{"d/x/z", []string{"d/w"}}, // no empty prefix left behind
		{"d/w", nil},
	}
	for _, st := range steps {
		if err := s.Delete(ctx, st.del, blobstore.Conditions{}); err != nil {
			t.Fatalf("Delete(%q): %v", st.del, err)
		}
		_, err := s.Stat(ctx, st.del)
		wantErr(t, "Stat after Delete", err, blobstore.ErrNotFound)
		err = s.Delete(ctx, st.del, blobstore.Conditions{})
		wantErr(t, "second Delete", err, blobstore.ErrNotFound)
		got, _ := listAll(t, s, blobstore.ListOptions{Prefix: "d/", Delimiter: "/"})
		if !slices.Equal(got, st.want) {
			t.Errorf("after Delete(%q): List = %q, want %q", st.del, got, st.want)
		}
	}
	if got, _ := listAll(t, s, blobstore.ListOptions{Delimiter: "/"}); len(got) != 0 {
		t.Errorf("store not empty after deleting everything: %q", got)
	}
}

// testBlobAndPrefix covers a name that is both a blob and a prefix, which
// is how blobfuse2-style directory markers look when the directory has
// children.
func testBlobAndPrefix(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	steps := []struct {
		op   string // "put NAME" or "del NAME"
		want []string
	}{
		{"put a", []string{"a"}},
		{"put a/b", []string{"a", "a/b"}},
		{"put a/b/c", []string{"a", "a/b", "a/b/c"}},
		{"put a", []string{"a", "a/b", "a/b/c"}}, // overwrite while a prefix
		{"del a/b", []string{"a", "a/b/c"}},
		{"put a/b", []string{"a", "a/b", "a/b/c"}},
		{"del a", []string{"a/b", "a/b/c"}},
		{"del a/b/c", []string{"a/b"}},
		{"put a", []string{"a", "a/b"}},
		{"del a/b", []string{"a"}},
		{"del a", nil},
	}
	for i, st := range steps {
		verb, name, _ := strings.Cut(st.op, " ")
		if verb == "put" {
			put(t, s, name, []byte(fmt.Sprintf("%s#%d", name, i)), map[string]string{"step": strconv.Itoa(i)})
		} else if err := s.Delete(ctx, name, blobstore.Conditions{}); err != nil {
			t.Fatalf("step %d: Delete(%q): %v", i, name, err)
		}
		got, _ := listAll(t, s, blobstore.ListOptions{})
		if !slices.Equal(got, st.want) {
			t.Fatalf("step %d (%s): List = %q, want %q", i, st.op, got, st.want)
		}
		for _, n := range st.want {
			a := stat(t, s, n)
			want := fmt.Sprintf("%s#%s", n, a.Metadata["step"])
			if b := readAll(t, s, n); string(b) != want {
				t.Fatalf("step %d (%s): %q holds %q, want %q", i, st.op, n, b, want)
			}
		}
	}
	put(t, s, "m", nil, map[string]string{"hdi_isfolder": "true"})
	put(t, s, "m/f", []byte("x"), nil)
	got, _ := listAll(t, s, blobstore.ListOptions{Delimiter: "/"})
	if want := []string{"m", "m/"}; !slices.Equal(got, want) {
		t.Errorf("List with delimiter = %q, want %q", got, want)
	}
}

func testCopy(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	data := randomBytes(3, 1<<20+3)
	md := map[string]string{"k": "v", "is_symlink": "false"}
	src := put(t, s, "src", data, md)
	put(t, s, "dir/dst", []byte("old"), map[string]string{"old": "yes"})
	for _, dst := range []string{"fresh/dst", "dir/dst"} {
		a, err := s.Copy(ctx, dst, "src")
		if err != nil {
			t.Fatalf("Copy(%q): %v", dst, err)
		}
		got := stat(t, s, dst)
		if got.Size != src.Size || got.ETag == src.ETag || got.ETag != a.ETag || !sameMetadata(got.Metadata, md) {
			t.Errorf("Copy(%q) = %+v, Stat %+v, source %+v: want same size and metadata, own ETag", dst, a, got, src)
		}
		if !bytes.Equal(readAll(t, s, dst), data) {
			t.Errorf("Copy(%q): content differs", dst)
		}
	}
	if got := stat(t, s, "src"); got.ETag != src.ETag {
		t.Errorf("Copy changed its source: %+v", got)
	}
	_, err := s.Copy(ctx, "x", "missing")
	wantErr(t, "Copy from a missing blob", err, blobstore.ErrNotFound)
}

func testSetMetadata(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	a := put(t, s, "f", []byte("content"), map[string]string{"one": "1", "two": "2"})
	md := map[string]string{"three": "3", blobstore.MetaMtime: "1700000000123456789"}
	b, err := s.SetMetadata(ctx, "f", md, blobstore.Conditions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.ETag == a.ETag || b.Size != a.Size || b.ModTime.Before(a.ModTime) {
		t.Errorf("SetMetadata = %+v after %+v: want a new ETag, same size, later or equal time", b, a)
	}
	if got := stat(t, s, "f"); !sameMetadata(got.Metadata, md) || got.ETag != b.ETag {
		t.Errorf("Stat = %+v, want metadata %v (replaced, not merged)", got, md)
	}
	if c := readAll(t, s, "f"); string(c) != "content" {
		t.Errorf("content %q changed by SetMetadata", c)
	}
	if _, err := s.SetMetadata(ctx, "f", nil, blobstore.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if got := stat(t, s, "f"); len(got.Metadata) != 0 {
		t.Errorf("metadata %v after SetMetadata(nil)", got.Metadata)
	}
	_, err = s.SetMetadata(ctx, "missing", md, blobstore.Conditions{})
	wantErr(t, "SetMetadata of a missing blob", err, blobstore.ErrNotFound)
}

func testFolderMarkerAndSymlink(t *testing.T, s blobstore.Store) {
	folder := map[string]string{blobstore.MetaIsFolder: "true"}
	link := map[string]string{blobstore.MetaIsSymlink: "true"}
	put(t, s, "dir", nil, folder)
	put(t, s, "dir/empty", nil, folder)
	put(t, s, "dir/link", []byte("../target/file"), link)
	for name, want := range map[string]map[string]string{"dir": folder, "dir/empty": folder, "dir/link": link} {
		if got := stat(t, s, name); !sameMetadata(got.Metadata, want) {
			t.Errorf("Stat(%q).Metadata = %v, want %v", name, got.Metadata, want)
		}
	}
	if b := readAll(t, s, "dir/link"); string(b) != "../target/file" {
		t.Errorf("symlink target %q", b)
	}
	page, err := s.List(t.Context(), blobstore.ListOptions{Prefix: "dir/", Delimiter: "/"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, b := range page.Blobs {
		got[b.Name] = b.Metadata
	}
	if len(got) != 2 || !sameMetadata(got["dir/empty"], folder) || !sameMetadata(got["dir/link"], link) {
		t.Errorf("List metadata = %v", got)
	}
}

func testNameRoundTrip(t *testing.T, s blobstore.Store) {
	names := []string{
		"sp ace/file name.txt",
		"query?and#fragment%25percent",
		"plus+amp&eq=semi;colon:at@comma,",
		"tilde~(paren)!dollar$quote'star*",
		"ünïcödé/日本語/🙂",
		"dots.in..the.middle/.hidden",
		"-leading-dash",
		strings.Repeat("long/", 100) + "end",
	}
	for _, n := range names {
		put(t, s, n, []byte(n), nil)
		if b := readAll(t, s, n); string(b) != n {
			t.Errorf("%q holds %q", n, b)
		}
	}
	got, _ := listAll(t, s, blobstore.ListOptions{})
	want := slices.Sorted(slices.Values(names))
	if !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q", got, want)
	}
}

func testInvalidNames(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	for _, name := range []string{
		"", "/a", "a//b", "a/", ".", "..", "a/../b", "a/./b", "a/..", "file.", "dir./f",
		"nul\x00byte", "bad\xffutf8", strings.Repeat("x", blobstore.MaxNameLength+1),
	} {
		_, err := s.Put(ctx, name, []byte("x"), blobstore.PutOptions{})
		wantErr(t, fmt.Sprintf("Put(%.40q)", name), err, blobstore.ErrInvalidName)
		_, err = s.Stat(ctx, name)
		wantErr(t, fmt.Sprintf("Stat(%.40q)", name), err, blobstore.ErrInvalidName)
		err = s.StageBlock(ctx, name, blobstore.BlockID("n", 0), []byte("x"))
		wantErr(t, fmt.Sprintf("StageBlock(%.40q)", name), err, blobstore.ErrInvalidName)
	}
	if got, _ := listAll(t, s, blobstore.ListOptions{}); len(got) != 0 {
		t.Errorf("invalid names created blobs: %q", got)
	}
	// The longest valid name works (segments of 200 characters: every
	// file system takes those).
	long := strings.Repeat(strings.Repeat("y", 199)+"/", 6)[:blobstore.MaxNameLength-1] + "z"
	if _, err := s.Put(ctx, long, []byte("long"), blobstore.PutOptions{}); err != nil {
		t.Errorf("Put of a %d-character name: %v", len(long), err)
	} else if b := readAll(t, s, long); string(b) != "long" {
		t.Errorf("%d-character name holds %q", len(long), b)
	}
}

func testInvalidMetadata(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	for _, md := range []map[string]string{
		{"has-dash": "v"},
		{"1digit": "v"},
		{"": "v"},
		{"sp ace": "v"},
		{"k": "new\nline"},
		{"k": "ünïcödé"},
		{"k": " padded "},
		{"k": strings.Repeat("v", blobstore.MaxMetadataSize)},
	} {
		_, err := s.Put(ctx, "f", nil, blobstore.PutOptions{Metadata: md})
		wantErr(t, fmt.Sprintf("Put with metadata %.40q", md), err, blobstore.ErrInvalidName)
	}
	_, err := s.Stat(ctx, "f")
	wantErr(t, "Stat after refused Puts", err, blobstore.ErrNotFound)
}

func testCheck(t *testing.T, s blobstore.Store) {
	if err := s.Check(t.Context()); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// testContentMD5: the store keeps a Content-MD5 as Azure does: a Put's of
// its body, a commit's only when sent, and both through Copy and
// SetMetadata; Stat and List return it.
func testContentMD5(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	data := randomBytes(7, 3000)
	sum := md5.Sum(data)
	want := func(name string, sum []byte) {
		t.Helper()
		if got := stat(t, s, name).ContentMD5; !bytes.Equal(got, sum) {
			t.Errorf("%s: Stat Content-MD5 %x, want %x", name, got, sum)
		}
		page, err := s.List(ctx, blobstore.ListOptions{Prefix: name})
		if err != nil || len(page.Blobs) == 0 || page.Blobs[0].Name != name {
			t.Fatalf("%s: List = %+v, %v", name, page, err)
		}
		if got := page.Blobs[0].ContentMD5; !bytes.Equal(got, sum) {
			t.Errorf("%s: List Content-MD5 %x, want %x", name, got, sum)
		}
	}
	if a := put(t, s, "md5/put", data, nil); !bytes.Equal(a.ContentMD5, sum[:]) {
		t.Errorf("Put returned Content-MD5 %x, want %x", a.ContentMD5, sum)
	}
	want("md5/put", sum[:])

	nonce := blobstore.NewBlockNonce()
	commit := func(name string, md5 []byte) blobstore.Attrs {
		t.Helper()
		ids := []string{blobstore.BlockID(nonce, 0), blobstore.BlockID(nonce, 1)}
		for i, part := range [][]byte{data[:1000], data[1000:]} {
			if err := s.StageBlock(ctx, name, ids[i], part); err != nil {
				t.Fatal(err)
			}
		}
		a, err := s.CommitBlocks(ctx, name, ids, blobstore.PutOptions{ContentMD5: md5})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	commit("md5/blocks-none", nil)
	want("md5/blocks-none", nil)
	if a := commit("md5/blocks", sum[:]); !bytes.Equal(a.ContentMD5, sum[:]) {
		t.Errorf("CommitBlocks returned Content-MD5 %x, want %x", a.ContentMD5, sum)
	}
	want("md5/blocks", sum[:])
	// The store keeps what it is given: a writer's wrong MD5 is the
	// readers' to find.
	wrong := md5.Sum([]byte("something else"))
	commit("md5/blocks-wrong", wrong[:])
	want("md5/blocks-wrong", wrong[:])

	if _, err := s.Copy(ctx, "md5/copy", "md5/blocks"); err != nil {
		t.Fatal(err)
	}
	want("md5/copy", sum[:])
	if _, err := s.SetMetadata(ctx, "md5/blocks", map[string]string{"k": "v"}, blobstore.Conditions{}); err != nil {
		t.Fatal(err)
	}
	want("md5/blocks", sum[:])
}

func testUpload(t *testing.T, s blobstore.Store) {
	ctx := t.Context()
	const bs = 64 << 10
	cases := []struct {
		name string
		size int
		opts blobstore.UploadOptions
	}{
		{"empty", 0, blobstore.UploadOptions{}},
		{"small", 1000, blobstore.UploadOptions{}},
		{"one block", bs, blobstore.UploadOptions{BlockSize: bs}},
		{"blocks", 5*bs + 777, blobstore.UploadOptions{BlockSize: bs, Concurrency: 3}},
		{"many blocks", 40*bs + 1, blobstore.UploadOptions{BlockSize: bs}},
		{"blocks only", 1000, blobstore.UploadOptions{BlockSize: 300, SingleShotLimit: -1}},
		{"default blocks", 9<<20 + 5, blobstore.UploadOptions{}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := randomBytes(uint64(i), c.size)
			md := map[string]string{"case": strconv.Itoa(i)}
			c.opts.PutOptions.Metadata = md
			name := "up/" + strings.ReplaceAll(c.name, " ", "-")
			a, err := blobstore.Upload(ctx, s, name, bytes.NewReader(data), int64(len(data)), c.opts)
			if err != nil {
				t.Fatalf("Upload: %v", err)
			}
			if a.Size != int64(c.size) {
				t.Errorf("Upload returned size %d, want %d", a.Size, c.size)
			}
			if got := stat(t, s, name); got.ETag != a.ETag || !sameMetadata(got.Metadata, md) {
				t.Errorf("Stat = %+v, Upload returned %+v", got, a)
			}
			if got := readAll(t, s, name); !bytes.Equal(got, data) {
				t.Errorf("content differs from what was uploaded (%d vs %d bytes)", len(got), len(data))
			}
			// Every upload leaves the MD5 of the whole for readers,
			// staged blocks too (hashed beside them, in order).
			sum := md5.Sum(data)
			if got := stat(t, s, name).ContentMD5; !bytes.Equal(got, sum[:]) {
				t.Errorf("Content-MD5 %x, want %x", got, sum)
			}
		})
	}
	t.Run("condition", func(t *testing.T) {
		before := stat(t, s, "up/small")
		_, err := blobstore.Upload(ctx, s, "up/small", bytes.NewReader(make([]byte, 3*bs)), 3*bs,
			blobstore.UploadOptions{BlockSize: bs, PutOptions: blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}}})
		wantErr(t, "Upload IfNoneMatch over an existing blob", err, blobstore.ErrAlreadyExists)
		if after := stat(t, s, "up/small"); after.ETag != before.ETag {
			t.Errorf("refused upload changed the blob")
		}
	})
	t.Run("short source", func(t *testing.T) {
		_, err := blobstore.Upload(ctx, s, "up/short", bytes.NewReader(make([]byte, 10)), 3*bs, blobstore.UploadOptions{BlockSize: bs})
		wantErr(t, "Upload from a short source", err, io.ErrUnexpectedEOF)
		_, err = s.Stat(ctx, "up/short")
		wantErr(t, "Stat after failed upload", err, blobstore.ErrNotFound)
	})
}

// testConcurrentIncrements has writers increment a counter with
// read-modify-write under If-Match: no increment may be lost.
func testConcurrentIncrements(t *testing.T, s blobstore.Store) {
	const writers, each = 6, 8
	ctx := t.Context()
	put(t, s, "counter", []byte("0"), nil)
	g, ctx := errgroup.WithContext(ctx)
	for range writers {
		g.Go(func() error {
			for done := 0; done < each; {
				a, err := s.Stat(ctx, "counter")
				if err != nil {
					return err
				}
				buf := make([]byte, a.Size)
				n, err := s.ReadAt(ctx, "counter", buf, 0, a.ETag)
				if errors.Is(err, blobstore.ErrPreconditionFailed) {
					continue
				}
				if err != nil {
					return err
				}
				v, err := strconv.Atoi(string(buf[:n]))
				if err != nil {
					return err
				}
				_, err = s.Put(ctx, "counter", []byte(strconv.Itoa(v+1)), blobstore.PutOptions{Conditions: blobstore.Conditions{IfMatch: a.ETag}})
				if errors.Is(err, blobstore.ErrPreconditionFailed) {
					continue
				}
				if err != nil {
					return err
				}
				done++
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, s, "counter"); string(b) != strconv.Itoa(writers*each) {
		t.Errorf("counter = %s, want %d: an If-Match write overwrote another", b, writers*each)
	}
}

// testConcurrentCreate: of many If-None-Match creates, exactly one wins.
func testConcurrentCreate(t *testing.T, s blobstore.Store) {
	const n = 8
	var mu sync.Mutex
	wins, losses := 0, 0
	var g errgroup.Group
	for i := range n {
		g.Go(func() error {
			_, err := s.Put(t.Context(), "once", []byte(strconv.Itoa(i)), blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, blobstore.ErrAlreadyExists):
				losses++
			default:
				return err
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if wins != 1 || losses != n-1 {
		t.Errorf("%d creates won and %d lost, want 1 and %d", wins, losses, n-1)
	}
}

// testConcurrentTree has writers create and delete blobs in shared
// directories while another writer keeps creating and deleting a blob
// whose name is also their prefix: the final listing must be exact.
func testConcurrentTree(t *testing.T, s blobstore.Store) {
	const writers, each = 4, 12
	ctx := t.Context()
	g, gctx := errgroup.WithContext(ctx)
	var want []string
	for w := range writers {
		for i := range each {
			if i%3 != 0 {
				want = append(want, fmt.Sprintf("t/shared/sub%d/w%d-%02d", i%2, w, i))
			}
		}
		g.Go(func() error {
			for i := range each {
				name := fmt.Sprintf("t/shared/sub%d/w%d-%02d", i%2, w, i)
				if _, err := s.Put(gctx, name, []byte(name), blobstore.PutOptions{}); err != nil {
					return err
				}
				if i%3 == 0 {
					if err := s.Delete(gctx, name, blobstore.Conditions{}); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		for i := range 2 * each {
			if _, err := s.Put(gctx, "t/shared", []byte("marker"), blobstore.PutOptions{}); err != nil {
				return err
			}
			if i%2 == 0 {
				if err := s.Delete(gctx, "t/shared", blobstore.Conditions{}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	want = append(want, "t/shared")
	slices.Sort(want)
	got, _ := listAll(t, s, blobstore.ListOptions{Prefix: "t/"})
	if !slices.Equal(got, want) {
		t.Errorf("List = %q\nwant %q", got, want)
	}
	for _, n := range want[1:] {
		if b := readAll(t, s, n); string(b) != n {
			t.Errorf("%q holds %q", n, b)
		}
	}
}

func testCancelled(t *testing.T, s blobstore.Store) {
	put(t, s, "f", []byte("x"), nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	id := blobstore.BlockID("n", 0)
	ops := map[string]func() error{
		"Stat": func() error { _, err := s.Stat(ctx, "f"); return err },
		"ReadAt": func() error {
			_, err := s.ReadAt(ctx, "f", make([]byte, 1), 0, "")
			return err
		},
		"List":       func() error { _, err := s.List(ctx, blobstore.ListOptions{}); return err },
		"Put":        func() error { _, err := s.Put(ctx, "g", nil, blobstore.PutOptions{}); return err },
		"StageBlock": func() error { return s.StageBlock(ctx, "g", id, []byte("x")) },
		"CommitBlocks": func() error {
			_, err := s.CommitBlocks(ctx, "g", nil, blobstore.PutOptions{})
			return err
		},
		"Delete": func() error { return s.Delete(ctx, "f", blobstore.Conditions{}) },
		"Copy":   func() error { _, err := s.Copy(ctx, "g", "f"); return err },
		"SetMetadata": func() error {
			_, err := s.SetMetadata(ctx, "f", map[string]string{"a": "b"}, blobstore.Conditions{})
			return err
		},
		"Check": func() error { return s.Check(ctx) },
		"Upload": func() error {
			_, err := blobstore.Upload(ctx, s, "g", bytes.NewReader(make([]byte, 100)), 100, blobstore.UploadOptions{BlockSize: 10, SingleShotLimit: -1})
			return err
		},
	}
	for name, op := range ops {
		wantErr(t, name+" with a cancelled context", op(), context.Canceled)
	}
	if a := stat(t, s, "f"); len(a.Metadata) != 0 {
		t.Errorf("cancelled SetMetadata happened: %+v", a)
	}
	_, err := s.Stat(t.Context(), "g")
	wantErr(t, "Stat of a blob written with a cancelled context", err, blobstore.ErrNotFound)
}
