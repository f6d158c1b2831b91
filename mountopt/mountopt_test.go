package mountopt

import (
	"fmt"
	"testing"
	"time"
)

// TestTable: every default is a value its option takes, and what Format
// writes, Parse reads back as the same value (`blobfs mount` passes its
// flags to its worker so).
func TestTable(t *testing.T) {
	for i := range Table {
		o := &Table[i]
		if o.Help == "" || o.set == nil {
			t.Errorf("%s: no help or nothing set", o.Name)
		}
		if o.Default != "" {
			v, err := o.Parse(o.Default)
			if err == nil {
				err = o.Check(v)
			}
			if err != nil {
				t.Errorf("%s: default %q: %v", o.Name, o.Default, err)
			}
		}
		for _, v := range []Value{0, 1, Value(o.Max)} {
			if o.Kind == Bool && v > 1 {
				continue
			}
			back, err := o.Parse(o.Format(v))
			if err != nil || back != v {
				t.Errorf("%s: Format(%d) = %q reads back as %d, %v", o.Name, v, o.Format(v), back, err)
			}
		}
	}
}

func TestParseAndCheck(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      Value
		err       string // "" for none; else the message of Parse or Check
	}{
		{"read-only", "true", 1, ""},
		{"read-only", "maybe", 0, "not true or false"},
		{"block-cache-mb", "512", 512, ""},
		{"block-cache-mb", "lots", 0, "not an integer"},
		{"upload-block-mb", "0", 0, "must be between 1 and 4000 (MiB)"},
		{"walk-ahead", "-1", -1, "must be between 0 (disabled) and 10000000"},
		{"uid", "4294967295", 4294967295, "must be between 0 and 4294967294"},
		{"attr-timeout", "120", Value(2 * time.Minute), ""},
		{"attr-timeout", "500ms", Value(500 * time.Millisecond), ""},
		{"attr-timeout", "-1s", Value(-time.Second), "must not be negative"},
		{"retry-max-delay", "25h", Value(25 * time.Hour), "must be at most 24h0m0s"},
		{"attr-timeout", "forever", 0, "not a duration like 1s, 500ms or 120 (seconds)"},
		{"umask", "027", 0o27, ""},
		{"umask", "9", 0, "not an octal number"},
		{"umask", "1000", 0o1000, "must be within 0777"},
	} {
		o := Lookup(tc.name)
		v, err := o.Parse(tc.raw)
		if err == nil {
			if v != tc.want {
				t.Errorf("%s=%s: %d, want %d", tc.name, tc.raw, v, tc.want)
			}
			err = o.Check(v)
		}
		if got := fmt.Sprint(err); tc.err == "" && err != nil || tc.err != "" && got != tc.err {
			t.Errorf("%s=%s: error %v, want %q", tc.name, tc.raw, err, tc.err)
		}
	}
}

// TestGiven: an owner or a mode given is every file's; the same value as
// a default is not.
func TestGiven(t *testing.T) {
	var s Settings
	Lookup("uid").ApplyDefault(&s, 1000)
	Lookup("file-mode").ApplyDefault(&s, 0o640)
	if s.FS.UID != 1000 || s.FS.FileMode != 0o640 || s.FS.ForceOwner || s.FS.ForcePerm {
		t.Errorf("defaults: %+v", s.FS)
	}
	Lookup("gid").Apply(&s, 100)
	Lookup("dir-mode").Apply(&s, 0o750)
	if s.FS.GID != 100 || !s.FS.ForceOwner || s.FS.DirMode != 0o750 || !s.FS.ForcePerm {
		t.Errorf("given: %+v", s.FS)
	}
}

// A zero that disables a cache or a count is negative in fusefs.Options,
// where zero is the default.
func ExampleOption_Apply() {
	var s Settings
	for _, opt := range []struct{ name, value string }{{"attr-timeout", "0"}, {"prefetch-files", "0"}, {"ro", "true"}, {"block-cache-mb", "512"}} {
		o := Lookup(opt.name)
		v, err := o.Parse(opt.value)
		if err == nil {
			err = o.Check(v)
		}
		if err != nil {
			fmt.Printf("%s=%s: %v\n", opt.name, opt.value, err)
			continue
		}
		o.Apply(&s, v)
	}
	fmt.Println(s.FS.AttrTimeout, s.FS.PrefetchFiles, s.FS.ReadOnly, s.Mount.ReadOnly, s.FS.BlockCacheBytes>>20)
	// Output: -1ns -1 true true 512
}
