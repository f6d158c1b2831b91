package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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

// keepDriverUp makes sure, when the test ends, that kubelet runs and
// blobfs's components are ready, so that a scenario that fails half-way
// through a restart does not fail the next ones too.
func keepDriverUp(t *testing.T) {
	t.Cleanup(func() {
		if err := theCluster.ensureDriverUp(context.Background()); err != nil {
			t.Errorf("after the test: %v", err)
		}
	})
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
	// (blobfs's own pods have mounts there too: their tokens.)
	var left []string
	for _, m := range mountsUnder(filepath.Join(c.kubeletDir, "pods")) {
		if strings.Contains(m, "/volumes/kubernetes.io~csi/") {
			left = append(left, m)
		}
	}
	if len(left) > 0 {
		t.Errorf("CSI mounts left under kubelet's pods directory after the pods were deleted: %s", strings.Join(left, ", "))
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

// okStamped is a checked append in `kubectl logs --timestamps`.
var okStamped = regexp.MustCompile(`(?m)^(\S+) ok (\d+)$`)

// streamTimes are the moments the streaming pod reported its checked
// appends (kubelet's log timestamps), in order.
func streamTimes(t *testing.T, pod string) []time.Time {
	t.Helper()
	out, err := theCluster.kubectl("logs", "-n", "default", "--timestamps", pod)
	if err != nil {
		t.Fatalf("logs of %s: %v", pod, err)
	}
	var times []time.Time
	for _, m := range okStamped.FindAllStringSubmatch(out, -1) {
		if ts, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			times = append(times, ts)
		}
	}
	return times
}

// streamPause is the longest pause the streaming pod saw during an
// event that began at from and was over (the component back) at to: the
// longest time between two of its checked appends, over the pairs that
// overlap [from, to] (an append in flight waits in the kernel meanwhile).
// usual is the median time between two appends, for comparison.
func streamPause(t *testing.T, pod string, from, to time.Time) (pause, usual time.Duration) {
	t.Helper()
	times := streamTimes(t, pod)
	var gaps []time.Duration
	for i := 1; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		gaps = append(gaps, gap)
		if times[i].After(from) && times[i-1].Before(to) && gap > pause {
			pause = gap
		}
	}
	if len(gaps) > 0 {
		sorted := append([]time.Duration(nil), gaps...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		usual = sorted[len(sorted)/2]
	}
	return pause.Round(10 * time.Millisecond), usual.Round(10 * time.Millisecond)
}

// startStream makes a claim and a pod streaming on it; it returns the
// pod's name and the volume's container.
func startStream(t *testing.T, ctx context.Context, name string) (pod, container string) {
	t.Helper()
	c := theCluster
	_, container = newClaim(t, ctx, name, classDelete)
	p := c.podWith(name, streamScript, pvcVolume("data", name, false))
	runPod(t, ctx, p)
	if err := c.waitPodPhase(ctx, p.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	waitStream(t, ctx, p.Name, 10)
	return p.Name, container
}

// reportPause waits until the stream went on after an event that began
// at and is over now, and logs the longest pause it saw.
func reportPause(t *testing.T, ctx context.Context, pod, event string, at time.Time) {
	t.Helper()
	over := time.Now()
	waitStream(t, ctx, pod, 5)
	pause, usual := streamPause(t, pod, at, over)
	t.Logf("%s: the application paused %s (an append takes %s)", event, pause, usual)
}

// --- 3. the driver killed -------------------------------------------------

// TestDriverKilledWhileStreaming: kill -9 of the driver while a pod
// streams. Twice the driver process itself (the container's main process
// supervises it, --restart-in-place, and starts it again at once: no
// container restart, so no kubelet back-off), then the container's main
// process (kubelet restarts the container). Each time the new driver
// adopts the mounts from the keeper; the application sees a pause, no
// error, every byte in the store.
func TestDriverKilledWhileStreaming(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pod, container := startStream(t, ctx, "stream-kill")
	for round := 1; round <= 2; round++ {
		at := time.Now()
		took, err := c.killDriverInPlace(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: kill -9 of the driver process; its supervisor had a new one serving after %s, the container was not restarted", round, took.Round(100*time.Millisecond))
		reportPause(t, ctx, pod, fmt.Sprintf("round %d", round), at)
	}
	at := time.Now()
	took, err := c.killContainer(ctx, appNode, "blobfs")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("round 3: kill -9 of the container's main process; kubelet had it running and ready again after %s", took.Round(100*time.Millisecond))
	reportPause(t, ctx, pod, "round 3", at)
	np, err := c.componentPod(appNode)
	if err != nil {
		t.Fatal(err)
	}
	if log := c.componentLog(np.Name, "blobfs", false); !strings.Contains(log, "adopted") {
		t.Errorf("the restarted driver did not say it adopted mounts; its log:\n%s", lastLines(log, 30))
	}
	finishStream(t, ctx, pod, container)
}

// driverProcess is the driver process of the node plugin's pod: the child
// of the blobfs container's main process (--restart-in-place).
func (c *cluster) driverProcess() (pod *corev1.Pod, supervisor, driver int, err error) {
	pod, err = c.componentPod(appNode)
	if err != nil {
		return nil, 0, 0, err
	}
	supervisor, err = c.containerPID(pod, "blobfs")
	if err != nil {
		return nil, 0, 0, err
	}
	// Every thread's children: a Go process forks from any thread.
	var children []string
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", supervisor))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		children = append(children, strings.Fields(string(b))...)
	}
	if len(children) != 1 {
		return nil, 0, 0, fmt.Errorf("the blobfs container's main process %d has children %v, want the one driver", supervisor, children)
	}
	driver, err = strconv.Atoi(children[0])
	return pod, supervisor, driver, err
}

// killDriverInPlace kills the driver process and waits until its
// supervisor has started a new one that serves (the pod ready), with no
// container restart.
func (c *cluster) killDriverInPlace(ctx context.Context) (time.Duration, error) {
	pod, _, driver, err := c.driverProcess()
	if err != nil {
		return 0, err
	}
	st, _ := containerStatus(pod, "blobfs")
	start := time.Now()
	if err := syscall.Kill(driver, syscall.SIGKILL); err != nil {
		return 0, err
	}
	if err := c.waitDriverReplaced(ctx, driver); err != nil {
		return 0, err
	}
	took := time.Since(start)
	var now corev1.Pod
	if err := c.getJSON(&now, "get", "pod", "-n", systemNS, pod.Name); err != nil {
		return 0, err
	}
	if s, _ := containerStatus(&now, "blobfs"); s.RestartCount != st.RestartCount {
		return 0, fmt.Errorf("kubelet restarted the container (restarts %d -> %d): the driver was not restarted in place", st.RestartCount, s.RestartCount)
	}
	return took, nil
}

// waitDriverReplaced waits until the supervisor runs a driver other than
// old and the node plugin's pod is ready.
func (c *cluster) waitDriverReplaced(ctx context.Context, old int) error {
	return waitUntil(ctx, "a new driver process serves", 2*time.Minute, func() (bool, error) {
		pod, _, driver, err := c.driverProcess()
		if err != nil || driver == old {
			return false, nil
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// --- 4. the driver OOM-killed --------------------------------------------

// TestDriverOOMKilled: the driver is killed by the kernel for exceeding
// its container's memory limit while a pod streams through it. The test
// lowers the limit of the running container's memory cgroup to just above
// what it uses, so that the stream's next allocations cross it: the same
// OOM kill a too-small limit in the manifest causes under load, at a
// moment the test controls. The kernel kills the larger process, the
// driver; its supervisor starts it again at once (the test has put the
// limit back), the container is not restarted, and the cgroup counts the
// OOM kill. The application sees a pause.
func TestDriverOOMKilled(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pod, container := startStream(t, ctx, "stream-oom")
	np, supervisor, driver, err := c.driverProcess()
	if err != nil {
		t.Fatal(err)
	}
	st, _ := containerStatus(np, "blobfs")
	cg, err := memoryCgroupFiles(supervisor)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(filepath.Dir(cg.limit), "memory.oom.group")); err == nil && strings.TrimSpace(string(b)) == "1" {
		t.Skip("cgroup v2 with memory.oom.group (kubelet sets it): an OOM kill ends the whole container, and kubelet restarts it; the restart in place this test checks does not apply")
	}
	original, err := os.ReadFile(cg.limit)
	if err != nil {
		t.Fatal(err)
	}
	oomsBefore := oomKills(t, cg)
	at := time.Now()
	err = waitUntil(ctx, "the kernel OOM-killed the driver", 2*time.Minute, func() (bool, error) {
		if syscall.Kill(driver, 0) != nil {
			return true, nil
		}
		// Just above the current use: the stream's next buffers cross it.
		// Written again each time, as the use moves.
		b, err := os.ReadFile(cg.usage)
		if err != nil {
			return false, nil
		}
		usage, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		os.WriteFile(cg.limit, []byte(strconv.FormatInt(usage+512<<10, 10)), 0o644)
		return false, nil
	})
	// The manifest's limit back, before the next driver starts using
	// memory.
	if werr := os.WriteFile(cg.limit, original, 0o644); werr != nil {
		t.Errorf("restoring the memory limit: %v", werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if syscall.Kill(supervisor, 0) != nil {
		t.Fatal("the OOM kill took the supervisor, not the driver")
	}
	if n := oomKills(t, cg); n <= oomsBefore {
		t.Errorf("the cgroup counts %d OOM kills, %d before: the driver was not killed by the OOM killer", n, oomsBefore)
	}
	if err := c.waitDriverReplaced(ctx, driver); err != nil {
		t.Fatal(err)
	}
	var after corev1.Pod
	if err := c.getJSON(&after, "get", "pod", "-n", systemNS, np.Name); err != nil {
		t.Fatal(err)
	}
	if s, _ := containerStatus(&after, "blobfs"); s.RestartCount != st.RestartCount {
		t.Errorf("kubelet restarted the container (restarts %d -> %d); want the driver restarted in place", st.RestartCount, s.RestartCount)
	}
	t.Logf("the kernel OOM-killed the driver; its supervisor started a new one, serving after %s", time.Since(at).Round(100*time.Millisecond))
	reportPause(t, ctx, pod, "OOM kill", at)
	finishStream(t, ctx, pod, container)
}

// memoryCgroup names the files of a memory cgroup the test reads and
// writes.
type memoryCgroup struct {
	limit, usage string
	events       string // where the OOM kills are counted
	eventsKey    string
}

// oomKills is the number of OOM kills the cgroup has seen.
func oomKills(t *testing.T, cg memoryCgroup) int {
	t.Helper()
	b, err := os.ReadFile(cg.events)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == cg.eventsKey {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatalf("%s has no %s line:\n%s", cg.events, cg.eventsKey, b)
	return 0
}

// memoryCgroupFiles finds the memory cgroup files of a process
// (cgroup v1 or v2).
func memoryCgroupFiles(pid int) (memoryCgroup, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return memoryCgroup{}, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if ctl == "memory" {
				dir := filepath.Join("/sys/fs/cgroup/memory", f[2])
				return memoryCgroup{limit: filepath.Join(dir, "memory.limit_in_bytes"), usage: filepath.Join(dir, "memory.usage_in_bytes"),
					events: filepath.Join(dir, "memory.oom_control"), eventsKey: "oom_kill"}, nil
			}
		}
		if f[0] == "0" && f[1] == "" {
			dir := filepath.Join("/sys/fs/cgroup", f[2])
			if _, err := os.Stat(filepath.Join(dir, "memory.max")); err == nil {
				return memoryCgroup{limit: filepath.Join(dir, "memory.max"), usage: filepath.Join(dir, "memory.current"),
					events: filepath.Join(dir, "memory.events"), eventsKey: "oom_kill"}, nil
			}
		}
	}
	return memoryCgroup{}, fmt.Errorf("no memory cgroup for pid %d in:\n%s", pid, b)
}

// --- 5. the node plugin's pod deleted -------------------------------------

// TestNodePodDeleted: `kubectl delete pod` of the node plugin, what an
// operator does to a stuck pod, while a pod streams. The keeper, a
// DaemonSet of its own, holds the mounts; the DaemonSet's new pod adopts
// them. Then the keeper's pod is deleted too: the driver hands the mounts
// to the new keeper, which the test proves by killing the driver once
// more. The application sees pauses, no error.
func TestNodePodDeleted(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pod, container := startStream(t, ctx, "stream-delete")
	old, err := c.componentPod(appNode)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if out, err := c.kubectl("delete", "pod", "-n", systemNS, old.Name, "--wait=false"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if err := waitUntil(ctx, "the node plugin's new pod is ready", 4*time.Minute, func() (bool, error) {
		p, err := c.componentPod(appNode)
		if err != nil || p.Name == old.Name {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("node plugin pod %s deleted; its successor was ready after %s", old.Name, time.Since(at).Round(100*time.Millisecond))
	reportPause(t, ctx, pod, "node pod deleted", at)

	oldKeeper, err := c.componentPod(appKeeper)
	if err != nil {
		t.Fatal(err)
	}
	at = time.Now()
	if out, err := c.kubectl("delete", "pod", "-n", systemNS, oldKeeper.Name, "--wait=true", "--timeout=2m"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := c.kubectl("rollout", "status", "-n", systemNS, "daemonset/"+appKeeper, "--timeout=3m"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	reportPause(t, ctx, pod, "keeper pod deleted", at)
	// The new keeper must hold the mounts now (the driver reattaches them
	// by itself): without it they would die with the driver below.
	if err := waitUntil(ctx, "the driver gave its mounts to the new keeper", time.Minute, func() (bool, error) {
		kp, err := c.componentPod(appKeeper)
		if err != nil {
			return false, nil
		}
		return strings.Contains(c.componentLog(kp.Name, "keeper", false), "holding mount"), nil
	}); err != nil {
		t.Fatal(err)
	}
	at = time.Now()
	if _, err := c.killContainer(ctx, appNode, "blobfs"); err != nil {
		t.Fatal(err)
	}
	reportPause(t, ctx, pod, "driver killed after the keeper was replaced", at)
	finishStream(t, ctx, pod, container)
}

// --- 6. driver and keeper killed -----------------------------------------

// openLoopScript opens, writes, reads back and closes a new file every
// 100 ms and says how each went; it holds one file open from the start
// (fd 3) and, when told to stop, says whether that file still takes a
// write. A closed file is in the store (blobfs uploads at close).
const openLoopScript = `exec 3>>/data/held.txt
echo held-before >&3
i=0
while [ ! -f /tmp/stop ]; do
  i=$((i+1))
  if { echo "n$i" > /data/loop-$i.txt && [ "$(cat /data/loop-$i.txt)" = "n$i" ]; } 2>/dev/null; then
    echo "ok $i"
  else
    echo "fail $i"
  fi
  sleep 0.1
done
if { echo held-after >&3; } 2>/dev/null; then echo "HELD ok"; else echo "HELD failed"; fi
echo "DONE $i"
`

var loopLine = regexp.MustCompile(`(?m)^(\S+) (ok|fail) (\d+)$`)

// TestDriverAndKeeperKilled: with every holder of the FUSE connection
// gone (the driver's and the keeper's processes killed together), the
// restarted driver repairs the dead staging mount by itself (start-up
// recovery, no kubelet call) and gives the running container its view of
// the volume back in place: its new opens work again without a restart;
// the file it held open stays failed; every file it closed before the
// kill is in the store; the configMap it has mounted inside the volume is
// still there. A new pod on the claim starts too; kubelet calls
// NodePublishVolume without NodeStageVolume for it.
func TestDriverAndKeeperKilled(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pvName, container := newClaim(t, ctx, "crash", classDelete)
	staging := stagingPath(volumeHandle(t, pvName))
	first := c.podWith("crash-first", openLoopScript, pvcVolume("data", "crash", false))
	// A configMap mounted inside the blobfs volume, as pods do: the view
	// the driver repairs must keep it (issue 38, defect 3).
	nested := &corev1.ConfigMap{TypeMeta: typeMeta("v1", "ConfigMap"), ObjectMeta: objectMeta("crash-nested", "default"),
		Data: map[string]string{"greeting": "nested-ok"}}
	if err := c.apply(nested); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.kubectl("delete", "configmap", "-n", "default", nested.Name, "--ignore-not-found") })
	first.Spec.Volumes = append(first.Spec.Volumes, corev1.Volume{Name: "nested", VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: nested.Name}}}})
	first.Spec.Containers[0].VolumeMounts = append(first.Spec.Containers[0].VolumeMounts,
		corev1.VolumeMount{Name: "nested", MountPath: "/data/cfg", ReadOnly: true})
	runPod(t, ctx, first)
	if err := c.waitPodPhase(ctx, first.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := c.exec(first.Name, "cat", "/data/cfg/greeting"); err != nil || out != "nested-ok" {
		t.Fatalf("the configMap inside the volume, before the kill: %q, %v", out, err)
	}
	if err := waitUntil(ctx, "the first pod's loop runs", 60*time.Second, func() (bool, error) {
		return strings.Contains(podLog(t, first.Name), "ok 5\n"), nil
	}); err != nil {
		t.Fatal(err)
	}

	np, err := c.componentPod(appNode)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := c.componentPod(appKeeper)
	if err != nil {
		t.Fatal(err)
	}
	npStatus, _ := containerStatus(np, "blobfs")
	kpStatus, _ := containerStatus(kp, "keeper")
	driverPID, err := c.containerPID(np, "blobfs")
	if err != nil {
		t.Fatal(err)
	}
	keeperPID, err := c.containerPID(kp, "keeper")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kill -9 of the driver (pid %d) and the keeper (pid %d)", driverPID, keeperPID)
	killedAt := time.Now()
	syscall.Kill(driverPID, syscall.SIGKILL)
	syscall.Kill(keeperPID, syscall.SIGKILL)
	if err := waitUntil(ctx, "the staging mount died", 30*time.Second, func() (bool, error) {
		_, err := readFileFromHost(filepath.Join(staging, "loop-1.txt"))
		return err != nil, nil
	}); err != nil {
		t.Fatalf("%v: the test would prove nothing", err)
	}
	if err := c.waitRestarted(ctx, kp.Name, "keeper", kpStatus.RestartCount); err != nil {
		t.Fatal(err)
	}
	if err := c.waitRestarted(ctx, np.Name, "blobfs", npStatus.RestartCount); err != nil {
		t.Fatal(err)
	}
	// Repaired by the driver itself, before any kubelet call for it.
	if err := waitUntil(ctx, "the restarted driver repaired the staging mount", 90*time.Second, func() (bool, error) {
		out, err := readFileFromHost(filepath.Join(staging, "loop-1.txt"))
		return err == nil && out == "n1\n", nil
	}); err != nil {
		t.Fatal(err)
	}
	// The running container: its new opens fail while the connection is
	// dead, then work again, with no restart of it.
	var firstFail, back time.Time
	lastOKBefore := 0
	if err := waitUntil(ctx, "the running container's new opens work again", 2*time.Minute, func() (bool, error) {
		out, err := c.kubectl("logs", "-n", "default", "--timestamps", first.Name)
		if err != nil {
			return false, nil
		}
		firstFail, back, lastOKBefore = time.Time{}, time.Time{}, 0
		for _, m := range loopLine.FindAllStringSubmatch(out, -1) {
			ts, _ := time.Parse(time.RFC3339Nano, m[1])
			n, _ := strconv.Atoi(m[3])
			switch {
			case m[2] == "fail" && firstFail.IsZero():
				firstFail = ts
			case m[2] == "ok" && firstFail.IsZero():
				lastOKBefore = n
			case m[2] == "ok" && back.IsZero():
				back = ts
			}
		}
		return !back.IsZero(), nil
	}); err != nil {
		t.Fatalf("%v; the driver's log:\n%s", err, lastLines(c.componentLog(np.Name, "blobfs", false), 30))
	}
	t.Logf("the running container's new opens failed from %s after the kill and worked again %s after it (no restart of the container)",
		firstFail.Sub(killedAt).Round(100*time.Millisecond), back.Sub(killedAt).Round(100*time.Millisecond))
	if p, err := c.pod(first.Name); err != nil || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the first pod's container restarted (%v): the repair should not need it", err)
	}
	if out, err := c.exec(first.Name, "cat", "/data/cfg/greeting"); err != nil || out != "nested-ok" {
		t.Errorf("the configMap mounted inside the volume, after the driver repaired the container's view: %q, %v (want nested-ok)", out, err)
	} else {
		t.Logf("the configMap mounted inside the volume is still there in the repaired view")
	}
	log := c.componentLog(np.Name, "blobfs", false)
	if !strings.Contains(log, "running containers have their volume back") {
		t.Errorf("the restarted driver did not say it repaired the running containers' views; its log:\n%s", lastLines(log, 30))
	}
	if strings.Contains(log, "NodePublishVolume") || strings.Contains(log, "NodeStageVolume") {
		t.Errorf("kubelet called the driver before the second pod: the repair was not the driver's own")
	}
	// Every file the container closed before the kill is in the store.
	for i := 1; i <= lastOKBefore; i++ {
		name := fmt.Sprintf("loop-%d.txt", i)
		if b, err := c.readBlob(ctx, container, name); err != nil || string(b) != fmt.Sprintf("n%d\n", i) {
			t.Errorf("blob %s, closed before the kill: %q, %v", name, b, err)
		}
	}
	t.Logf("the %d files the container closed before the kill are in Azurite", lastOKBefore)
	// What it wrote to the file it held open, never closed nor fsync'd,
	// is uploaded from its spill file by the new mount (the blob did not
	// change meanwhile).
	if err := waitUntil(ctx, "the held file's unsaved write reached Azurite from its spill file", time.Minute, func() (bool, error) {
		b, err := c.readBlob(ctx, container, "held.txt")
		return err == nil && string(b) == "held-before\n", nil
	}); err != nil {
		t.Error(err)
	}

	second := c.podWith("crash-second", "set -e; cat /data/loop-1.txt; echo after the crash > /data/after.txt; sleep 3600", pvcVolume("data", "crash", false))
	runPod(t, ctx, second)
	if err := c.waitPodPhase(ctx, second.Name, corev1.PodRunning, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(ctx, "the second pod read the file", 60*time.Second, func() (bool, error) {
		return strings.Contains(podLog(t, second.Name), "n1"), nil
	}); err != nil {
		t.Fatal(err)
	}
	log = c.componentLog(np.Name, "blobfs", false)
	if !strings.Contains(log, "NodePublishVolume") {
		t.Errorf("the restarted driver saw no NodePublishVolume for the second pod")
	}
	if strings.Contains(log, `method=NodeStageVolume`) {
		t.Logf("note: kubelet staged the volume again after the restart")
	}
	// The file held open across the kill belongs to the dead connection.
	if out, err := c.exec(first.Name, "touch", "/tmp/stop"); err != nil {
		t.Fatalf("stopping the loop: %v: %s", err, out)
	}
	if err := c.waitPodPhase(ctx, first.Name, corev1.PodSucceeded, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if flog := podLog(t, first.Name); !strings.Contains(flog, "HELD failed") {
		t.Errorf("a write to the file held open across the kill did not fail, as documented; the pod's log ends:\n%s", lastLines(flog, 5))
	}
	for _, p := range []string{first.Name, second.Name} {
		if err := c.deletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitNoMounts(t, ctx, pvName, volumeHandle(t, pvName))
}

// --- 7. kubelet restarted -------------------------------------------------

// TestKubeletRestart: kubelet restarts while a pod streams, and while it
// is down the driver dies too, so that the new kubelet finds the
// registration socket but not the driver (the case where kubelet would
// back off for minutes): the stream goes on through the keeper, kubelet
// restarts the driver's container, the registrar offers registration
// again, and a pod created after the restart mounts the claim.
func TestKubeletRestart(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pod, container := startStream(t, ctx, "stream-kubelet")
	np, err := c.componentPod(appNode)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := containerStatus(np, "blobfs")
	pid, err := c.containerPID(np, "blobfs")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	t.Logf("stopping kubelet, then kill -9 of the driver (pid %d)", pid)
	c.procs.get("kubelet").stop(syscall.SIGTERM, 60*time.Second)
	syscall.Kill(pid, syscall.SIGKILL)
	if err := c.startKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := c.waitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.waitRestarted(ctx, np.Name, "blobfs", st.RestartCount); err != nil {
		t.Fatal(err)
	}
	if err := c.waitDriverRegistered(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet back and the driver registered %s after the stop", time.Since(at).Round(100*time.Millisecond))
	reportPause(t, ctx, pod, "kubelet restart with the driver killed", at)
	reader := c.podWith("kubelet-reader", "set -e; test -s /data/stream; echo read it; sleep 3600", pvcVolume("data", "stream-kubelet", false))
	runPod(t, ctx, reader)
	if err := waitUntil(ctx, "a pod created after the restart read the claim", 3*time.Minute, func() (bool, error) {
		if p, err := c.pod(reader.Name); err != nil || p.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		return strings.Contains(podLog(t, reader.Name), "read it"), nil
	}); err != nil {
		t.Fatal(err)
	}
	finishStream(t, ctx, pod, container)
}

// --- 8. rolling update ----------------------------------------------------

// TestRollingUpdate: `kubectl rollout restart` of the keeper's and then
// the node plugin's DaemonSet while a pod streams. With maxSurge each new
// pod starts beside the old one: the new keeper takes the FUSE
// connections over from the old, the new driver adopts the mounts once
// the old one has released them, and the old pod is deleted. No error,
// every byte in the store.
func TestRollingUpdate(t *testing.T) {
	ctx := testContext(t)
	keepDriverUp(t)
	c := theCluster
	pod, container := startStream(t, ctx, "stream-rollout")
	for _, app := range []string{appKeeper, appNode} {
		old, err := c.componentPod(app)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if out, err := c.kubectl("rollout", "restart", "-n", systemNS, "daemonset/"+app); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if out, err := c.kubectl("rollout", "status", "-n", systemNS, "daemonset/"+app, "--timeout=5m"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		now, err := c.componentPod(app)
		if err != nil {
			t.Fatal(err)
		}
		if now.Name == old.Name {
			t.Fatalf("%s: pod %s still runs after the rollout", app, old.Name)
		}
		t.Logf("%s rolled out (%s -> %s) in %s", app, old.Name, now.Name, time.Since(at).Round(100*time.Millisecond))
		reportPause(t, ctx, pod, "rollout of "+app, at)
	}
	if err := c.waitDriverRegistered(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	finishStream(t, ctx, pod, container)
}
