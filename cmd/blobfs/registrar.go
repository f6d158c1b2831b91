package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/blobfs/blobfs/csi"
)

// runRegistrar is `blobfs registrar`: registers the node plugin with
// kubelet (the job of node-driver-registrar).
func runRegistrar(args []string) error {
	var cfg csi.RegistrarConfig
	var logLevel string
	fl := flag.NewFlagSet("registrar", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintln(fl.Output(), "usage: blobfs registrar [flags]   (registers the CSI node plugin with kubelet)")
		fl.PrintDefaults()
	}
	registerRegistrarFlags(fl, &cfg, &logLevel)
	if help, err := parseNoArgs(fl, args); help || err != nil {
		return err
	}
	logger, err := newLogger(logLevel, "", os.Stderr)
	if err != nil {
		return err
	}
	cfg.Logger = logger
	r, err := csi.NewRegistrar(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return r.Run(ctx)
}

// registerRegistrarFlags declares the flags of `blobfs registrar`; keep the
// table in docs/reference.md in step (docs_test.go checks).
func registerRegistrarFlags(fl *flag.FlagSet, cfg *csi.RegistrarConfig, logLevel *string) {
	fl.StringVar(&cfg.DriverAddress, "csi-address", "/csi/csi.sock", "the driver's CSI socket as this process sees it (a path or unix:///path)")
	fl.StringVar(&cfg.KubeletDriverPath, "kubelet-registration-path", "/var/lib/kubelet/plugins/"+csi.DefaultDriverName+"/csi.sock", "the driver's CSI socket as kubelet sees it (a host path)")
	fl.StringVar(&cfg.RegistrationDir, "registration-dir", "/registration", "kubelet's plugin registration directory (KUBELET_DIR/plugins_registry on the host)")
	fl.DurationVar(&cfg.CheckInterval, "check-interval", 0, "how often the driver and the registration socket are checked (default 1s)")
	fl.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
}
