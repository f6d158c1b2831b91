// Package mountopt is the table of blobfs's mount options: the settings
// of one mounted filesystem (its caches, block sizes, timeouts, owners and
// modes, retries and FUSE session). Each option is defined once, here:
// its name and the other names it goes by, the kind and bounds of its
// value, its default, its help text, what it sets, and whether a CSI
// volume's mountOptions may set it. `blobfs mount` registers its flags
// from the table, mount.blobfs maps its -o options onto those flags, and
// the CSI driver checks and applies a volume's mount options with it, so
// that an option means the same, and is bounded the same, everywhere.
//
// What is not an option of one filesystem is not in the table, and stays
// with the command that has it (cmd/blobfs): which store to serve
// (--container, --local-dir...), where the process keeps its files
// (--cache-dir, --disk-cache-*), its listing cache, which all its mounts
// share (--list-cache-mb), and how it runs (--foreground, --log-*,
// --restart-limit...). The CSI driver has its own flags for each of those,
// set for the whole node, so none is a volume's to choose.
package mountopt

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/fusefs/listing"
)

// Settings are what mount options set.
type Settings struct {
	FS    fusefs.Options
	Mount kernel.MountOptions
	Retry blobstore.RetryPolicy
}

// Kind is what an option's value is.
type Kind int

const (
	// Bool is true or false; an option given without a value is true.
	Bool Kind = iota
	// Int is a decimal integer in [Min, Max], in Unit.
	Int
	// Duration is Go's form (1s, 500ms) or whole seconds (FUSE's
	// attr_timeout=120), in [0, Max].
	Duration
	// Mode is permission bits in octal, at most Max.
	Mode
)

// String names the kind as `blobfs mount --help` shows it.
func (k Kind) String() string {
	return [...]string{"bool", "int", "duration", "octal"}[k]
}

// Value is an option's value: a Bool's 0 or 1, an Int, a Duration in
// nanoseconds, a Mode's bits.
type Value int64

func (v Value) Bool() bool              { return v != 0 }
func (v Value) Int() int64              { return int64(v) }
func (v Value) Duration() time.Duration { return time.Duration(v) }
func (v Value) Mode() uint32            { return uint32(v) }

// Option is one row of the table.
type Option struct {
	// Name is the `blobfs mount` flag, and the name recorded for a CSI
	// volume.
	Name string
	// Aliases are other names -o lists and CSI mountOptions take, as
	// mount(8) and blobfuse2 users know them.
	Aliases []string
	Kind    Kind
	// Min and Max bound an Int (in Unit); Max bounds a Duration (in
	// nanoseconds) and a Mode.
	Min, Max int64
	Unit     string
	// Zero is what an Int's 0 means when it is not an amount: a bound
	// reads "between 0 (disabled) and ...".
	Zero string
	// Default is `blobfs mount`'s default, as it is written ("" for
	// none: nothing is set). CSI volumes have defaults of their own.
	Default string
	// Help is the flag's line in `blobfs mount --help`.
	Help string
	// CSI: a CSI volume's mountOptions may set it.
	CSI bool
	// set applies a value; given, if not nil, is what giving the option
	// at all does besides (uid given: the owner of every file).
	set   func(s *Settings, v Value)
	given func(s *Settings)
}

// Parse reads a value as it is written; it does not check bounds
// (Check).
func (o *Option) Parse(raw string) (Value, error) {
	switch o.Kind {
	case Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return 0, fmt.Errorf("not true or false")
		}
		if b {
			return 1, nil
		}
		return 0, nil
	case Int:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("not an integer")
		}
		return Value(n), nil
	case Duration:
		if n, err := strconv.ParseUint(raw, 10, 32); err == nil {
			return Value(time.Duration(n) * time.Second), nil
		}
		d, err := time.ParseDuration(raw)
		if err != nil {
			return 0, fmt.Errorf("not a duration like 1s, 500ms or 120 (seconds)")
		}
		return Value(d), nil
	default:
		n, err := strconv.ParseUint(raw, 8, 32)
		if err != nil {
			return 0, fmt.Errorf("not an octal number")
		}
		return Value(n), nil
	}
}

// Check says whether v is within the option's bounds. Its message is the
// bound, for the caller to put after the option's name and value.
func (o *Option) Check(v Value) error {
	switch o.Kind {
	case Int:
		if int64(v) < o.Min || int64(v) > o.Max {
			lo, unit := strconv.FormatInt(o.Min, 10), ""
			if o.Min == 0 && o.Zero != "" {
				lo += " (" + o.Zero + ")"
			}
			if o.Unit != "" {
				unit = " (" + o.Unit + ")"
			}
			return fmt.Errorf("must be between %s and %d%s", lo, o.Max, unit)
		}
	case Duration:
		if v < 0 {
			return fmt.Errorf("must not be negative")
		}
		if int64(v) > o.Max {
			return fmt.Errorf("must be at most %v", time.Duration(o.Max))
		}
	case Mode:
		if int64(v) > o.Max {
			return fmt.Errorf("must be within %#o", o.Max)
		}
	}
	return nil
}

// Apply sets what the option, given with value v, sets.
func (o *Option) Apply(s *Settings, v Value) {
	o.set(s, v)
	if o.given != nil {
		o.given(s)
	}
}

// ApplyDefault sets v as the option's default: as Apply, but not given.
func (o *Option) ApplyDefault(s *Settings, v Value) {
	o.set(s, v)
}

// Format writes v as `blobfs mount --help` shows it, in a form Parse
// reads back; zero is "0", which --help takes for "no default".
func (o *Option) Format(v Value) string {
	switch {
	case o.Kind == Bool:
		return strconv.FormatBool(v.Bool())
	case v == 0:
		return "0"
	case o.Kind == Duration:
		return v.Duration().String()
	case o.Kind == Mode:
		return fmt.Sprintf("0%03o", int64(v))
	}
	return strconv.FormatInt(int64(v), 10)
}

// Lookup finds an option by its name or an alias; nil if there is none.
func Lookup(name string) *Option {
	return byName[name]
}

// byName indexes Table by every name.
var byName = func() map[string]*Option {
	m := map[string]*Option{}
	for i := range Table {
		for _, n := range append([]string{Table[i].Name}, Table[i].Aliases...) {
			if m[n] != nil {
				panic("mount option " + n + " defined twice")
			}
			m[n] = &Table[i]
		}
	}
	return m
}()

const (
	day = int64(24 * time.Hour)
	// maxID is the largest uid or gid: (uid_t)-1 means "no change".
	maxID = 1<<32 - 2
)

// Table is every mount option. Bounds are wide enough for any one mount
// and keep a CSI volume, which any author of a pod with an inline volume
// can set up, from asking the node for unbounded memory or goroutines.
var Table = []Option{
	{Name: "block-cache-mb", Kind: Int, Min: 2, Max: 64 << 10, Unit: "MiB", Default: "256", CSI: true,
		Help: "memory for the read block cache and read-ahead, MiB",
		set:  func(s *Settings, v Value) { s.FS.BlockCacheBytes = v.Int() << 20 }},
	{Name: "read-block-mb", Kind: Int, Min: 1, Max: 256, Unit: "MiB", Default: "8", CSI: true,
		Help: "size of one ranged read, MiB",
		set:  func(s *Settings, v Value) { s.FS.ReadBlockSize = v.Int() << 20 }},
	{Name: "readahead-blocks", Kind: Int, Min: 0, Max: 1024, Zero: "half of the cache, at most 32", Default: "0", CSI: true,
		Help: "read-ahead fetches in flight, in blocks; the window ahead of a sequential reader is twice that, at most 3/4 of the cache (default: half of the cache, at most 32)",
		set:  func(s *Settings, v Value) { s.FS.MaxReadAheadBlocks = int(v) }},
	{Name: "prefetch-files", Kind: Int, Min: 0, Max: 1024, Zero: "disabled", Default: "16", CSI: true,
		Help: "small files fetched ahead when a directory's files are read one after another in name order (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.PrefetchFiles = zeroDisables(v) }},
	{Name: "walk-ahead", Kind: Int, Min: 0, Max: 10_000_000, Zero: "disabled", Default: strconv.Itoa(listing.DefaultWalkAhead), CSI: true,
		Help: "names a directory walk (find, du, ls -R) may list ahead of the walker from one flat listing of the tree (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.WalkAhead = zeroDisables(v) }},
	// 4000 MiB is Azure's largest block.
	{Name: "upload-block-mb", Kind: Int, Min: 1, Max: 4000, Unit: "MiB", Default: strconv.Itoa(fusefs.DefaultUploadBlockSize >> 20), CSI: true,
		Help: "size of one staged upload block, MiB",
		set:  func(s *Settings, v Value) { s.FS.UploadBlockSize = v.Int() << 20 }},
	{Name: "upload-concurrency", Kind: Int, Min: 1, Max: 256, Default: "16", CSI: true,
		Help: "blocks uploaded in parallel per file (twice as many in flight over all files being written)",
		set:  func(s *Settings, v Value) { s.FS.UploadConcurrency = int(v) }},
	{Name: "write-back", Kind: Bool, Default: "false", CSI: true,
		Help: "close returns once the data is on local disk; the upload follows in the background (fsync still waits for the store)",
		set:  func(s *Settings, v Value) { s.FS.WriteBack = v.Bool() }},
	{Name: "write-back-mb", Kind: Int, Min: 1, Max: 1 << 30, Unit: "MiB", Default: strconv.Itoa(fusefs.DefaultWriteBackBytes >> 20), CSI: true,
		Help: "with --write-back: closed files' bytes that may wait for upload, MiB; over it, close uploads first",
		set:  func(s *Settings, v Value) { s.FS.WriteBackBytes = v.Int() << 20 }},
	{Name: "attr-timeout", Kind: Duration, Max: day, Default: "1s", CSI: true,
		Help: "how long file attributes are cached (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.AttrTimeout = zeroDisablesTimeout(v) }},
	{Name: "entry-timeout", Kind: Duration, Max: day, Default: "1s", CSI: true,
		Help: "how long name lookups are cached (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.EntryTimeout = zeroDisablesTimeout(v) }},
	{Name: "negative-timeout", Kind: Duration, Max: day, Default: "1s", CSI: true,
		Help: "how long a missing name is remembered (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.NegativeTimeout = zeroDisablesTimeout(v) }},
	{Name: "list-timeout", Kind: Duration, Max: day, Default: "1s", CSI: true,
		Help: "how long directory listings are cached (0 disables)",
		set:  func(s *Settings, v Value) { s.FS.ListTimeout = zeroDisablesTimeout(v) }},
	{Name: "read-only", Aliases: []string{"ro"}, Kind: Bool, Default: "false", CSI: true,
		Help: "mount read-only",
		set:  func(s *Settings, v Value) { s.FS.ReadOnly, s.Mount.ReadOnly = v.Bool(), v.Bool() }},
	{Name: "allow-other", Kind: Bool, Default: "false", CSI: true,
		Help: "let users other than the mounting one use the mount",
		set:  func(s *Settings, v Value) { s.Mount.AllowOther = v.Bool() }},
	// Given, uid and gid are the owner of every file, as blobfuse2 and
	// rclone have it. No default: `blobfs mount` gives its caller's.
	{Name: "uid", Kind: Int, Min: 0, Max: maxID, CSI: true,
		Help:  "owner of files that store none; given, the owner of every file (chown refused)",
		set:   func(s *Settings, v Value) { s.FS.UID = uint32(v) },
		given: func(s *Settings) { s.FS.ForceOwner = true }},
	{Name: "gid", Kind: Int, Min: 0, Max: maxID, CSI: true,
		Help:  "group of files that store none; given, the group of every file (chown refused)",
		set:   func(s *Settings, v Value) { s.FS.GID = uint32(v) },
		given: func(s *Settings) { s.FS.ForceOwner = true }},
	{Name: "umask", Kind: Mode, Max: 0o777, Default: "022", CSI: true,
		Help: "umask applied to modes 0777 (directories) and 0666 (files) of files that store no mode, in octal",
		set:  func(s *Settings, v Value) { s.FS.Umask = v.Mode() }},
	{Name: "file-mode", Kind: Mode, Max: 0o7777, CSI: true,
		Help:  "permissions of every file, in octal, whatever is stored (chmod refused; default: stored, else 0666 minus --umask)",
		set:   func(s *Settings, v Value) { s.FS.FileMode = v.Mode() },
		given: func(s *Settings) { s.FS.ForcePerm = true }},
	{Name: "dir-mode", Kind: Mode, Max: 0o7777, CSI: true,
		Help:  "permissions of every directory, in octal, whatever is stored (chmod refused; default: stored, else 0777 minus --umask)",
		set:   func(s *Settings, v Value) { s.FS.DirMode = v.Mode() },
		given: func(s *Settings) { s.FS.ForcePerm = true }},
	{Name: "posix-attrs", Kind: Bool, Default: "true", CSI: true,
		Help: "store modes, owners, times and special files in blob metadata; false never writes them (chmod, chown and mknod of special files refused)",
		set:  func(s *Settings, v Value) { s.FS.NoAttrWrites = !v.Bool() }},
	// validate-md5: blobfuse2's name for the same check.
	{Name: "verify-md5", Aliases: []string{"validate-md5"}, Kind: Bool, Default: "true", CSI: true,
		Help: "check whole reads of a blob, and the content a change builds on, against its Content-MD5; a mismatch fails with EIO",
		set:  func(s *Settings, v Value) { s.FS.NoContentCheck = !v.Bool() }},
	{Name: "fuse-readers", Kind: Int, Min: 1, Max: 64, Default: "8", CSI: true,
		Help: "goroutines reading FUSE requests",
		set:  func(s *Settings, v Value) { s.Mount.Readers = int(v) }},
	// Not a CSI option: it never was on the driver's allow-list, and
	// letting a volume write the kernel's read-ahead of its mount (in
	// sysfs, as root) is a decision of its own, not this table's.
	{Name: "kernel-readahead-kb", Kind: Int, Min: -1, Max: math.MaxInt32, Unit: "KiB", Default: "4096",
		Help: "kernel read-ahead for the mount, KiB (root only; -1 keeps the kernel's 128)",
		set:  func(s *Settings, v Value) { s.Mount.ReadAheadKB = int(v) }},
	{Name: "retry-attempts", Kind: Int, Min: 0, Max: 100, Zero: "the default, 5", Default: "0", CSI: true,
		Help: "tries of one store request that fails with throttling or a transient error (a try that gets no answer within 2 minutes is one), the first included; one only while the mount's retry budget is spent (default 5)",
		set:  func(s *Settings, v Value) { s.Retry.MaxAttempts = int(v) }},
	{Name: "retry-max-delay", Kind: Duration, Max: day, Default: "0", CSI: true,
		Help: "longest wait between tries (default 5s)",
		set:  func(s *Settings, v Value) { s.Retry.MaxDelay = v.Duration() }},
	{Name: "debug-fuse", Kind: Bool, Default: "false", CSI: true,
		Help: "log every FUSE request and reply (very verbose)",
		set:  func(s *Settings, v Value) { s.Mount.Debug = v.Bool() }},
}

// zeroDisables: 0 disables a count (-1 in fusefs.Options, where 0 is
// the default).
func zeroDisables(v Value) int {
	if v == 0 {
		return -1
	}
	return int(v)
}

// zeroDisablesTimeout: 0 disables a cache (negative in fusefs.Options).
func zeroDisablesTimeout(v Value) time.Duration {
	if v == 0 {
		return -1
	}
	return v.Duration()
}
