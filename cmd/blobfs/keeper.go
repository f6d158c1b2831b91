package main

import (
	"errors"
	"os"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/fusefs/handoff"
)

// runKeeper is `blobfs keeper`: the process that holds the driver's FUSE
// connections while the driver restarts (fusefs/handoff/keeper.go). It runs as a
// container of its own in the node pod, so that a crash or an update of
// the driver's container leaves it alive.
func runKeeper(socket *string, logs *logFlags) error {
	if *socket == "" {
		return usageError{errors.New("keeper needs --socket")}
	}
	logger, _, err := newLogger(*logs, os.Stderr)
	if err != nil {
		return err
	}
	ctx, stop := signalContext(logger, "the keeper stops; the mounts it holds die with it unless a driver or a newer keeper holds them")
	defer stop()
	return handoff.NewKeeper(*socket, logger).Run(ctx)
}

// registerKeeperFlags declares the flags of `blobfs keeper`; keep the
// table in docs/reference.md in step (docs_test.go checks).
func registerKeeperFlags(fl *pflag.FlagSet) (socket *string, logs *logFlags) {
	socket = fl.String("socket", "", "unix socket to listen on, e.g. /var/lib/kubelet/plugins/blob.csi.blobfs.io/keeper.sock (required; the driver's --keeper-socket)")
	logs = new(logFlags)
	logs.register(fl)
	return socket, logs
}
