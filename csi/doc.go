// Package csi is blobfs's Kubernetes CSI driver: the Identity, Controller
// and Node services on one gRPC unix socket, with blobfs mounts served in
// this process.
//
// A volume is a blob container. The controller creates and deletes
// containers; the node mounts a container once per node at the staging path
// (a fusefs filesystem and session in this process) and bind-mounts it into
// each pod, or mounts an inline volume straight at its pod's target.
//
// Layout: driver.go (Config, New, Run, interceptors, Identity),
// controller.go, node.go, request.go (a node request checked into one
// value before the RPC acts), params.go (parameters, secrets, mount options),
// blobcsi.go (the Azure Blob CSI driver's parameters, secret keys and
// mount options that blobfs accepts or refuses), volumeid.go (the volume
// id formats, blobfs's and that driver's), nodestate.go (the persisted node
// state), mounter.go (the Mounter interface and the in-process blobfs
// mounter), recovery.go (start-up recovery and the health check),
// metrics.go, secrets.go (reading Secrets from the API server).
//
// Hazards:
//   - The process serves the mounts it makes. Touching them from this
//     process (stat, statfs, bind mounts, unmounts) is fine from any
//     goroutine but a FUSE reader's; Status and the stats use timeouts so
//     that a hung mount cannot hang an RPC.
//   - When the process dies, so do its mounts ("transport endpoint is not
//     connected"); kubelet does not stage again after a driver restart.
//     The node state (no secrets) lets a new process repair what it can;
//     keeping mounts alive across restarts plugs in behind Mounter.
//   - Secrets never reach a log line, an event or the disk: requests are
//     logged through protosanitizer (the secrets fields) and the driver's
//     logger, which New wraps in blobstore's redaction (credentials that
//     volume attributes, parameters or mount flags carry); events and gRPC
//     statuses are redacted too; credentials live in memory only, and
//     error messages name keys, never values.
//   - Paths come from the CO: anything outside the kubelet directory is
//     refused, since the node plugin runs as root in the host's mount
//     namespace.
package csi
