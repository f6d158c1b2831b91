package main

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// FuzzFstabOptions feeds mount.blobfs's option handling (the SOURCE and
// the -o list of an fstab line) arbitrary input. It must never panic;
// every error is one line; "ro" always mounts read-only; and whatever the
// flag checks accept, the filesystem accepts too, so that a bad option is
// refused before anything is mounted rather than by a background worker.
func FuzzFstabOptions(f *testing.F) {
	for _, seed := range [][2]string{
		{"mycontainer", "defaults,_netdev,nofail"},
		{"azure:c", "ro,allow_other,block-cache-mb=512"},
		{"local:/srv/data", "x-systemd.automount,cache_dir=/var/cache/b"},
		{"c", "foreground"},
		{"c", "upload-block-mb=0"},
		{"c", "umask=0999,uid=-1"},
		{"local:/x", "container=y"},
		{"", "block-cache-mb=8,read-block-mb=8"},
		{"c", "attr-timeout=-1s,,nonempty"},
		{"c", "read-block-mb=300"},
		{"c", "log-level=loud"},
	} {
		f.Add(seed[0], seed[1])
	}
	store := blobstore.NewMemory()
	f.Fuzz(func(t *testing.T, source, optList string) {
		opts := strings.Split(optList, ",")
		oneLine := func(what string, err error) {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s: error is not one line: %q", what, err)
			}
		}
		flags, err := helperFlags(source, opts)
		if err != nil {
			oneLine("helperFlags", err)
			return
		}
		c := &mountConfig{}
		fl := pflag.NewFlagSet("mount.blobfs", pflag.ContinueOnError)
		fl.SetOutput(io.Discard)
		registerMountFlags(fl, c)
		if err := fl.Parse(flags); err != nil {
			oneLine("parse", err)
			return
		}
		if fl.NArg() != 0 {
			return // an option that is not a flag ends the flags; the helper then refuses the extra argument
		}
		if err := c.checkFlags(fl); err != nil {
			oneLine("checkFlags", err)
			return
		}
		if slices.Contains(opts, "ro") && !c.FS.ReadOnly {
			t.Fatalf("%q: ro did not make the mount read-only", optList)
		}
		o, err := c.fsOptions(slog.New(slog.DiscardHandler))
		if err != nil {
			oneLine("fsOptions", err)
			return
		}
		o.CacheDir = t.TempDir()
		fsys, err := fusefs.New(store, o)
		if err != nil {
			t.Fatalf("%q passed the flag checks, but the filesystem refuses it: %v", optList, err)
		}
		fsys.Close()
	})
}
