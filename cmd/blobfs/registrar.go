package main

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/csi"
)

// runRegistrar is `blobfs registrar`: registers the node plugin with
// kubelet (the job of node-driver-registrar).
func runRegistrar(cfg csi.RegistrarConfig, logs logFlags) error {
	logger, _, err := newLogger(logs, os.Stderr)
	if err != nil {
		return err
	}
	cfg.Logger = logger
	r, err := csi.NewRegistrar(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signalContext(logger, "the registrar stops and removes its registration socket, if it made one")
	defer stop()
	return r.Run(ctx)
}

// registerRegistrarFlags declares the flags of `blobfs registrar`; keep the
// table in docs/reference.md in step (docs_test.go checks).
func registerRegistrarFlags(fl *pflag.FlagSet, cfg *csi.RegistrarConfig, logs *logFlags) {
	fl.StringVar(&cfg.DriverAddress, "csi-address", "/csi/csi.sock", "the driver's CSI socket as this process sees it (a path or unix:///path)")
	fl.StringVar(&cfg.KubeletDriverPath, "kubelet-registration-path", "/var/lib/kubelet/plugins/"+csi.DefaultDriverName+"/csi.sock", "the driver's CSI socket as kubelet sees it (a host path)")
	fl.StringVar(&cfg.RegistrationDir, "registration-dir", "/registration", "kubelet's plugin registration directory (KUBELET_DIR/plugins_registry on the host)")
	fl.DurationVar(&cfg.CheckInterval, "check-interval", 0, "how often the driver and the registration socket are checked (default 1s)")
	logs.register(fl)
}
