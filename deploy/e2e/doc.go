// Package e2e holds blobfs's end-to-end tests on a real kubelet (make e2e).
//
// The tests bring up a single-node Kubernetes on this machine (kubelet,
// kube-apiserver, kube-controller-manager, kube-scheduler and kubectl built
// from the Go module proxy, see kube/; containerd, runc, etcd, the CNI
// plugins and busybox from Debian's packages, unpacked into a cache,
// nothing installed system-wide), install blobfs the way docs/kubernetes.md
// tells users to — the image `make image` builds imported into containerd,
// then `kubectl apply -k` of deploy/ through overlay/, which swaps only
// what these machines cannot have (the upstream sidecar images, replaced by
// blobfs's stand-ins in standins/, and the API server's address, as there
// is no kube-proxy) — use Azurite as the blob store, run the scenarios of
// the end-to-end issues through Kubernetes itself (containers killed,
// OOM-killed, pods deleted, rollouts, kubelet restarted, with a pod
// streaming checksummed data across each) and tear everything down: no
// process, mount, cgroup, bridge or socket is left behind, and a run that
// was killed is cleaned up by the next one before it starts.
//
// kubelet runs with its standard root directory, /var/lib/kubelet (made a
// shared mount, as on a node), so that deploy/ applies unchanged: the
// machine must not run another kubelet, which the tests check.
//
// Everything but standins/ (a program: it runs in the stand-in images) lives
// in _test.go files: `go test ./...` compiles them (vet and gofmt see
// them) and skips them unless BLOBFS_E2E=1, which `make e2e` sets. Root,
// /dev/fuse, gcc, apt-get and the Go module proxy are needed.
package e2e
