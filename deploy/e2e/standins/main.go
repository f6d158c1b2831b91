// Command standins stands in for two upstream Kubernetes CSI sidecars,
// registry.k8s.io/sig-storage/csi-provisioner and
// registry.k8s.io/sig-storage/livenessprobe, whose images cannot be
// pulled where blobfs's end-to-end tests run (no internet). It is a test
// stand-in used only by `make e2e`: the tests package this one binary as
// two images, localhost/blobfs-e2e/csi-provisioner:v5.3.0 and
// localhost/blobfs-e2e/livenessprobe:v2.17.0, which
// deploy/e2e/overlay/kustomization.yaml swaps in for the upstream ones.
// Production deployments use the upstream sidecars.
//
// The first argument selects the role; the rest are that sidecar's flags:
//
//	standins csi-provisioner --csi-address=/csi/csi.sock --timeout=120s --v=2 --extra-create-metadata=true
//	standins livenessprobe --csi-address=/csi/csi.sock --health-port=9808
//
// Unknown flags are an error (exit status 2), so a manifest that relies on
// something this stand-in does not do fails loudly instead of silently.
//
// livenessprobe serves GET /healthz: 200 "ok" when the driver's
// Identity.Probe succeeds within --probe-timeout and does not report
// Ready=false, 500 with the error otherwise. Flags: --csi-address,
// --health-port, --probe-timeout, --http-endpoint, --v.
//
// csi-provisioner asks the driver its name (GetPluginInfo), then once a
// second lists StorageClasses, PersistentVolumeClaims and
// PersistentVolumes through the API server (in-cluster service account,
// plain HTTP and JSON):
//
//   - a pending claim of a class whose provisioner is the driver gets
//     CreateVolume named pvc-<claim uid>, with the class's parameters minus
//     the sidecar's own csi.storage.k8s.io/*-secret-* and fstype keys,
//     plus, with --extra-create-metadata, csi.storage.k8s.io/pvc/name,
//     pvc/namespace and pv/name, and the provisioner secret; then a PV
//     bound to the claim, with the volume context plus
//     storage.kubernetes.io/csiProvisionerIdentity as volumeAttributes,
//     the node-stage secret reference, the class's mount options and
//     reclaim policy;
//   - a Released PV it provisioned with reclaim policy Delete gets
//     DeleteVolume with the provisioner secret named in the PV's
//     annotations, then the PV is deleted.
//
// Flags: --csi-address, --timeout, --v, --extra-create-metadata.
//
// It does not do leader election (and rejects --leader-election: the e2e
// overlay runs one controller replica and drops the flag); it polls
// instead of using informers; it has no topology (a WaitForFirstConsumer
// claim waits for its selected node, which is then ignored), no
// snapshots or cloning (a claim's dataSource is ignored), no resizing,
// no block volumes, no PV finalizers, no events and no metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

const usage = "usage: standins csi-provisioner|livenessprobe [flags]"

// run returns the exit status: 2 for a usage error, 1 for a failure.
func run(args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch role, rest := args[0], args[1:]; role {
	case "csi-provisioner":
		f, perr := parseProvisionerFlags(rest, stderr)
		if perr != nil {
			return usageError(perr)
		}
		err = runProvisioner(ctx, f, newLogger(stderr, f.verbosity, role))
	case "livenessprobe":
		f, perr := parseProbeFlags(rest, stderr)
		if perr != nil {
			return usageError(perr)
		}
		err = runLivenessProbe(ctx, f, newLogger(stderr, f.verbosity, role))
	default:
		fmt.Fprintf(stderr, "unknown role %q\n%s\n", role, usage)
		return 2
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "%s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError maps a flag error, already printed with the usage, to the
// exit status; -h is not a failure.
func usageError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// newLogger logs text to stderr; the sidecars' --v of 4 and more (their
// per-object detail) maps to slog's debug level.
func newLogger(w io.Writer, verbosity int, role string) *slog.Logger {
	level := slog.LevelInfo
	if verbosity >= 4 {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("role", role)
}
