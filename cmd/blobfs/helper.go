package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/mountopt"
)

// fstabIgnored are generic mount(8)/fstab options that mean nothing to
// blobfs itself.
var fstabIgnored = map[string]bool{
	"defaults": true, "rw": true, "auto": true, "noauto": true, "user": true,
	"users": true, "nouser": true, "_netdev": true, "nofail": true, "exec": true,
	"noexec": true, "suid": true, "nosuid": true, "dev": true, "nodev": true,
	"async": true, "atime": true, "noatime": true, "relatime": true,
}

// runMountHelper implements mount.blobfs SOURCE MOUNTPOINT [-o OPTIONS].
// SOURCE is an Azure container name, "azure:CONTAINER", or "local:/DIR".
// Every mount flag is accepted as an option, and the aliases of
// mountopt's table: -o container=x,ro,block-cache-mb=512. Mounts in the
// background, as mount(8) expects.
func runMountHelper(args []string) error {
	var positional, opts []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-o" && i+1 < len(args):
			opts = append(opts, strings.Split(args[i+1], ",")...)
			i++
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case a == "-n", a == "-v", a == "-s", a == "-f":
			// mount(8) passes these: no mtab, verbose, sloppy, fake.
		case strings.HasPrefix(a, "-t"):
			if a == "-t" {
				i++
			}
		default:
			positional = append(positional, a)
		}
	}
	if len(positional) != 2 {
		return usageError{errors.New("usage: mount.blobfs SOURCE MOUNTPOINT [-o OPTIONS]")}
	}
	flags, err := helperFlags(positional[0], opts)
	if err != nil {
		return usageError{err}
	}
	c := newMountConfig()
	fl := pflag.NewFlagSet("mount.blobfs", pflag.ContinueOnError)
	registerMountFlags(fl, c)
	fl.SetOutput(io.Discard)
	if err := fl.Parse(flags); err != nil {
		return usageError{fmt.Errorf("mount.blobfs: %v (the -o options are the flags of blobfs mount --help, without the dashes)", err)}
	}
	if err := c.checkFlags(fl); err != nil {
		return usageError{err}
	}
	return mountWith(c, positional[1], append(flags, positional[1]))
}

// helperFlags turns a SOURCE and -o options into mount flags.
func helperFlags(source string, opts []string) ([]string, error) {
	var flags []string
	switch {
	case strings.HasPrefix(source, "local:"):
		flags = append(flags, "--local-dir="+strings.TrimPrefix(source, "local:"))
	case strings.HasPrefix(source, "azure:"):
		flags = append(flags, "--container="+strings.TrimPrefix(source, "azure:"))
	case strings.HasPrefix(source, "blobfs:") && source != "blobfs:local":
		// The source a mount shows (mountConfig.fsName), copied from
		// mount(8)'s output.
		flags = append(flags, "--container="+strings.TrimPrefix(source, "blobfs:"))
	case source == "" || source == "none" || source == "blobfs" || source == "blobfs:local":
	default:
		flags = append(flags, "--container="+source)
	}
	for _, o := range opts {
		o = strings.TrimSpace(o)
		if strings.ContainsFunc(o, unicode.IsControl) {
			return nil, fmt.Errorf("option %q: contains a control character", o)
		}
		switch {
		case o == "" || fstabIgnored[o] || strings.HasPrefix(o, "x-"):
		case o == "foreground" || o == "fg":
			return nil, fmt.Errorf("option %q: mount.blobfs always detaches; use blobfs mount --foreground", o)
		default:
			// Underscores stand for dashes in the name (allow_other),
			// not in the value (log_file=/var/log/my_app.log).
			name, value, hasValue := strings.Cut(o, "=")
			name = strings.ReplaceAll(name, "_", "-")
			if opt := mountopt.Lookup(name); opt != nil {
				name = opt.Name // ro, validate-md5: the table's aliases
			}
			if hasValue {
				name += "=" + value
			}
			flags = append(flags, "--"+name)
		}
	}
	return flags, nil
}
