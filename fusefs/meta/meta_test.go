package meta

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// TestCheckName: names a blob name cannot hold unchanged are refused with
// the errno an application expects.
func TestCheckName(t *testing.T) {
	for _, c := range []struct {
		name string
		want fuse.Status
	}{
		{"a", fuse.OK},
		{"with space", fuse.OK},
		{strings.Repeat("x", MaxComponent), fuse.OK},
		{strings.Repeat("x", MaxComponent+1), fuse.Status(syscall.ENAMETOOLONG)},
		{"", fuse.EINVAL},
		{".", fuse.EINVAL},
		{"..", fuse.EINVAL},
		{"trailing.", fuse.EINVAL},
		{"back\\slash", fuse.EINVAL},
		{"tab\there", fuse.EINVAL},
		{"del\x7f", fuse.EINVAL},
	} {
		if got := CheckName(c.name); got != c.want {
			t.Errorf("CheckName(%q) = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestEntryOf: a blob's kind comes from its metadata, in the layouts
// blobfuse2 and blobfs write; a directory marker and a special file have
// no size.
func TestEntryOf(t *testing.T) {
	mtime := time.Unix(1700000000, 0)
	for _, c := range []struct {
		what string
		md   map[string]string
		size int64
		kind Kind
		want int64
	}{
		{"plain file", nil, 10, KindFile, 10},
		{"marker", map[string]string{blobstore.MetaIsFolder: "true"}, 0, KindDir, 0},
		{"marker, any case", map[string]string{"Hdi_IsFolder": "TRUE"}, 0, KindDir, 0},
		{"symlink", map[string]string{blobstore.MetaIsSymlink: "true"}, 6, KindSymlink, 6},
		{"fifo", map[string]string{blobstore.MetaMode: "10644"}, 0, KindSpecial, 0},
	} {
		e := EntryOf(blobstore.Attrs{Name: "x", Size: c.size, ModTime: mtime, Metadata: c.md})
		if e.Kind != c.kind || e.Size != c.want {
			t.Errorf("%s: kind %v size %d, want %v size %d", c.what, e.Kind, e.Size, c.kind, c.want)
		}
	}
}

// TestPosixRoundTrip: attributes written to metadata read back the same.
func TestPosixRoundTrip(t *testing.T) {
	p := Posix{Perm: 0o640, HasPerm: true, UID: 1000, HasUID: true, GID: 50, HasGID: true,
		Atime: time.Unix(1, 2), Ctime: time.Unix(3, 4)}
	md := map[string]string{}
	WritePosix(md, KindFile, p)
	if got := ParsePosix(md); got != p {
		t.Fatalf("read back %+v, want %+v", got, p)
	}
	dev := Posix{Perm: 0o600, HasPerm: true, Special: syscall.S_IFCHR, Rdev: 0x0501}
	md = map[string]string{}
	WritePosix(md, KindSpecial, dev)
	if got := ParsePosix(md); got.Special != syscall.S_IFCHR || got.Rdev != 0x0501 || got.Perm != 0o600 {
		t.Fatalf("device node read back %+v, want %+v", got, dev)
	}
}
