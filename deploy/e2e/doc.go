// Package e2e holds blobfs's end-to-end tests on a real kubelet (make e2e).
//
// The tests bring up a single-node Kubernetes on this machine (kubelet,
// kube-apiserver and kube-controller-manager built from the Go module proxy,
// see kube/; containerd, runc, etcd and busybox from Debian's packages,
// unpacked into a cache, nothing installed system-wide), run blobfs's CSI
// driver on the host the way the node DaemonSet runs it (node plugin,
// registrar, controller; a stand-in for the external-provisioner lives in
// the tests), use Azurite as the blob store, run the scenarios of the
// end-to-end issue and tear everything down: no process, mount, cgroup or
// socket is left behind, and a run that was killed is cleaned up by the
// next one before it starts.
//
// Everything lives in _test.go files: `go test ./...` compiles them (vet
// and gofmt see them) and skips them unless BLOBFS_E2E=1, which `make e2e`
// sets. Root, /dev/fuse, gcc, apt-get and the Go module proxy are needed.
package e2e
