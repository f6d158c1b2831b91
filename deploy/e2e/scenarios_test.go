package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/blobfs/blobfs/blobstore"
)

// The scenarios of the end-to-end issue, in its order. Each cleans up its
// pods and claims; a failure prints the component logs (TestMain).

// --- helpers -------------------------------------------------------------

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newClaim creates a PVC of class and waits until it is Bound; it returns
// the claim's PV and the container that holds the volume.
func newClaim(t *testing.T, ctx context.Context, name, class string) (pvName, container string) {
	t.Helper()
	c := theCluster
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta: typeMeta("v1", "PersistentVolumeClaim"), ObjectMeta: objectMeta(name, "default"),
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := c.apply(pvc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.kubectl("delete", "pvc", "-n", "default", name, "--ignore-not-found", "--wait=false") })
	// kubelet backs off for 35 s when a pod's claim is not bound yet:
	// pods are created only after this.
	if err := waitUntil(ctx, "PVC "+name+" is Bound", 120*time.Second, func() (bool, error) {
		var got corev1.PersistentVolumeClaim
		if err := c.getJSON(&got, "get", "pvc", "-n", "default", name); err != nil {
			return false, nil
		}
		pvName = got.Spec.VolumeName
		return got.Status.Phase == corev1.ClaimBound, nil
	}); err != nil {
		t.Fatal(err)
	}
	var pv corev1.PersistentVolume
	if err := c.getJSON(&pv, "get", "pv", pvName); err != nil {
		t.Fatal(err)
	}
	return pvName, containerOf(t, pv.Spec.CSI.VolumeHandle)
}

// containerOf reads the container from a volume id, blobfs1#ACCOUNT#CONTAINER[#...].
func containerOf(t *testing.T, handle string) string {
	t.Helper()
	parts := strings.Split(handle, "#")
	if len(parts) < 3 || parts[0] != "blobfs1" {
		t.Fatalf("volume handle %q is not a blobfs volume id", handle)
	}
	return parts[2]
}

func runPod(t *testing.T, ctx context.Context, p *corev1.Pod) {
	t.Helper()
	c := theCluster
	if err := c.apply(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.ensureDriverUp(context.Background()); err != nil {
			t.Errorf("before deleting pod %s: %v", p.Name, err)
		}
		c.deletePod(context.Background(), p.Name)
	})
}

// podLog returns the pod's log.
func podLog(t *testing.T, name string) string {
	t.Helper()
	out, err := theCluster.kubectl("logs", "-n", "default", name)
	if err != nil {
		t.Fatalf("logs of %s: %v", name, err)
	}
	return out
}

// stagingPath is where kubelet stages a CSI volume.
func stagingPath(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(theCluster.kubeletDir, "plugins", "kubernetes.io", "csi", driverName, hex.EncodeToString(sum[:]), "globalmount")
}

func volumeHandle(t *testing.T, pvName string) string {
	t.Helper()
	var pv corev1.PersistentVolume
	if err := theCluster.getJSON(&pv, "get", "pv", pvName); err != nil {
		t.Fatal(err)
	}
	return pv.Spec.CSI.VolumeHandle
}

// waitNoMounts waits until nothing of the volume is mounted on the node
// any more: kubelet unpublished and unstaged it.
func waitNoMounts(t *testing.T, ctx context.Context, pvName, handle string) {
	t.Helper()
	sum := sha256.Sum256([]byte(handle))
	hash := hex.EncodeToString(sum[:])
	var left []string
	if err := waitUntil(ctx, "kubelet unpublished and unstaged "+pvName, 120*time.Second, func() (bool, error) {
		left = nil
		for _, m := range mountsUnder(theCluster.kubeletDir) {
			if strings.Contains(m, "/"+pvName+"/") || strings.Contains(m, hash) {
				left = append(left, m)
			}
		}
		return len(left) == 0, nil
	}); err != nil {
		t.Fatalf("%v; still mounted: %s", err, strings.Join(left, ", "))
	}
}

// deleteClaim deletes a PVC and waits until its PV is gone (the
// provisioner deleted the volume).
func deleteClaim(t *testing.T, ctx context.Context, name, pvName string) {
	t.Helper()
	c := theCluster
	if out, err := c.kubectl("delete", "pvc", "-n", "default", name, "--wait=false"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := waitUntil(ctx, "PV "+pvName+" is deleted", 180*time.Second, func() (bool, error) {
		out, err := c.kubectl("get", "pv", pvName, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

func waitContainerGone(t *testing.T, ctx context.Context, container string) {
	t.Helper()
	if err := waitUntil(ctx, "container "+container+" is gone from Azurite", 60*time.Second, func() (bool, error) {
		ok, err := theCluster.containerExists(ctx, container)
		return err == nil && !ok, nil
	}); err != nil {
		t.Fatal(err)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// nodePluginLogSince returns the node plugin's log since its last start.
func nodePluginLogSince(name string) string {
	b, _ := os.ReadFile(filepath.Join(theCluster.logDir, name+".log"))
	s := string(b)
	if i := strings.LastIndex(s, "==== "); i >= 0 {
		s = s[i:]
	}
	return s
}

// logMark returns a function that reads what a component logged after
// the call to logMark.
func logMark(name string) func() string {
	path := filepath.Join(theCluster.logDir, name+".log")
	var from int64
	if fi, err := os.Stat(path); err == nil {
		from = fi.Size()
	}
	return func() string {
		b, _ := os.ReadFile(path)
		if int64(len(b)) < from {
			return ""
		}
		return string(b[from:])
	}
}

// keepDriverUp makes sure, when the test ends, that kubelet, the keeper
// and the node plugin run and the driver is registered, so that a
// scenario that fails half-way through a restart does not fail the next
// ones too. (Pods' clean-ups do the same before deleting them: kubelet
// needs the driver to unmount their volumes.)
func keepDriverUp(t *testing.T) {
	t.Cleanup(func() {
		if err := theCluster.ensureDriverUp(context.Background()); err != nil {
			t.Errorf("after the test: %v", err)
		}
	})
}

func (c *cluster) ensureDriverUp(ctx context.Context) error {
	if p := c.procs.get("kubelet"); p == nil || p.exited() {
		if err := c.startKubelet(); err != nil {
			return err
		}
		if err := c.waitNodeReady(ctx); err != nil {
			return err
		}
	}
	if c.haveKeeper() {
		if p := c.procs.get("keeper"); p == nil || p.exited() {
			if err := c.startKeeper(); err != nil {
				return err
			}
		}
	}
	if p := c.procs.get("node-plugin"); p == nil || p.exited() {
		if err := c.startNodePlugin("node-plugin"); err != nil {
			return err
		}
	}
	return c.waitDriverRegistered(ctx, 120*time.Second)
}

func requireKeeper(t *testing.T) {
	t.Helper()
	if !theCluster.haveKeeper() {
		t.Skip("needs restart support: the blobfs under test has no keeper (blobfs keeper --help fails)")
	}
}

// --- 1. dynamic provisioning ---------------------------------------------

// TestDynamicProvisioning: StorageClass -> PVC -> a pod writes files -> a
// second pod on the same claim reads them -> pods and claim deleted ->
// the container is gone from Azurite, or kept with retainContainer.
func TestDynamicProvisioning(t *testing.T) {
	for _, tc := range []struct {
		name, class string
		retain      bool
	}{{"delete", classDelete, false}, {"retain", classRetain, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			c := theCluster
			claim := "dynamic-" + tc.name
			pvName, container := newClaim(t, ctx, claim, tc.class)
			handle := volumeHandle(t, pvName)
			t.Logf("PVC %s bound to %s, container %s", claim, pvName, container)
			if tc.retain {
				t.Cleanup(func() { c.deleteContainer(context.Background(), container) })
			}

			writer := c.podWith("writer-"+tc.name, `set -e
mkdir -p /data/dir
echo "written by the first pod" > /data/dir/hello.txt
head -c 5000000 /dev/urandom > /data/dir/random.bin
sha256sum /data/dir/random.bin | cut -c1-64 > /data/dir/random.sha256
echo "SHA $(cat /data/dir/random.sha256)"`, pvcVolume("data", claim, false))
			runPod(t, ctx, writer)
			if err := c.waitPodPhase(ctx, writer.Name, corev1.PodSucceeded, 180*time.Second); err != nil {
				t.Fatal(err)
			}
			m := regexp.MustCompile(`SHA ([0-9a-f]{64})`).FindStringSubmatch(podLog(t, writer.Name))
			if m == nil {
				t.Fatalf("the writer printed no checksum; its log:\n%s", podLog(t, writer.Name))
			}
			wantSum := m[1]

			reader := c.podWith("reader-"+tc.name, `set -e
test "$(sha256sum /data/dir/random.bin | cut -c1-64)" = "$(cat /data/dir/random.sha256)"
cat /data/dir/hello.txt`, pvcVolume("data", claim, false))
			runPod(t, ctx, reader)
			if err := c.waitPodPhase(ctx, reader.Name, corev1.PodSucceeded, 180*time.Second); err != nil {
				t.Fatal(err)
			}
			if log := podLog(t, reader.Name); !strings.Contains(log, "written by the first pod") {
				t.Errorf("the second pod read %q, want the first pod's text", log)
			}

			// The store's own view.
			if b, err := c.readBlob(ctx, container, "dir/hello.txt"); err != nil || string(b) != "written by the first pod\n" {
				t.Errorf("blob dir/hello.txt in Azurite = %q, %v; want the pod's text", b, err)
			}
			if b, err := c.readBlob(ctx, container, "dir/random.bin"); err != nil || sha256Hex(b) != wantSum || len(b) != 5000000 {
				t.Errorf("blob dir/random.bin in Azurite: %d bytes, sha256 %s, %v; want 5000000 bytes, sha256 %s", len(b), sha256Hex(b), err, wantSum)
			}

			for _, p := range []string{writer.Name, reader.Name} {
				if err := c.deletePod(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			waitNoMounts(t, ctx, pvName, handle)
			deleteClaim(t, ctx, claim, pvName)
			if tc.retain {
				// The provisioner deletes the PV only after DeleteVolume
				// returned: the container's fate is decided.
				if ok, err := c.containerExists(ctx, container); err != nil || !ok {
					t.Errorf("container %s of a retainContainer class: exists=%v (%v) after the volume was deleted; want it kept", container, ok, err)
				}
			} else {
				waitContainerGone(t, ctx, container)
			}
		})
	}
}

// --- 2. static PV, inline volume, read-only -------------------------------

// TestStaticAndInlineReadOnly: a PV naming an existing container and an
// inline volume of the same container, both read-only in one pod (reads
// work, writes fail with EROFS), an inline read-write volume beside them,
// and the same PV read-write in a second pod.
func TestStaticAndInlineReadOnly(t *testing.T) {
	ctx := testContext(t)
	c := theCluster
	const container, name = "static-e2e", "static-e2e"
	if err := c.putBlob(ctx, container, "hello.txt", []byte("static data\n")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.deleteContainer(context.Background(), container) })
	handle := fmt.Sprintf("blobfs1#%s#%s#%s", blobstore.AzuriteAccount, container, c.azuriteURL)
	empty := ""
	pv := &corev1.PersistentVolume{
		TypeMeta: typeMeta("v1", "PersistentVolume"), ObjectMeta: objectMeta(name, ""),
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Ti")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Namespace: "default", Name: name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: handle,
				VolumeAttributes: map[string]string{"secretName": secretName, "secretNamespace": "kube-system"},
			}},
		},
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta: typeMeta("v1", "PersistentVolumeClaim"), ObjectMeta: objectMeta(name, "default"),
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &empty, VolumeName: name,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := c.apply(pv, pvc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.kubectl("delete", "pvc", "-n", "default", name, "--ignore-not-found", "--wait=true", "--timeout=60s")
		c.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=false")
	})
	if err := waitUntil(ctx, "static PVC is Bound", 120*time.Second, func() (bool, error) {
		out, err := c.kubectl("get", "pvc", "-n", "default", name, "-o", "jsonpath={.status.phase}")
		return err == nil && out == "Bound", nil
	}); err != nil {
		t.Fatal(err)
	}

	inline := func(volName string, readOnly bool) corev1.Volume {
		return corev1.Volume{Name: volName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: driverName, ReadOnly: &readOnly,
			VolumeAttributes: map[string]string{"storageAccount": blobstore.AzuriteAccount, "containerName": container,
				"server": c.azuriteURL, "secretName": secretName},
		}}}
	}
	ro := c.podWith("static-readonly", "sleep 3600", pvcVolume("pv", name, true), inline("inline-ro", true), inline("inline-rw", false))
	runPod(t, ctx, ro)
	if err := c.waitPodPhase(ctx, ro.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"/data", "/data2"} {
		if out, err := c.exec(ro.Name, "cat", dir+"/hello.txt"); err != nil || out != "static data\n" {
			t.Errorf("reading %s/hello.txt (read-only volume): %q, %v; want the blob's content", dir, out, err)
		}
		out, err := c.exec(ro.Name, "sh", "-c", "echo nope > "+dir+"/new.txt")
		if err == nil || !strings.Contains(out, "Read-only file system") {
			t.Errorf("writing to the read-only volume at %s: err=%v, output %q; want EROFS (Read-only file system)", dir, err, out)
		}
		if mounts, _ := c.exec(ro.Name, "grep", " "+dir+" ", "/proc/mounts"); !regexp.MustCompile(`\sro[,\s]`).MatchString(mounts) {
			t.Errorf("%s is not mounted read-only in the pod: %q", dir, mounts)
		}
	}
	if out, err := c.exec(ro.Name, "sh", "-c", "echo from the inline volume > /data3/inline.txt"); err != nil {
		t.Errorf("writing through the read-write inline volume: %v: %s", err, out)
	}
	if b, err := c.readBlob(ctx, container, "inline.txt"); err != nil || string(b) != "from the inline volume\n" {
		t.Errorf("blob inline.txt = %q, %v; want what the pod wrote through the inline volume", b, err)
	}
	if b, err := c.readBlob(ctx, container, "new.txt"); err == nil {
		t.Errorf("blob new.txt exists (%q): a write through a read-only volume reached the store", b)
	}

	rw := c.podWith("static-readwrite", "set -e; echo from the static pv > /data/rw.txt; cat /data/hello.txt", pvcVolume("pv", name, false))
	runPod(t, ctx, rw)
	if err := c.waitPodPhase(ctx, rw.Name, corev1.PodSucceeded, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	if b, err := c.readBlob(ctx, container, "rw.txt"); err != nil || string(b) != "from the static pv\n" {
		t.Errorf("blob rw.txt = %q, %v; want what the read-write pod wrote", b, err)
	}
	for _, p := range []string{ro.Name, rw.Name} {
		if err := c.deletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitNoMounts(t, ctx, name, handle)
	if left := mountsUnder(filepath.Join(c.kubeletDir, "pods")); len(left) > 0 {
		t.Errorf("mounts left under kubelet's pods directory after the pods were deleted: %s", strings.Join(left, ", "))
	}
}

// --- streaming pods (3 and 6) --------------------------------------------

// streamScript appends random chunks to /data/stream, keeps a copy in the
// container's own file system, and after every append re-reads the whole
// file and compares checksums. Any error or mismatch ends it with a
// failure; /tmp/stop ends it with "DONE <count> <sha256>".
const streamScript = `set -e
i=0
: > /tmp/local
: > /data/stream
while [ ! -f /tmp/stop ]; do
  head -c 65536 /dev/urandom > /tmp/chunk
  cat /tmp/chunk >> /data/stream
  cat /tmp/chunk >> /tmp/local
  a=$(sha256sum < /data/stream | cut -c1-64)
  b=$(sha256sum < /tmp/local | cut -c1-64)
  if [ "$a" != "$b" ]; then echo "MISMATCH after $i appends: volume $a, local copy $b"; exit 1; fi
  i=$((i+1))
  echo "ok $i"
  sleep 0.2
done
echo "DONE $i $(sha256sum < /tmp/local | cut -c1-64)"
`

var okLine = regexp.MustCompile(`(?m)^ok (\d+)$`)

// streamCount is the number of appends the streaming pod has checked.
func streamCount(name string) int {
	out, err := theCluster.kubectl("logs", "-n", "default", name)
	if err != nil {
		return -1
	}
	m := okLine.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// waitStream waits until the pod has checked n more appends than now.
func waitStream(t *testing.T, ctx context.Context, pod string, more int) {
	t.Helper()
	start := streamCount(pod)
	if err := waitUntil(ctx, fmt.Sprintf("pod %s checked %d more appends", pod, more), 180*time.Second, func() (bool, error) {
		if p, err := theCluster.pod(pod); err == nil && p.Status.Phase == corev1.PodFailed {
			return false, fmt.Errorf("the streaming pod failed:\n%s", lastLines(podLog(t, pod), 20))
		}
		return streamCount(pod) >= start+more, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// finishStream stops the streaming pod and checks that it saw no error
// and that the store holds exactly what it wrote.
func finishStream(t *testing.T, ctx context.Context, pod, container string) {
	t.Helper()
	c := theCluster
	if out, err := c.exec(pod, "touch", "/tmp/stop"); err != nil {
		t.Fatalf("stopping the stream: %v: %s", err, out)
	}
	if err := c.waitPodPhase(ctx, pod, corev1.PodSucceeded, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	log := podLog(t, pod)
	m := regexp.MustCompile(`DONE (\d+) ([0-9a-f]{64})`).FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("the streaming pod ended without its summary; log:\n%s", lastLines(log, 20))
	}
	b, err := c.readBlob(ctx, container, "stream")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(m[1])
	if sha256Hex(b) != m[2] || len(b) != n*65536 {
		t.Errorf("blob stream in Azurite: %d bytes, sha256 %s; the pod wrote %d bytes, sha256 %s", len(b), sha256Hex(b), n*65536, m[2])
	}
	t.Logf("the pod appended and re-read %d chunks (%d bytes) without an error; Azurite holds the same bytes", n, n*65536)
}

// --- 3. driver killed while a pod streams --------------------------------

func TestDriverKilledWhileStreaming(t *testing.T) {
	requireKeeper(t)
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	_, container := newClaim(t, ctx, "stream-kill", classDelete)
	pod := c.podWith("stream-kill", streamScript, pvcVolume("data", "stream-kill", false))
	runPod(t, ctx, pod)
	if err := c.waitPodPhase(ctx, pod.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	waitStream(t, ctx, pod.Name, 10)
	for round := 1; round <= 2; round++ {
		p := c.procs.get("node-plugin")
		t.Logf("round %d: SIGKILL node plugin (pid %d) after %d appends", round, p.pid(), streamCount(pod.Name))
		p.kill()
		time.Sleep(2 * time.Second) // the pod's requests wait in the kernel meanwhile
		if err := c.startNodePlugin("node-plugin"); err != nil {
			t.Fatal(err)
		}
		waitStream(t, ctx, pod.Name, 10)
	}
	finishStream(t, ctx, pod.Name, container)
}

// --- 4. driver and keeper killed -----------------------------------------

// TestDriverAndKeeperKilled: with every holder of the FUSE connection
// gone, the restarted driver repairs the dead staging mount by itself
// (start-up recovery) and a new pod on the claim starts and reads; kubelet
// calls NodePublishVolume without NodeStageVolume for it.
func TestDriverAndKeeperKilled(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pvName, _ := newClaim(t, ctx, "crash", classDelete)
	staging := stagingPath(volumeHandle(t, pvName))
	first := c.podWith("crash-first", "set -e; echo before the crash > /data/before.txt; sleep 3600", pvcVolume("data", "crash", false))
	runPod(t, ctx, first)
	if err := c.waitPodPhase(ctx, first.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(ctx, "the first pod wrote its file", 60*time.Second, func() (bool, error) {
		out, err := c.exec(first.Name, "cat", "/data/before.txt")
		return err == nil && out == "before the crash\n", nil
	}); err != nil {
		t.Fatal(err)
	}

	t.Logf("SIGKILL node plugin and keeper")
	c.procs.get("node-plugin").kill()
	if k := c.procs.get("keeper"); k != nil {
		k.kill()
	}
	if out, err := readFileFromHost(filepath.Join(staging, "before.txt")); err == nil {
		t.Fatalf("the staging mount still answers with driver and keeper dead (%q): the test would prove nothing", out)
	} else {
		t.Logf("staging mount after the kill: %s", strings.TrimSpace(out))
	}
	if c.haveKeeper() {
		if err := c.startKeeper(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.startNodePlugin("node-plugin"); err != nil {
		t.Fatal(err)
	}
	// Repaired by the driver itself, before any kubelet call for it.
	if err := waitUntil(ctx, "the restarted driver repaired the staging mount", 90*time.Second, func() (bool, error) {
		out, err := readFileFromHost(filepath.Join(staging, "before.txt"))
		return err == nil && out == "before the crash\n", nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.waitDriverRegistered(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	second := c.podWith("crash-second", "set -e; cat /data/before.txt; echo after the crash > /data/after.txt; sleep 3600", pvcVolume("data", "crash", false))
	runPod(t, ctx, second)
	if err := c.waitPodPhase(ctx, second.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(ctx, "the second pod read the file", 60*time.Second, func() (bool, error) {
		return strings.Contains(podLog(t, second.Name), "before the crash"), nil
	}); err != nil {
		t.Fatal(err)
	}
	log := nodePluginLogSince("node-plugin")
	if !strings.Contains(log, "NodePublishVolume") {
		t.Errorf("the restarted driver saw no NodePublishVolume for the second pod")
	}
	if strings.Contains(log, `method=NodeStageVolume`) {
		t.Logf("note: kubelet staged the volume again after the restart")
	}
	for _, p := range []string{first.Name, second.Name} {
		if err := c.deletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitNoMounts(t, ctx, pvName, volumeHandle(t, pvName))
}

// --- 5. kubelet restarted while the driver is down -----------------------

// TestKubeletRestartWhileDriverDown: kubelet restarts while the node
// plugin is down and cannot register it; once the plugin is back, the
// registrar offers registration again and a pod created meanwhile starts:
// no pod stays in ContainerCreating.
func TestKubeletRestartWhileDriverDown(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	newClaim(t, ctx, "kubelet-restart", classDelete)
	first := c.podWith("kubelet-restart-1", "set -e; echo first > /data/first.txt; sleep 3600", pvcVolume("data", "kubelet-restart", false))
	runPod(t, ctx, first)
	if err := c.waitPodPhase(ctx, first.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}

	t.Logf("SIGKILL node plugin, then restart kubelet")
	c.procs.get("node-plugin").kill()
	registrarLog := logMark("registrar")
	c.procs.get("kubelet").stop(syscall.SIGTERM, 60*time.Second)
	if err := c.startKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	// The new kubelet finds the registration socket, cannot reach the
	// driver, and says so: the moment kubelet's retries would start to
	// back off.
	if err := waitUntil(ctx, "the restarted kubelet tried to register the driver and failed", 120*time.Second, func() (bool, error) {
		return strings.Contains(registrarLog(), "kubelet could not register the driver"), nil
	}); err != nil {
		t.Fatal(err)
	}
	second := c.podWith("kubelet-restart-2", "set -e; cat /data/first.txt; sleep 3600", pvcVolume("data", "kubelet-restart", false))
	runPod(t, ctx, second)
	if err := waitUntil(ctx, "kubelet holds the second pod in ContainerCreating (its volume needs the driver)", 120*time.Second, func() (bool, error) {
		p, err := c.pod(second.Name)
		if err != nil {
			return false, nil
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil && s.State.Waiting.Reason == "ContainerCreating" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}

	back := time.Now()
	if err := c.startNodePlugin("node-plugin"); err != nil {
		t.Fatal(err)
	}
	if err := c.waitDriverRegistered(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{first.Name, second.Name} {
		if err := c.waitPodPhase(ctx, p, corev1.PodRunning, 150*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitUntil(ctx, "the second pod read the first pod's file", 150*time.Second, func() (bool, error) {
		return strings.Contains(podLog(t, second.Name), "first"), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("second pod running and reading %s after the driver came back", time.Since(back).Round(time.Second))
	var pods corev1.PodList
	if err := c.getJSON(&pods, "get", "pods", "-n", "default"); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Waiting != nil && s.State.Waiting.Reason == "ContainerCreating" {
				t.Errorf("pod %s is stuck in ContainerCreating", p.Name)
			}
		}
	}
	if c.haveKeeper() {
		// With the keeper, the first pod's mount lived through it all.
		if out, err := c.exec(first.Name, "cat", "/data/first.txt"); err != nil || out != "first\n" {
			t.Errorf("the first pod reads %q, %v after the restarts; want its file", out, err)
		}
	}
}

// --- 6. rolling upgrade ----------------------------------------------------

// TestRollingUpgrade: as a DaemonSet rolling update with maxSurge does, a
// second node pod (keeper and driver) starts beside the first; its keeper
// takes the FUSE connections over from the old keeper, its driver adopts
// the mounts once the old one has released them, and the old pod's
// processes get SIGTERM, all while a pod streams: no error, every byte in
// the store.
func TestRollingUpgrade(t *testing.T) {
	requireKeeper(t)
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	_, container := newClaim(t, ctx, "stream-upgrade", classDelete)
	pod := c.podWith("stream-upgrade", streamScript, pvcVolume("data", "stream-upgrade", false))
	runPod(t, ctx, pod)
	if err := c.waitPodPhase(ctx, pod.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	waitStream(t, ctx, pod.Name, 10)
	// Upgrade to the "-2" processes, then back, so that later tests find
	// them under their usual names.
	for _, suffix := range [][2]string{{"", "-2"}, {"-2", ""}} {
		oldKeeper, oldPlugin := c.procs.get("keeper"+suffix[0]), c.procs.get("node-plugin"+suffix[0])
		newKeeper, newPlugin := "keeper"+suffix[1], "node-plugin"+suffix[1]
		t.Logf("starting %s and %s beside %s (pid %d) and %s (pid %d)", newKeeper, newPlugin,
			oldKeeper.name, oldKeeper.pid(), oldPlugin.name, oldPlugin.pid())
		if _, err := c.procs.start(newKeeper, nil, c.blobfs, "keeper", "--socket="+c.keeperSocket()); err != nil {
			t.Fatal(err)
		}
		if err := c.startNodePlugin(newPlugin); err != nil {
			t.Fatal(err)
		}
		if err := waitUntil(ctx, newPlugin+" serves", 90*time.Second, func() (bool, error) {
			return strings.Contains(nodePluginLogSince(newPlugin), "CSI driver serving"), nil
		}); err != nil {
			t.Fatal(err)
		}
		waitStream(t, ctx, pod.Name, 5)
		for _, old := range []*process{oldPlugin, oldKeeper} {
			t.Logf("SIGTERM %s", old.name)
			old.stop(syscall.SIGTERM, 2*time.Minute)
			if old.err != nil {
				t.Errorf("%s exited with %v after SIGTERM; want a clean exit", old.name, old.err)
			}
		}
		waitStream(t, ctx, pod.Name, 10)
	}
	finishStream(t, ctx, pod.Name, container)
}
