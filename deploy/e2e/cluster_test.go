package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cluster is the single-node Kubernetes of a run and what runs on it.
type cluster struct {
	runDir, stateDir, logDir string
	art                      *artifacts
	pki                      *pki
	procs                    *processes
	node                     string
	kubeletDir               string
	adminKubeconfig          string
	azuritePort              int
	azuriteURL               string // http://127.0.0.1:PORT/devstoreaccount1
}

func (c *cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.stateDir}, parts...)...)
}

// up starts containerd, etcd, the API server, the controller manager and
// kubelet, and waits until the node is Ready and the default service
// account exists (pods are refused before).
func (c *cluster) up(ctx context.Context) error {
	if err := makeBridge(); err != nil {
		return err
	}
	if err := makeShared(kubeletRoot); err != nil {
		return err
	}
	for _, d := range []string{"etc", "containerd/root", "containerd/state", "containerd/opt", "cni/net.d", "cni/bin",
		"etcd", "apiserver", "pod-logs", "kubelet-pki"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := c.makePKI(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if err := c.writeConfigs(); err != nil {
		return err
	}
	ctrEnv := []string{"PATH=" + filepath.Join(c.art.root, "usr/bin") + ":" + filepath.Join(c.art.root, "usr/sbin") + ":" + os.Getenv("PATH")}
	if _, err := c.procs.start("containerd", ctrEnv, c.art.debBin("containerd"), "--config", c.path("etc/containerd.toml")); err != nil {
		return err
	}
	if err := waitUntil(ctx, "containerd answers", 60*time.Second, func() (bool, error) {
		_, err := c.ctr("version")
		return err == nil, nil
	}); err != nil {
		return err
	}
	for _, img := range []string{"pause.tar", "busybox.tar"} {
		if out, err := c.ctr("images", "import", filepath.Join(c.art.images, img)); err != nil {
			return fmt.Errorf("ctr images import %s: %v\n%s", img, err, out)
		}
	}
	if _, err := c.procs.start("etcd", nil, c.art.debBin("etcd"), "--name", "e2e", "--data-dir", c.path("etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e2e=http://127.0.0.1:2380", "--listen-metrics-urls", "http://127.0.0.1:2381"); err != nil {
		return err
	}
	if err := waitUntil(ctx, "etcd is healthy", 60*time.Second, func() (bool, error) {
		resp, err := http.Get("http://127.0.0.1:2379/health")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	}); err != nil {
		return err
	}
	p := c.pki
	if _, err := c.procs.start("kube-apiserver", nil, c.art.bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		// Pods reach it on the bridge's address (deploy/e2e/overlay).
		"--bind-address=0.0.0.0", "--secure-port=6443",
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file="+p.path("apiserver", "crt"), "--tls-private-key-file="+p.path("apiserver", "key"),
		"--client-ca-file="+p.path("ca", "crt"),
		"--kubelet-client-certificate="+p.path("apiserver-kubelet-client", "crt"), "--kubelet-client-key="+p.path("apiserver-kubelet-client", "key"),
		"--kubelet-preferred-address-types=Hostname",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.path("sa", "pub"), "--service-account-signing-key-file="+p.path("sa", "key"),
		"--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction", "--allow-privileged=true", "--cert-dir="+c.path("apiserver")); err != nil {
		return err
	}
	if err := waitUntil(ctx, "kube-apiserver is ready", 180*time.Second, func() (bool, error) {
		out, err := c.kubectl("get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok", nil
	}); err != nil {
		return err
	}
	cm := c.path("etc/controller-manager.kubeconfig")
	if _, err := c.procs.start("kube-controller-manager", nil, c.art.bin("kube-controller-manager"),
		"--kubeconfig="+cm, "--authentication-kubeconfig="+cm, "--authorization-kubeconfig="+cm,
		"--bind-address=127.0.0.1", "--secure-port=10257", "--leader-elect=false", "--controllers=*,-nodeipam",
		"--service-account-private-key-file="+p.path("sa", "key"), "--root-ca-file="+p.path("ca", "crt"),
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+p.path("ca", "crt"), "--cluster-signing-key-file="+p.path("ca", "key")); err != nil {
		return err
	}
	// The scheduler places the pods of deploy/'s DaemonSets and
	// Deployment; the tests' own pods name their node.
	sched := c.path("etc/kube-scheduler.kubeconfig")
	if _, err := c.procs.start("kube-scheduler", nil, c.art.bin("kube-scheduler"),
		"--kubeconfig="+sched, "--authentication-kubeconfig="+sched, "--authorization-kubeconfig="+sched,
		"--bind-address=127.0.0.1", "--secure-port=10259", "--leader-elect=false"); err != nil {
		return err
	}
	if err := c.startKubelet(); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return err
	}
	return waitUntil(ctx, "service account default/default exists (made by kube-controller-manager)", 120*time.Second, func() (bool, error) {
		_, err := c.kubectl("get", "serviceaccount", "default", "-n", "default")
		return err == nil, nil
	})
}

func (c *cluster) startKubelet() error {
	_, err := c.procs.start("kubelet", nil, c.art.bin("kubelet"), "--config="+c.path("etc/kubelet.yaml"),
		"--kubeconfig="+c.path("etc/kubelet.kubeconfig"), "--root-dir="+c.kubeletDir,
		"--cert-dir="+c.path("kubelet-pki"), "--v=2")
	return err
}

func (c *cluster) waitNodeReady(ctx context.Context) error {
	return waitUntil(ctx, "node "+c.node+" is Ready", 180*time.Second, func() (bool, error) {
		out, err := c.kubectl("get", "node", c.node, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && strings.TrimSpace(out) == "True", nil
	})
}

func (c *cluster) makePKI() error {
	p, err := newPKI(c.path("pki"))
	if err != nil {
		return err
	}
	c.pki = p
	steps := []struct {
		name, cn string
		orgs     []string
		hosts    []string
	}{
		{"apiserver", "kube-apiserver", nil, []string{"127.0.0.1", "10.0.0.1", bridgeIP, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}},
		{"admin", "admin", []string{"system:masters"}, nil},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"kubelet", "system:node:" + c.node, []string{"system:nodes"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil},
		{"kube-scheduler", "system:kube-scheduler", nil, nil},
	}
	for _, s := range steps {
		if err := p.issue(s.name, s.cn, s.orgs, s.hosts...); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	for _, u := range []string{"admin", "kubelet", "controller-manager", "kube-scheduler"} {
		if err := p.kubeconfig(c.path("etc", u+".kubeconfig"), u, "https://127.0.0.1:6443"); err != nil {
			return err
		}
	}
	c.adminKubeconfig = c.path("etc/admin.kubeconfig")
	return nil
}

func (c *cluster) writeConfigs() error {
	// Without CAP_SYS_RESOURCE (so in these VMs) runc cannot set the
	// negative oom_score_adj CRI gives sandboxes ("can't get final
	// child's PID from pipe: EOF"); containerd must not ask for it.
	restrictOOM := !hasCapability(24) // CAP_SYS_RESOURCE
	containerd := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = %[6]v
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = %[7]q
        Root = %[8]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[9]q
    conf_dir = %[10]q
`, c.path("containerd/root"), c.path("containerd/state"), c.containerdSocket(), c.path("containerd/opt"),
		pauseImage, restrictOOM, c.art.debBin("runc"), c.path("runc"), c.art.cniBin(), c.path("cni/net.d"))
	if err := os.WriteFile(c.path("etc/containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	// Pods get an address on the node's bridge (makeBridge), as a
	// cluster's CNI gives them one: deploy/'s pods run in their own
	// network namespaces, and the node plugin's rolling update starts a
	// second pod beside the first, which host networking would refuse
	// (both listen on the health and metrics ports). No masquerading: pods
	// reach only the node (the API server, Azurite), which is all they need.
	cni := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"blobfs-e2e","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":false,
"ipam":{"type":"host-local","ranges":[[{"subnet":%q,"gateway":%q}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}]}`,
		bridgeName, bridgeSubnet, bridgeIP, c.path("cni/ipam"))
	if err := os.WriteFile(c.path("cni/net.d/10-blobfs-e2e.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
failSwapOn: false
# These VMs run cgroup v1, which kubelet 1.34 refuses unless told.
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
rotateCertificates: false
serverTLSBootstrap: false
evictionHard: {memory.available: 100Mi, nodefs.available: 2%%, imagefs.available: 2%%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
`, c.containerdSocket(), c.path("pod-logs"), c.pki.path("ca", "crt"))
	return os.WriteFile(c.path("etc/kubelet.yaml"), []byte(kubelet), 0o644)
}

// The test node's pod network: a bridge with the node's address on it,
// made before anything starts so that the API server and Azurite answer
// on bridgeIP from the first pod on (the CNI plugin takes the bridge as
// it finds it).
const (
	bridgeIP     = "10.244.77.1"
	bridgeSubnet = "10.244.77.0/24"
)

func makeBridge() error {
	for _, args := range [][]string{
		{"link", "add", bridgeName, "type", "bridge"},
		{"addr", "add", bridgeIP + "/24", "dev", bridgeName},
		{"link", "set", bridgeName, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// makeShared makes dir a shared mount (a bind mount of itself), as a
// node's kubelet directory is: the node plugin mounts it with Bidirectional
// propagation, which the runtime refuses on a private mount, and these
// machines mount / private. The clean-up unmounts it.
func makeShared(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	return nil
}

func (c *cluster) containerdSocket() string { return c.path("containerd/containerd.sock") }

func (c *cluster) ctr(args ...string) (string, error) {
	out, err := exec.Command(c.art.debBin("ctr"), append([]string{"--address", c.containerdSocket(), "-n", "k8s.io"}, args...)...).CombinedOutput()
	return string(out), err
}

// hasCapability reports whether this process has capability bit n.
func hasCapability(n uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<n) != 0
		}
	}
	return false
}

// waitUntil polls cond every 500 ms until it says true, fails, or the
// timeout passes; the error says what was awaited.
func waitUntil(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting until %s: %w", what, err)
		}
		if ok {
			if d := time.Since(start); d > 2*time.Second {
				logf("%s (after %s)", what, d.Round(100*time.Millisecond))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting until %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting until %s: %w", what, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
