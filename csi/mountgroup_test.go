package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// groupCap is a mount capability carrying a pod's fsGroup.
func groupCap(mode csipb.VolumeCapability_AccessMode_Mode, group string) *csipb.VolumeCapability {
	c := mountCap(mode)
	c.GetMount().VolumeMountGroup = group
	return c
}

// statOf is lstat that fails the test.
func statOf(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("lstat %s: %v", path, err)
	}
	return &st
}

// asUser runs a shell command as uid:gid with the supplementary groups a
// pod's processes get (its fsGroup among them).
func asUser(t *testing.T, uid, gid uint32, groups []uint32, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as %d:%d %v: %s: %v\n%s", uid, gid, groups, script, err, out)
	}
}

// openPath lets other users reach dir: t.TempDir makes its directories
// 0700, and the pods' processes are not root.
func openPath(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVolumeMountGroup drives a volume the way kubelet does for pods with
// an fsGroup when the driver has VOLUME_MOUNT_GROUP, with real mounts
// against Azurite: the mount is made for the pod's group (the root shows
// it with the set-group-ID bit, files a non-root process makes take it,
// blobs that store no group show it), a pod with another fsGroup is
// refused while the first uses the staged mount and is served, for its
// own group, once it is gone, and a malformed group is InvalidArgument.
func TestVolumeMountGroup(t *testing.T) {
	needFUSE(t)
	az := azuriteEnv(t)
	d := startDriver(t, driverOptions{})
	ctx := context.Background()

	caps, err := d.node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	advertised := false
	for _, c := range caps.GetCapabilities() {
		advertised = advertised || c.GetRpc().GetType() == csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP
	}
	if !advertised {
		t.Fatal("NodeGetCapabilities lacks VOLUME_MOUNT_GROUP: kubelet would chown every file instead")
	}

	vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: "pvc-fsgroup", Parameters: az.params(), Secrets: az.secrets(),
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	handle := vol.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		if _, err := d.ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: handle, Secrets: az.secrets()}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	id, _ := parseVolumeID(handle)
	store, err := blobstore.NewAzure(blobstore.AzureConfig{Account: az.account, Endpoint: az.endpoint, Key: az.key, Container: id.Container})
	if err != nil {
		t.Fatal(err)
	}
	// A blob another tool wrote: no attributes.
	if _, err := store.Put(ctx, "legacy.txt", []byte("old"), blobstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}

	sum := sha256.Sum256([]byte(handle))
	staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", hex.EncodeToString(sum[:]), "globalmount")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	target := func(pod string) string {
		p := filepath.Join(d.kubelet, "pods", pod, "volumes/kubernetes.io~csi/pvc-fsgroup/mount")
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		openPath(t, filepath.Dir(p))
		return p
	}
	stage := func(group string) error {
		_, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
			VolumeId: handle, StagingTargetPath: staging, VolumeCapability: groupCap(rwx, group),
			VolumeContext: vol.GetVolume().GetVolumeContext(), Secrets: az.secrets(),
		})
		return err
	}
	publish := func(target, group string) error {
		_, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: handle, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: groupCap(rwx, group), VolumeContext: vol.GetVolume().GetVolumeContext(),
		})
		return err
	}
	unpublish := func(target string) {
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume %s: %v", target, err)
		}
	}
	wantGroupRoot := func(dir string, gid uint32) {
		t.Helper()
		st := statOf(t, dir)
		if st.Gid != gid || st.Mode&syscall.S_ISGID == 0 || st.Mode&0o070 != 0o070 {
			t.Errorf("root of the volume at %s: gid %d mode %#o; want gid %d, set-group-ID and group rwx", dir, st.Gid, st.Mode, gid)
		}
	}

	// A malformed group names the field, at stage and at publish.
	for _, bad := range []string{"staff", "-1", "4294967295", "20 00"} {
		for what, err := range map[string]error{"stage": stage(bad), "publish": publish(target("pod-bad"), bad)} {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "volume_mount_group") {
				t.Errorf("%s with volume_mount_group %q: %v; want InvalidArgument naming volume_mount_group", what, bad, err)
			}
		}
	}

	// Pod A, fsGroup 2000, runs as 1000:3000.
	if err := stage("2000"); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if rec, _ := d.state.Get(handle); rec.MountGroup != "2000" {
		t.Errorf("node state records group %q, want 2000 (a restarted driver must mount it the same way)", rec.MountGroup)
	}
	podA := target("pod-a")
	if err := publish(podA, "2000"); err != nil {
		t.Fatalf("NodePublishVolume pod A: %v", err)
	}
	wantGroupRoot(podA, 2000)
	asUser(t, 1000, 3000, []uint32{2000}, "echo hello > "+podA+"/a.txt && mkdir "+podA+"/dir && echo x > "+podA+"/dir/b.txt")
	for _, p := range []string{"a.txt", "dir", "dir/b.txt"} {
		if st := statOf(t, filepath.Join(podA, p)); st.Uid != 1000 || st.Gid != 2000 {
			t.Errorf("%s made by 1000:3000: owner %d:%d, want 1000:2000", p, st.Uid, st.Gid)
		}
	}
	if st := statOf(t, filepath.Join(podA, "dir")); st.Mode&syscall.S_ISGID == 0 {
		t.Errorf("new directory mode %#o: lacks the set-group-ID bit, so its entries would not inherit the group", st.Mode)
	}
	if st := statOf(t, filepath.Join(podA, "legacy.txt")); st.Gid != 2000 {
		t.Errorf("blob without attributes: gid %d, want the pod's group 2000", st.Gid)
	}
	// The group is stored with the file, as the next mount will see it.
	if a, err := store.Stat(ctx, "a.txt"); err != nil || a.Metadata[blobstore.MetaGID] != "2000" {
		t.Errorf("a.txt in Azurite: metadata %v, %v; want %s=2000", a.Metadata, err, blobstore.MetaGID)
	}

	// Pod B, fsGroup 3000, while pod A uses the mount: refused, saying why.
	podB := target("pod-b")
	err = publish(podB, "3000")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "fsGroup 2000") || !strings.Contains(err.Error(), "3000") {
		t.Fatalf("NodePublishVolume pod B with another fsGroup: %v; want FailedPrecondition naming both groups", err)
	}
	// A stage retry for another group leaves the mount alone.
	if err := stage("3000"); err != nil {
		t.Fatalf("NodeStageVolume again for another group: %v", err)
	}
	wantGroupRoot(podA, 2000)
	// Pod C, no fsGroup, asks nothing: it shares the mount.
	podC := target("pod-c")
	if err := publish(podC, ""); err != nil {
		t.Fatalf("NodePublishVolume pod C without fsGroup: %v", err)
	}
	wantGroupRoot(podC, 2000)

	// Pods A and C go; kubelet keeps the volume staged for pod B, whose
	// retry mounts it again for group 3000.
	unpublish(podA)
	unpublish(podC)
	if err := publish(podB, "3000"); err != nil {
		t.Fatalf("NodePublishVolume pod B once the others are gone: %v", err)
	}
	wantGroupRoot(podB, 3000)
	if st := statOf(t, filepath.Join(podB, "a.txt")); st.Gid != 2000 {
		t.Errorf("a.txt stores group 2000 and shows %d", st.Gid)
	}
	if st := statOf(t, filepath.Join(podB, "legacy.txt")); st.Gid != 3000 {
		t.Errorf("blob without attributes shows gid %d, want 3000", st.Gid)
	}
	asUser(t, 1001, 3000, []uint32{3000}, "cat "+podB+"/a.txt > /dev/null && echo y > "+podB+"/c.txt")
	if st := statOf(t, filepath.Join(podB, "c.txt")); st.Gid != 3000 {
		t.Errorf("c.txt made for pod B: gid %d, want 3000", st.Gid)
	}
	if rec, _ := d.state.Get(handle); rec.MountGroup != "3000" {
		t.Errorf("node state records group %q, want 3000", rec.MountGroup)
	}
	unpublish(podB)
	if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}

	// An inline volume is its pod's own mount: its group applies.
	inline := target("pod-inline")
	if _, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: "inline-fsgroup", TargetPath: inline, VolumeCapability: groupCap(rwx, "2500"), Secrets: az.secrets(),
		VolumeContext: map[string]string{keyEphemeral: "true", keyPodNamespace: "team-a", "containerName": id.Container,
			"storageAccount": az.account, "server": az.endpoint},
	}); err != nil {
		t.Fatalf("NodePublishVolume inline: %v", err)
	}
	wantGroupRoot(inline, 2500)
	if st := statOf(t, filepath.Join(inline, "legacy.txt")); st.Gid != 2500 {
		t.Errorf("inline volume: blob without attributes shows gid %d, want 2500", st.Gid)
	}
	if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "inline-fsgroup", TargetPath: inline}); err != nil {
		t.Fatalf("NodeUnpublishVolume inline: %v", err)
	}
}

// TestMountGroupOptions: the group goes into the mount's options unless the
// volume's mount options set the owner, and the root's mode keeps the
// mount's directory mode.
func TestMountGroupOptions(t *testing.T) {
	for _, c := range []struct {
		opts     []string
		gid      uint32
		rootMode uint32
	}{
		{nil, 2000, 0o2777},
		{[]string{"umask=022"}, 2000, 0o2775},
		{[]string{"dir-mode=0700"}, 2000, 0o2770},
		{[]string{"gid=5"}, 5, 0},
		{[]string{"uid=7"}, 0, 0},
	} {
		s, err := parseMountOptions(c.opts, "test")
		if err != nil {
			t.Fatal(err)
		}
		o := s.FS
		withMountGroup(&o, "2000")
		if o.GID != c.gid || o.RootMode != c.rootMode {
			t.Errorf("options %v with group 2000: gid %d root mode %#o; want %d, %#o", c.opts, o.GID, o.RootMode, c.gid, c.rootMode)
		}
	}
}

// TestMountGroupRepairFake: the group is part of the volume's record, so a
// staged mount that died is mounted again for the same group; and a mount
// whose credentials came with the request and are gone (a driver restart)
// keeps its group rather than being unmounted for another.
func TestMountGroupRepairFake(t *testing.T) {
	fc := newFakeContainers()
	fm := newFakeMounter()
	fm.containers = fc
	secrets := fakeSecrets{"team-a/creds": {secretAccountName: blobstore.AzuriteAccount, secretAccountKey: blobstore.AzuriteAccountKey}}
	d := startDriver(t, driverOptions{mounter: fm, containers: fc, secrets: secrets})
	ctx := context.Background()
	for _, viaSecret := range []bool{true, false} {
		params := map[string]string{"storageAccount": blobstore.AzuriteAccount}
		var reqSecrets map[string]string
		if viaSecret {
			params["secretName"], params["secretNamespace"] = "creds", "team-a"
		} else {
			reqSecrets = secrets["team-a/creds"]
		}
		name := fmt.Sprintf("pvc-secret-%v", viaSecret)
		vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, Parameters: params, Secrets: reqSecrets, VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
		if err != nil {
			t.Fatal(err)
		}
		id, vctx := vol.GetVolume().GetVolumeId(), vol.GetVolume().GetVolumeContext()
		staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/x", name, "globalmount")
		targetA := filepath.Join(d.kubelet, "pods/a", name, "mount")
		targetB := filepath.Join(d.kubelet, "pods/b", name, "mount")
		for _, p := range []string{staging, filepath.Dir(targetA), filepath.Dir(targetB)} {
			os.MkdirAll(p, 0o750)
		}
		wantSpec := func(when string, gid, rootMode uint32) {
			t.Helper()
			fm.mu.Lock()
			o := fm.specs[staging].FS
			fm.mu.Unlock()
			if o.GID != gid || o.RootMode != rootMode {
				t.Errorf("%s (secret %v): mounted with gid %d root mode %#o; want %d, %#o", when, viaSecret, o.GID, o.RootMode, gid, rootMode)
			}
		}
		if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: groupCap(rwx, "2000"), VolumeContext: vctx, Secrets: reqSecrets}); err != nil {
			t.Fatal(err)
		}
		wantSpec("staged", 2000, 0o2777)
		if _, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetA,
			VolumeCapability: groupCap(rwx, "2000"), VolumeContext: vctx}); err != nil {
			t.Fatal(err)
		}
		if viaSecret {
			// The staged mount dies; the health check mounts it again.
			fm.mu.Lock()
			fm.dead[staging], fm.dead[targetA] = true, true
			fm.mu.Unlock()
			d.forget(id)
			d.checkMounts(ctx)
			wantSpec("mounted again after it died", 2000, 0o2777)
		}
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetA}); err != nil {
			t.Fatal(err)
		}
		d.forget(id) // a restart: request credentials are gone
		_, err = d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetB,
			VolumeCapability: groupCap(rwx, "3000"), VolumeContext: vctx})
		if err != nil {
			t.Fatalf("publish for another group, no pod on the mount (secret %v): %v", viaSecret, err)
		}
		rec, _ := d.state.Get(id)
		if viaSecret {
			wantSpec("mounted again for another group", 3000, 0o2777)
			if rec.MountGroup != "3000" {
				t.Errorf("record's group %q, want 3000", rec.MountGroup)
			}
		} else {
			wantSpec("kept: its credentials are gone", 2000, 0o2777)
			if rec.MountGroup != "2000" {
				t.Errorf("record's group %q, want 2000 (the mount's)", rec.MountGroup)
			}
		}
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetB}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
}
