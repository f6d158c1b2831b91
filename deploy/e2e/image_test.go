package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestImage: the image `make image` builds (BLOBFS_E2E_IMAGE, with the
// tag deploy/ runs) is imported into the cluster's containerd and runs in
// a pod as kubelet runs the driver's: `blobfs --version` prints the
// version the binary was built with, and the image's second tag is that
// version.
func TestImage(t *testing.T) {
	tarball := os.Getenv("BLOBFS_E2E_IMAGE")
	if tarball == "" {
		t.Skip("BLOBFS_E2E_IMAGE is not set (make e2e builds the image and sets it)")
	}
	c := theCluster
	ctx := testContext(t)
	if out, err := c.ctr("images", "import", tarball); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", tarball, err, out)
	}
	release := kustomizeTag(t)
	want, err := exec.Command(filepath.Join(repoRoot(), "bin/image/blobfs"), "--version").Output()
	if err != nil {
		t.Fatalf("the image's binary: %v", err)
	}
	version := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(want)), "blobfs"))
	if out, err := c.ctr("images", "ls", "-q"); err != nil || !strings.Contains(out, "blobfs:"+release) || !strings.Contains(out, "blobfs:"+version) {
		t.Fatalf("containerd's images lack blobfs:%s and blobfs:%s: %v\n%s", release, version, err, out)
	}
	p := c.podWith("image-version", "")
	p.Spec.Containers[0].Image = "blobfs:" + release
	p.Spec.Containers[0].ImagePullPolicy = corev1.PullNever
	p.Spec.Containers[0].Command = []string{"/usr/local/bin/blobfs", "--version"}
	runPod(t, ctx, p)
	if err := c.waitPodPhase(ctx, p.Name, corev1.PodSucceeded, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(podLog(t, p.Name)); got != strings.TrimSpace(string(want)) {
		t.Errorf("blobfs --version in the image printed %q, want %q", got, strings.TrimSpace(string(want)))
	}
}

// kustomizeTag is the image tag deploy/kustomization.yaml names.
func kustomizeTag(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy/kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "newTag:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("deploy/kustomization.yaml names no newTag")
	return ""
}
