package csi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
)

// TestKubeletSequence drives the real driver over its socket the way
// kubelet does for a PersistentVolume used by two pods on one node, with
// real blobfs mounts against Azurite: registration calls, NodeStageVolume
// at plugins/kubernetes.io/csi/DRIVER/SHA256(handle)/globalmount,
// NodePublishVolume at pods/UID/volumes/kubernetes.io~csi/PV/mount for
// each pod, a file written through one pod's mount and read through the
// other's and in Azurite through the SDK, then unpublish and unstage
// leaving nothing mounted. It also scrapes the metrics endpoint.
func TestKubeletSequence(t *testing.T) {
	needFUSE(t)
	az := azuriteEnv(t)
	metricsAddr := freeAddr(t)
	d := startDriver(t, driverOptions{metrics: metricsAddr})
	ctx := context.Background()

	// Registration: what the node-driver-registrar and kubelet ask.
	info, err := d.id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "blob.csi.blobfs.io" || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	ni, err := d.node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-1" {
		t.Fatalf("NodeGetInfo = %v, %v", ni, err)
	}
	caps, err := d.node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[csipb.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range caps.GetCapabilities() {
		want[c.GetRpc().GetType()] = true
	}
	for _, c := range []csipb.NodeServiceCapability_RPC_Type{csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS, csipb.NodeServiceCapability_RPC_VOLUME_CONDITION,
		csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP} {
		if !want[c] {
			t.Errorf("NodeGetCapabilities lacks %v", c)
		}
	}

	// The provisioner creates the volume (with --extra-create-metadata).
	params := az.params()
	params[keyPVCName] = "data"
	params[keyPVCNamespace] = "team-a"
	params[keyPVName] = "pvc-0f3e"
	vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: "pvc-0f3e", Parameters: params, Secrets: az.secrets(),
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	handle := vol.GetVolume().GetVolumeId()
	id, err := parseVolumeID(handle)
	if err != nil || !strings.HasPrefix(id.Container, "team-a-data") {
		t.Fatalf("volume id %q: container %q, %v; want the PVC's namespace and name", handle, id.Container, err)
	}
	t.Cleanup(func() {
		if _, err := d.ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: handle, Secrets: az.secrets()}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})

	sum := sha256.Sum256([]byte(handle))
	staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", hex.EncodeToString(sum[:]), "globalmount")
	// kubelet creates the staging directory and each target's parent.
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	stage := &csipb.NodeStageVolumeRequest{
		VolumeId: handle, StagingTargetPath: staging, VolumeCapability: mountCap(rwx),
		VolumeContext: vol.GetVolume().GetVolumeContext(), Secrets: az.secrets(),
	}
	if _, err := d.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := d.node.NodeStageVolume(ctx, stage); err != nil {
		t.Fatalf("NodeStageVolume again (idempotent): %v", err)
	}
	var targets []string
	for _, uid := range []string{"7c1d2b4e-pod-a", "9e8f7a6b-pod-b"} {
		target := filepath.Join(d.kubelet, "pods", uid, "volumes/kubernetes.io~csi/pvc-0f3e/mount")
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			t.Fatal(err)
		}
		pub := &csipb.NodePublishVolumeRequest{
			VolumeId: handle, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(rwx),
			VolumeContext: vol.GetVolume().GetVolumeContext(),
		}
		for range 2 { // kubelet retries; the second call is a no-op
			if _, err := d.node.NodePublishVolume(ctx, pub); err != nil {
				t.Fatalf("NodePublishVolume %s: %v", uid, err)
			}
		}
		targets = append(targets, target)
	}

	// Pod A writes, pod B reads.
	data := bytes.Repeat([]byte("blobfs csi\n"), 100_000)
	if err := os.MkdirAll(filepath.Join(targets[0], "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(targets[0], "logs/app.log"), data, 0o644); err != nil {
		t.Fatalf("write through pod A: %v", err)
	}
	// Pod B shares pod A's mount, so the kernel may still hold the pages
	// A wrote: drop them, so that the read reaches blobfs (the cache
	// metrics below count it) and the data comes from the store.
	if f, err := os.Open(filepath.Join(targets[1], "logs/app.log")); err == nil {
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
	got, err := os.ReadFile(filepath.Join(targets[1], "logs/app.log"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through pod B: %d bytes, %v; want %d bytes", len(got), err, len(data))
	}
	// And the blob is in Azurite, as the SDK sees it.
	store, err := blobstore.NewAzure(blobstore.AzureConfig{Account: az.account, Endpoint: az.endpoint, Key: az.key, Container: id.Container})
	if err != nil {
		t.Fatal(err)
	}
	attrs, err := store.Stat(ctx, "logs/app.log")
	if err != nil || attrs.Size != int64(len(data)) {
		t.Fatalf("blob in Azurite: %+v, %v", attrs, err)
	}
	buf := make([]byte, len(data))
	if n, err := store.ReadAt(ctx, "logs/app.log", buf, 0, ""); (err != nil && err != io.EOF) || !bytes.Equal(buf[:n], data) {
		t.Fatalf("blob content in Azurite differs (%d bytes, %v)", n, err)
	}

	// kubelet asks for stats.
	stats, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: handle, VolumePath: targets[0]})
	if err != nil || len(stats.GetUsage()) == 0 || stats.GetVolumeCondition().GetAbnormal() {
		t.Fatalf("NodeGetVolumeStats = %v, %v", stats, err)
	}

	// Metrics: the calls, the FUSE operations and the store requests
	// above are counted. A file open with data not uploaded yet shows in
	// the volume's gauges.
	open, err := os.Create(filepath.Join(targets[0], "logs/open.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Write(data[:300_000]); err != nil {
		t.Fatal(err)
	}
	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	body := []byte(scrape())
	volLabel := fmt.Sprintf("{volume=%q}", handle)
	for _, want := range []string{
		"blobfs_volume_dirty_files" + volLabel + " 1",
		"blobfs_volume_dirty_bytes" + volLabel + " 300000",
		"blobfs_volume_uploading_bytes" + volLabel + " 0",
		"blobfs_volume_store_requests_in_flight" + volLabel + " 0",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, grepLines(string(body), "blobfs_volume_"))
		}
	}
	for _, positive := range []string{"blobfs_volume_spill_bytes", "blobfs_volume_cache_bytes", "blobfs_volume_cache_hits_total", "blobfs_volume_cache_misses_total"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(positive+volLabel) + ` [1-9]`).Match(body) {
			t.Errorf("%s is 0 with a file open for writing and reads done:\n%s", positive, grepLines(string(body), positive))
		}
	}
	if err := open.Close(); err != nil {
		t.Fatal(err)
	}
	if after := scrape(); !strings.Contains(after, "blobfs_volume_dirty_bytes"+volLabel+" 0") {
		t.Errorf("dirty bytes after close:\n%s", grepLines(after, "blobfs_volume_dirty_bytes"))
	}
	for _, want := range []string{
		`blobfs_csi_requests_total{code="OK",method="NodeStageVolume"} 2`,
		`blobfs_fuse_operations_total{op="write",result="ok"}`,
		`blobfs_store_requests_total{op="Put",result="ok"}`,
		`blobfs_mounts{state="published"} 2`,
		`blobfs_mounts{state="staged"} 1`,
		`blobfs_bytes_total{direction="write",layer="fuse"} 1.4e+06`, // app.log and open.log
		`blobfs_csi_request_duration_seconds_bucket{method="NodePublishVolume"`,
		`blobfs_cache_hits_total`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The reads above fetched the file once (a miss) and answered the
	// rest of it from the block cache (hits).
	for _, counter := range []string{"blobfs_cache_hits_total", "blobfs_cache_misses_total"} {
		if !regexp.MustCompile(`(?m)^` + counter + ` [1-9]`).Match(body) {
			t.Errorf("%s is 0 after reads through the mount:\n%s", counter, grepLines(string(body), counter))
		}
	}

	// Pods go away; the volume is unstaged.
	for _, target := range targets {
		for range 2 {
			if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
				t.Fatalf("NodeUnpublishVolume: %v", err)
			}
		}
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Errorf("target %s still there after unpublish: %v", target, err)
		}
	}
	for range 2 {
		if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	if left := mountsUnder(d.kubelet); len(left) > 0 {
		t.Fatalf("still mounted after unstage: %v", left)
	}
	if after := scrape(); strings.Contains(after, volLabel) {
		t.Errorf("the unstaged volume's series are still reported:\n%s", grepLines(after, volLabel))
	}
	if recs := d.state.List(); len(recs) != 0 {
		t.Errorf("node state still has %d volumes", len(recs))
	}
}

// freeAddr returns a loopback address with a free port.
func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
