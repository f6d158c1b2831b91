package fusefs

import (
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
)

// Limits of Azure Blob names (and of what blobfuse2 can read back).
const (
	maxBlobNameBytes = 1024
	maxComponent     = 255
)

// checkName refuses a file name that cannot be stored as a blob name
// component without mangling it.
func checkName(name string) fuse.Status {
	switch {
	case len(name) > maxComponent:
		return fuse.Status(syscall.ENAMETOOLONG)
	case name == "" || name == "." || name == "..":
		return fuse.EINVAL
	case strings.HasSuffix(name, "."):
		// Azure drops trailing dots of path segments.
		return fuse.EINVAL
	}
	for i := 0; i < len(name); i++ {
		// Control characters do not survive blob listings' XML; "\\" is
		// turned into "/" by some Azure tools.
		if c := name[i]; c < 0x20 || c == 0x7f || c == '\\' || c == '/' {
			return fuse.EINVAL
		}
	}
	return fuse.OK
}

func checkPath(path string) fuse.Status {
	if len(path) > maxBlobNameBytes {
		return fuse.Status(syscall.ENAMETOOLONG)
	}
	return fuse.OK
}

// metaValue reads a metadata key case-insensitively: Azure treats keys so,
// and the SDK returns them canonicalised from headers ("Hdi_isfolder") but
// as stored from listings.
func metaValue(md map[string]string, key string) (string, bool) {
	if v, ok := md[key]; ok {
		return v, true
	}
	for k, v := range md {
		if strings.EqualFold(k, key) {
			return v, true
		}
	}
	return "", false
}

func metaTrue(md map[string]string, key string) bool {
	v, _ := metaValue(md, key)
	return strings.EqualFold(v, "true")
}

// entryFromAttrs reads the storage layout: a blob is a directory marker, a
// symlink or a regular file.
func entryFromAttrs(a blobstore.Attrs) dirEntry {
	m := readMeta(a.Metadata)
	e := dirEntry{kind: kindFile, size: a.Size, mtime: a.ModTime, etag: a.ETag, sum: contentsum.Of(a.ContentMD5), attrs: m.posix}
	switch {
	case m.isFolder:
		e.kind, e.size = kindDir, 0
	case m.isSymlink:
		e.kind = kindSymlink
	case e.attrs.special != 0:
		e.kind, e.size = kindSpecial, 0
	}
	if e.kind != kindSpecial {
		e.attrs.special = 0
	}
	if !m.mtime.IsZero() {
		e.mtime = m.mtime
	}
	return e
}

// copyMeta returns a copy of md that the caller may change.
func copyMeta(md map[string]string) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		out[k] = v
	}
	return out
}
