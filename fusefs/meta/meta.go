// Package meta is how blobs become the file system's entries: a blob's
// name checked as a file name, its metadata read as a kind (file,
// directory marker, symlink, special file) and POSIX attributes, and
// written back. Entry is what a listing knows of a name.
//
// It reads and writes metadata maps and names only, and imports nothing
// of the project but blobstore (for the metadata keys) and contentsum (an
// entry's Content-MD5).
package meta

import (
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/contentsum"
)

// POSIX attributes: a file's, symlink's or special file's mode, owner,
// group, access and change times and device number live in its blob's
// metadata (blobstore.MetaMode, MetaUID, ...); a directory's on its marker
// blob (hdi_isfolder), which is created when a directory without one is
// given an attribute. They ride on requests blobfs makes anyway: the Put or
// CommitBlockList that writes a file, the Put of a marker, symlink or
// special file, and listings, which return metadata; only chmod, chown and
// utimensat on a file that is not being written cost a request of their
// own (Set Blob Metadata).
//
// A blob without the keys shows the mount's defaults (Options.UID, GID,
// Umask), so containers written by other tools (blobfuse2's layout) keep
// working. Options.ForceOwner and ForcePerm make the defaults win over
// what is stored, for a mount that wants one owner for everything. The
// root directory is the container and has no blob: it shows the defaults,
// with Options.RootMode as its mode when set, and a chmod or chown of it
// lasts for the mount's life only.
//
// Times:
//   - mtime: blobfs_mtime when set explicitly (utimensat), else rclone's
//     "mtime", else the blob's Last-Modified.
//   - ctime: blobfs_ctime when an attribute changed after the content, else
//     the content's time. A commit drops the key: Last-Modified is then
//     the change time.
//   - atime: blobfs_atime when set explicitly, else mtime. Reads update
//     it in memory only, with relatime's rule (when it is older than mtime
//     or a day old); writing it back would cost a request per file read.
//   - A directory's mtime and ctime follow the entries made, removed and
//     renamed in it through this mount, in memory (storing them would cost
//     a request per create); utimensat on a directory stores them.
//

// Posix are the attributes a blob's metadata may carry. A zero field
// that has no "has" flag is unset: the node shows the mount's default.
type Posix struct {
	Perm    uint32 // permission bits, 07777
	HasPerm bool
	// Special is the file type of a FIFO, socket or device node
	// (S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK); 0 for anything else.
	Special        uint32
	UID, GID       uint32
	HasUID, HasGID bool
	Atime, Ctime   time.Time // zero: unset
	Rdev           uint32
}

// Blob is what blobfs reads from a blob's metadata, found in one pass
// over its keys: a listing reads it for every entry (a map lookup per key
// that a blob lacks, each falling back to a case-insensitive scan, made
// reading four keys cost 600 ns an entry; one pass costs a fraction).
// Azure treats keys case-insensitively: listings return them as stored,
// headers canonicalised ("Hdi_isfolder").
type Blob struct {
	IsFolder, IsSymlink bool
	Mtime               time.Time // blobfs_mtime, else rclone's mtime; zero if neither
	Posix               Posix
}

func Read(md map[string]string) Blob {
	var m Blob
	var rclone string
	for k, v := range md {
		switch lowerASCII(k) {
		case blobstore.MetaIsFolder:
			m.IsFolder = strings.EqualFold(v, "true")
		case blobstore.MetaIsSymlink:
			m.IsSymlink = strings.EqualFold(v, "true")
		case blobstore.MetaMtime:
			m.Mtime = unixNanos(v)
		case blobstore.MetaRcloneMtime:
			rclone = v
		case blobstore.MetaMode:
			if mode, err := strconv.ParseUint(v, 8, 32); err == nil {
				m.Posix.Perm, m.Posix.HasPerm = uint32(mode)&0o7777, true
				switch t := uint32(mode) & syscall.S_IFMT; t {
				case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
					m.Posix.Special = t
				}
			}
		case blobstore.MetaUID:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.Posix.UID, m.Posix.HasUID = uint32(n), true
			}
		case blobstore.MetaGID:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.Posix.GID, m.Posix.HasGID = uint32(n), true
			}
		case blobstore.MetaAtime:
			m.Posix.Atime = unixNanos(v)
		case blobstore.MetaCtime:
			m.Posix.Ctime = unixNanos(v)
		case blobstore.MetaRdev:
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				m.Posix.Rdev = uint32(n)
			}
		}
	}
	if m.Mtime.IsZero() && rclone != "" {
		if t, err := time.Parse(time.RFC3339Nano, rclone); err == nil {
			m.Mtime = t
		}
	}
	return m
}

// lowerASCII lower-cases s, without allocating when it is lower case
// already (keys as blobfs writes them).
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// unixNanos reads a time in Unix nanoseconds; zero when it does not parse.
func unixNanos(v string) time.Time {
	if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// ParsePosix reads the attributes of a blob's metadata. Values that do not
// parse are ignored (the default shows), never an error: a listing must not
// fail because another tool wrote a key oddly.
func ParsePosix(md map[string]string) Posix { return Read(md).Posix }

// Mtime is the modification time the metadata sets, if any: blobfs's
// own key, else rclone's.
func Mtime(md map[string]string) (time.Time, bool) {
	t := Read(md).Mtime
	return t, !t.IsZero()
}

// Set sets key in md, replacing a key that differs only in case
// (Azure treats keys case-insensitively and reports them canonicalised).
func Set(md map[string]string, key, value string) {
	Delete(md, key)
	md[key] = value
}

func Delete(md map[string]string, key string) {
	for k := range md {
		if strings.EqualFold(k, key) {
			delete(md, k)
		}
	}
}

// WritePosix puts p's set attributes into md. kind's type bits are part of
// the mode, so that a blob says what it is even to a reader that knows
// only the mode.
func WritePosix(md map[string]string, kind Kind, p Posix) {
	if p.HasPerm {
		Set(md, blobstore.MetaMode, strconv.FormatUint(uint64(KindType(kind, p.Special)|p.Perm), 8))
	}
	if p.HasUID {
		Set(md, blobstore.MetaUID, strconv.FormatUint(uint64(p.UID), 10))
	}
	if p.HasGID {
		Set(md, blobstore.MetaGID, strconv.FormatUint(uint64(p.GID), 10))
	}
	if !p.Atime.IsZero() {
		Set(md, blobstore.MetaAtime, strconv.FormatInt(p.Atime.UnixNano(), 10))
	}
	if !p.Ctime.IsZero() {
		Set(md, blobstore.MetaCtime, strconv.FormatInt(p.Ctime.UnixNano(), 10))
	}
	if p.Special == syscall.S_IFCHR || p.Special == syscall.S_IFBLK {
		Set(md, blobstore.MetaRdev, strconv.FormatUint(uint64(p.Rdev), 10))
	}
}

// KindType is the S_IFMT bits of a node.
func KindType(kind Kind, special uint32) uint32 {
	switch kind {
	case KindDir:
		return syscall.S_IFDIR
	case KindSymlink:
		return syscall.S_IFLNK
	case KindSpecial:
		return special
	}
	return syscall.S_IFREG
}

// Same tells whether two sets of blob metadata are the same, names
// compared without case as Azure does.
func Same(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := Value(b, k); !ok || w != v {
			return false
		}
	}
	return true
}

// MadeEntry is the entry of a blob this mount just wrote with metadata md
// (a store's answer to a Put need not repeat the metadata).
func MadeEntry(a blobstore.Attrs, md map[string]string) Entry {
	if a.Metadata == nil {
		a.Metadata = md
	}
	return EntryOf(a)
}

// Limits of Azure Blob names (and of what blobfuse2 can read back).
const (
	maxBlobNameBytes = 1024
	MaxComponent     = 255
)

// CheckName refuses a file name that cannot be stored as a blob name
// component without mangling it.
func CheckName(name string) fuse.Status {
	switch {
	case len(name) > MaxComponent:
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

func CheckPath(path string) fuse.Status {
	if len(path) > maxBlobNameBytes {
		return fuse.Status(syscall.ENAMETOOLONG)
	}
	return fuse.OK
}

// Value reads a metadata key case-insensitively: Azure treats keys so,
// and the SDK returns them canonicalised from headers ("Hdi_isfolder") but
// as stored from listings.
func Value(md map[string]string, key string) (string, bool) {
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

func True(md map[string]string, key string) bool {
	v, _ := Value(md, key)
	return strings.EqualFold(v, "true")
}

// EntryOf reads the storage layout: a blob is a directory marker, a
// symlink or a regular file.
func EntryOf(a blobstore.Attrs) Entry {
	m := Read(a.Metadata)
	e := Entry{Kind: KindFile, Size: a.Size, Mtime: a.ModTime, ETag: a.ETag, Sum: contentsum.Of(a.ContentMD5), Attrs: m.Posix}
	switch {
	case m.IsFolder:
		e.Kind, e.Size = KindDir, 0
	case m.IsSymlink:
		e.Kind = KindSymlink
	case e.Attrs.Special != 0:
		e.Kind, e.Size = KindSpecial, 0
	}
	if e.Kind != KindSpecial {
		e.Attrs.Special = 0
	}
	if !m.Mtime.IsZero() {
		e.Mtime = m.Mtime
	}
	return e
}

// Copy returns a copy of md that the caller may change.
func Copy(md map[string]string) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		out[k] = v
	}
	return out
}

type Kind uint8

const (
	KindFile Kind = iota + 1
	KindDir
	KindSymlink
	// KindSpecial is a FIFO, socket or device node: a zero-length blob
	// whose type is in its mode (attrs.special).
	KindSpecial
)

func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindDir:
		return "dir"
	case KindSymlink:
		return "symlink"
	case KindSpecial:
		return "special"
	}
	return "unknown"
}

func JoinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// Entry is what a listing says about one name.
type Entry struct {
	Kind    Kind
	Size    int64
	Mtime   time.Time
	ETag    string
	Sum     contentsum.Sum // Content-MD5
	Target  string         // symlinks: unknown ("") in listings
	Pending bool           // created here, not yet committed
	Attrs   Posix
}

// Item is one name of a directory pass or listing.
type Item struct {
	Name  string
	Entry *Entry
}

func SplitPath(p string) (dir, name string) {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i], p[i+1:]
		}
	}
	return "", p
}
