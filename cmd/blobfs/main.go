// Command blobfs mounts an Azure Blob Storage container (or a local
// directory standing in for one) as a POSIX filesystem.
//
//	blobfs mount [flags] MOUNTPOINT      mount (in the background unless --foreground)
//	blobfs unmount [-z] MOUNTPOINT       unmount
//	blobfs csi [flags]                   the Kubernetes CSI driver
//	blobfs keeper --socket PATH          holds the CSI driver's mounts across its restarts
//	blobfs registrar [flags]             registers the CSI node plugin with kubelet
//	blobfs version                       (also blobfs --version)
//	blobfs completion bash|zsh|fish|powershell
//
// The commands are cobra commands with pflag flags (commands.go); the
// single-dash long flags of the Go flag package (-container) are still
// accepted.
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
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/blobfs/blobfs/blobstore"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// Every command logs through newLogger; a logger left nil somewhere
	// falls back to slog's default, which redacts too (and takes the log
	// package's output with it).
	slog.SetDefault(slog.New(blobstore.NewRedactingHandler(slog.NewTextHandler(os.Stderr, nil))))
	if err := run(os.Args); err != nil {
		var child childExit
		if errors.As(err, &child) {
			os.Exit(child.code) // the driver said why (csirestart.go)
		}
		var u usageError
		if errors.As(err, &u) {
			printError(err)
			os.Exit(2)
		}
		if !errors.As(err, new(errLogged)) {
			printError(err)
		}
		os.Exit(1)
	}
}

// printError writes the command's error to stderr, redacted: it may quote
// a flag or a mount option into which a credential was pasted, or a
// request, and the terminal or the container's log keeps it.
func printError(err error) {
	fmt.Fprintf(os.Stderr, "blobfs: %s\n", blobstore.Redact(err.Error()))
}

// usageError is a mistake in the command line: main exits with status 2.
type usageError struct{ error }

func run(args []string) error {
	if strings.HasPrefix(filepath.Base(args[0]), "mount.") {
		return runMountHelper(args[1:])
	}
	root := newRootCommand()
	root.SetArgs(normalizeArgs(root, args[1:]))
	return root.Execute()
}
