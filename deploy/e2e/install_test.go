package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Installing blobfs the way users do, and reaching its pods.
//
// The install docs/kubernetes.md gives is: load the image (make image; ctr
// images import or docker load), then `kubectl apply -k deploy/`. The tests
// do exactly that through deploy/e2e/overlay, which swaps only what cannot
// be had on these machines: the upstream sidecar images (replaced by
// blobfs's stand-ins, deploy/e2e/standins, built here and imported under
// the names the overlay gives) and the API server's address (there is no
// kube-proxy). Everything else — the CSIDriver, RBAC, the controller
// Deployment, the node plugin and keeper DaemonSets, their probes and
// limits — is deploy/ as it is.

// The components of deploy/, by their pods' app label and namespace.
const (
	appNode       = "blobfs-csi-node"
	appKeeper     = "blobfs-csi-keeper"
	appController = "blobfs-csi-controller"
	systemNS      = "kube-system"
)

// standinRepo is where deploy/e2e/overlay puts the upstream sidecars'
// images: localhost/blobfs-e2e/ROLE:TAG, ROLE being the stand-in's role
// (csi-provisioner, livenessprobe) and TAG the upstream version deploy/
// names. The images are made for the references the rendered overlay
// holds, so that a sidecar bumped in deploy/ needs no change here.
var standinRef = regexp.MustCompile(`(?m)image: (localhost/blobfs-e2e/([a-z-]+):\S+)$`)

// overlayPlaceholder is replaced by the path of deploy/ when the overlay
// is copied into the run directory: kustomize refuses a base that
// contains its overlay, so the overlay cannot be used where it is kept.
const overlayPlaceholder = "@DEPLOY@"

func (c *cluster) install(ctx context.Context) error {
	dir, err := c.writeOverlay()
	if err != nil {
		return err
	}
	rendered, err := c.kubectl("kustomize", dir)
	if err != nil {
		return fmt.Errorf("kubectl kustomize %s: %v\n%s", dir, err, rendered)
	}
	if err := c.importImages(rendered); err != nil {
		return err
	}
	if out, err := c.kubectl("apply", "-k", dir); err != nil {
		return fmt.Errorf("kubectl apply -k %s: %v\n%s", dir, err, out)
	}
	logf("applied deploy/ through the e2e overlay")
	return c.waitComponentsReady(ctx)
}

// importImages imports the blobfs image `make image` built
// (BLOBFS_E2E_IMAGE; built here when unset) and the stand-ins' that the
// rendered manifests name.
func (c *cluster) importImages(rendered string) error {
	image := os.Getenv("BLOBFS_E2E_IMAGE")
	if image == "" {
		logf("BLOBFS_E2E_IMAGE is not set: running make image")
		cmd := exec.Command("make", "image")
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make image: %v\n%s", err, out)
		}
		image = filepath.Join(repoRoot(), "bin", "blobfs-image.tar")
	}
	standins := c.path("bin", "standins")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", standins, "./deploy/e2e/standins")
	build.Dir = repoRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./deploy/e2e/standins: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(standins)
	if err != nil {
		return err
	}
	tarballs := []string{image}
	refs := standinRef.FindAllStringSubmatch(rendered, -1)
	if len(refs) == 0 {
		return fmt.Errorf("the rendered overlay names no localhost/blobfs-e2e/ image")
	}
	made := map[string]bool{}
	for _, m := range refs {
		ref, role := m[1], m[2]
		if made[ref] {
			continue
		}
		made[ref] = true
		tar := c.path("bin", role+".tar")
		if err := writeImage(tar, ref, []string{"/standins", role}, nil,
			[]layerFile{{name: "standins", mode: 0o755, data: bin}}); err != nil {
			return err
		}
		tarballs = append(tarballs, tar)
	}
	for _, tar := range tarballs {
		if out, err := c.ctr("images", "import", tar); err != nil {
			return fmt.Errorf("ctr images import %s: %v\n%s", tar, err, out)
		}
	}
	return nil
}

// writeOverlay copies deploy/e2e/overlay into the run directory, naming
// deploy/ by a path relative to the copy (kustomize takes no absolute
// one).
func (c *cluster) writeOverlay() (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "e2e", "overlay", "kustomization.yaml"))
	if err != nil {
		return "", err
	}
	dir := c.path("overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base, err := filepath.Rel(dir, filepath.Join(repoRoot(), "deploy"))
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(b), overlayPlaceholder) {
		return "", fmt.Errorf("deploy/e2e/overlay/kustomization.yaml names no %s", overlayPlaceholder)
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(strings.ReplaceAll(string(b), overlayPlaceholder, base)), 0o644)
}

// waitComponentsReady waits until the keeper and node DaemonSets and the
// controller Deployment have rolled out and kubelet lists the driver.
func (c *cluster) waitComponentsReady(ctx context.Context) error {
	for _, obj := range []string{"daemonset/" + appKeeper, "daemonset/" + appNode, "deployment/" + appController} {
		if out, err := c.kubectl("rollout", "status", "-n", systemNS, obj, "--timeout=4m"); err != nil {
			return fmt.Errorf("kubectl rollout status %s: %v\n%s", obj, err, out)
		}
	}
	return c.waitDriverRegistered(ctx, 2*time.Minute)
}

// ensureDriverUp makes sure, after a scenario, that kubelet runs and
// blobfs's components are ready, so that a scenario that fails half-way
// does not fail the next ones too (and kubelet can unmount the pods'
// volumes when they are deleted).
func (c *cluster) ensureDriverUp(ctx context.Context) error {
	if p := c.procs.get("kubelet"); p == nil || p.exited() {
		if err := c.startKubelet(); err != nil {
			return err
		}
		if err := c.waitNodeReady(ctx); err != nil {
			return err
		}
	}
	return c.waitComponentsReady(ctx)
}

// componentPods lists the pods of a component that are not being
// deleted, oldest first.
func (c *cluster) componentPods(app string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.getJSON(&list, "get", "pods", "-n", systemNS, "-l", "app="+app); err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
	return pods, nil
}

// componentPod is the one pod of a component (a DaemonSet's on this node).
func (c *cluster) componentPod(app string) (*corev1.Pod, error) {
	pods, err := c.componentPods(app)
	if err != nil {
		return nil, err
	}
	if len(pods) != 1 {
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return nil, fmt.Errorf("%d pods of %s (%s), want 1", len(pods), app, strings.Join(names, ", "))
	}
	return &pods[0], nil
}

func containerStatus(p *corev1.Pod, container string) (corev1.ContainerStatus, bool) {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			return s, true
		}
	}
	return corev1.ContainerStatus{}, false
}

// containerPID is the host pid of a container's main process, from
// containerd.
func (c *cluster) containerPID(p *corev1.Pod, container string) (int, error) {
	s, ok := containerStatus(p, container)
	if !ok || s.ContainerID == "" || s.State.Running == nil {
		return 0, fmt.Errorf("container %s of pod %s is not running", container, p.Name)
	}
	id := strings.TrimPrefix(s.ContainerID, "containerd://")
	out, err := c.ctr("tasks", "ls")
	if err != nil {
		return 0, fmt.Errorf("ctr tasks ls: %v: %s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("containerd lists no task %s (container %s of pod %s)", id, container, p.Name)
}

// killContainer SIGKILLs a container's main process from the host and
// waits until kubelet has restarted the container and it is ready again.
// It returns how long that took.
func (c *cluster) killContainer(ctx context.Context, app, container string) (time.Duration, error) {
	p, err := c.componentPod(app)
	if err != nil {
		return 0, err
	}
	s, _ := containerStatus(p, container)
	pid, err := c.containerPID(p, container)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill -9 %d (%s/%s): %w", pid, p.Name, container, err)
	}
	if err := c.waitRestarted(ctx, p.Name, container, s.RestartCount); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// waitRestarted waits until kubelet has restarted a container (its
// restart count passed before) and it is ready.
func (c *cluster) waitRestarted(ctx context.Context, pod, container string, before int32) error {
	return waitUntil(ctx, fmt.Sprintf("kubelet restarted %s/%s", pod, container), 3*time.Minute, func() (bool, error) {
		var p corev1.Pod
		if err := c.getJSON(&p, "get", "pod", "-n", systemNS, pod); err != nil {
			return false, nil
		}
		s, ok := containerStatus(&p, container)
		return ok && s.RestartCount > before && s.Ready && s.State.Running != nil, nil
	})
}

// componentLog is what a container of a component's pod logged (its
// current instance, or the one before with previous).
func (c *cluster) componentLog(pod, container string, previous bool) string {
	args := []string{"logs", "-n", systemNS, pod, "-c", container}
	if previous {
		args = append(args, "--previous")
	}
	out, _ := c.kubectl(args...)
	return out
}

// dumpComponentLogs prints the tails of every blobfs container's log
// (and of the instance before, after a restart) for a failed run.
func (c *cluster) dumpComponentLogs() {
	for _, app := range []string{appNode, appKeeper, appController} {
		var list corev1.PodList
		if err := c.getJSON(&list, "get", "pods", "-n", systemNS, "-l", "app="+app); err != nil {
			continue
		}
		for _, p := range list.Items {
			for _, s := range p.Status.ContainerStatuses {
				lines := 60
				if s.Name == "blobfs" {
					lines = 120
				}
				fmt.Fprintf(os.Stderr, "---- last %d lines of %s/%s (restarts %d)\n%s\n", lines, p.Name, s.Name, s.RestartCount,
					lastLines(c.componentLog(p.Name, s.Name, false), lines))
				if s.RestartCount > 0 {
					fmt.Fprintf(os.Stderr, "---- last 40 lines of %s/%s before its last restart\n%s\n", p.Name, s.Name,
						lastLines(c.componentLog(p.Name, s.Name, true), 40))
				}
			}
		}
	}
}
