// Command blobfs mounts an Azure Blob Storage container (or a local
// directory standing in for one) as a POSIX filesystem.
//
//	blobfs mount [flags] MOUNTPOINT      mount (in the background unless --foreground)
//	blobfs unmount [-z] MOUNTPOINT       unmount
//	blobfs csi [flags]                   the Kubernetes CSI driver
//	blobfs registrar [flags]             registers the CSI node plugin with kubelet
//	blobfs --version
//
// In the background, `blobfs mount` is a supervisor that holds the mount and
// runs the hidden `blobfs mount-worker` to serve it, restarting it if it
// dies (supervise.go).
//
// Installed as mount.blobfs, it is the helper that mount(8) and /etc/fstab
// call: mount.blobfs SOURCE MOUNTPOINT [-o OPTIONS].
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := run(os.Args); err != nil {
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(os.Stderr, "blobfs: %v\n", err)
			os.Exit(2)
		}
		if !errors.As(err, new(errLogged)) {
			fmt.Fprintf(os.Stderr, "blobfs: %v\n", err)
		}
		os.Exit(1)
	}
}

type usageError struct{ error }

// parseFlags parses a subcommand's flags. A mistake is one line that points
// to --help, not the whole usage (which can run to 60 lines and hide the
// mistake); -h/--help prints the usage to stdout and reports help, and the
// caller returns nil.
func parseFlags(fl *flag.FlagSet, args []string) (help bool, err error) {
	usage := fl.Usage
	fl.SetOutput(io.Discard)
	fl.Usage = func() {}
	err = fl.Parse(args)
	fl.SetOutput(os.Stdout)
	fl.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fl.Usage()
		return true, nil
	}
	if err != nil {
		return false, usageError{fmt.Errorf("%s: %v (see blobfs %s --help)", fl.Name(), err, fl.Name())}
	}
	return false, nil
}

// parseNoArgs parses the flags of a subcommand that takes no positional
// arguments, as parseFlags does.
func parseNoArgs(fl *flag.FlagSet, args []string) (help bool, err error) {
	if help, err := parseFlags(fl, args); help || err != nil {
		return help, err
	}
	if fl.NArg() != 0 {
		return false, usageError{fmt.Errorf("%s takes no arguments, got %q", fl.Name(), fl.Args())}
	}
	return false, nil
}

const usage = `usage:
  blobfs mount [flags] MOUNTPOINT     mount a container (see blobfs mount --help)
  blobfs unmount [-z] MOUNTPOINT      unmount; -z detaches a busy mount lazily
  blobfs csi [flags]                  the Kubernetes CSI driver (see blobfs csi --help)
  blobfs keeper --socket PATH         hold the driver's FUSE mounts across its restarts
  blobfs registrar [flags]            registers the CSI node plugin with kubelet
  blobfs --version
  mount.blobfs SOURCE MOUNTPOINT [-o OPTIONS]   (as called by mount(8) and fstab)`

func run(args []string) error {
	if strings.HasPrefix(filepath.Base(args[0]), "mount.") {
		return runMountHelper(args[1:])
	}
	if len(args) < 2 {
		return usageError{errors.New(usage)}
	}
	switch args[1] {
	case "mount":
		return runMount(args[2:])
	case "unmount", "umount":
		return runUnmount(args[2:])
	case "csi":
		return runCSI(args[2:])
	case "keeper":
		return runKeeper(args[2:])
	case workerMode:
		return runMountWorker(args[2:])
	case "registrar":
		return runRegistrar(args[2:])
	case "--version", "-version", "version":
		fmt.Println("blobfs", version)
		return nil
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	}
	return usageError{fmt.Errorf("unknown command %q\n%s", args[1], usage)}
}

func runUnmount(args []string) error {
	fl := flag.NewFlagSet("unmount", flag.ContinueOnError)
	lazy := fl.Bool("z", false, "lazy: detach now even if busy")
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "usage: blobfs unmount [-z] MOUNTPOINT")
		fl.PrintDefaults()
	}
	if help, err := parseFlags(fl, args); help || err != nil {
		return err
	}
	if fl.NArg() != 1 {
		return usageError{errors.New("unmount needs exactly one MOUNTPOINT")}
	}
	return unmountPath(fl.Arg(0), *lazy)
}
