package csi

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// backend is one way to run the driver in tests: "fake" (mounts in a
// table, containers in memory; always) and "real" (blobfs mounts served by
// this process, Azurite; needs root, /dev/fuse and BLOBFS_TEST_AZURITE).
type backend struct {
	name  string
	start func(t *testing.T, o driverOptions) (*testDriver, azurite)
}

var backends = []backend{
	{"fake", func(t *testing.T, o driverOptions) (*testDriver, azurite) {
		fc := newFakeContainers()
		fm := newFakeMounter()
		fm.containers = fc
		o.mounter, o.containers = fm, fc
		d := startDriver(t, o)
		t.Cleanup(func() {
			if n := fm.count(); n != 0 {
				t.Errorf("%d fake mounts left", n)
			}
		})
		return d, azurite{account: blobstore.AzuriteAccount, endpoint: "http://127.0.0.1:10000/" + blobstore.AzuriteAccount, key: blobstore.AzuriteAccountKey}
	}},
	{"real", func(t *testing.T, o driverOptions) (*testDriver, azurite) {
		needFUSE(t)
		az := azuriteEnv(t)
		return startDriver(t, o), az
	}},
}

// TestBadInput sends every RPC malformed or impossible requests. Each must
// get a clear gRPC error with the expected code (and a message naming the
// culprit), no panic, and leave nothing mounted (checked when the driver
// stops).
func TestBadInput(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			d, az := b.start(t, driverOptions{})
			ctx := context.Background()
			vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "bad-input-vol", Parameters: az.params(), Secrets: az.secrets(),
				VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
			if err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			good := vol.GetVolume().GetVolumeId()
			t.Cleanup(func() {
				d.ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: good, Secrets: az.secrets()})
			})
			missing := volumeID{Account: az.account, Container: "no-such-container-here", Endpoint: az.endpoint}.String()
			staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io/abc/globalmount")
			target := filepath.Join(d.kubelet, "pods/uid/volumes/kubernetes.io~csi/pv/mount")
			outside := filepath.Join(filepath.Dir(d.kubelet), "outside")
			for _, p := range []string{staging, filepath.Dir(target), outside} {
				if err := os.MkdirAll(p, 0o750); err != nil {
					t.Fatal(err)
				}
			}
			// Regular files where kubelet would have made directories.
			fileStaging := filepath.Join(filepath.Dir(filepath.Dir(staging)), "file", "globalmount")
			fileTarget := filepath.Join(filepath.Dir(target), "file-mount")
			for _, p := range []string{fileStaging, fileTarget} {
				if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o640); err != nil {
					t.Fatal(err)
				}
			}
			wrongKey := map[string]string{secretAccountName: az.account, secretAccountKey: "d3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXk="}
			with := func(m map[string]string, kv ...string) map[string]string {
				out := map[string]string{}
				for k, v := range m {
					out[k] = v
				}
				for i := 0; i+1 < len(kv); i += 2 {
					out[kv[i]] = kv[i+1]
				}
				return out
			}
			// dotted is the endpoint with seg in its path, before the
			// account (path-style, as Azurite's).
			dotted := func(seg string) string {
				u, _ := url.Parse(az.endpoint)
				return u.Scheme + "://" + u.Host + seg + strings.TrimPrefix(u.Path, "/")
			}
			caps := []*csipb.VolumeCapability{mountCap(rwx)}
			block := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
				AccessMode: &csipb.VolumeCapability_AccessMode{Mode: rwx}}
			ext4 := mountCap(rwx)
			ext4.GetMount().FsType = "ext4"
			noMode := mountCap(rwx)
			noMode.AccessMode = nil
			stage := func(mod func(r *csipb.NodeStageVolumeRequest)) func() error {
				return func() error {
					r := &csipb.NodeStageVolumeRequest{VolumeId: good, StagingTargetPath: staging, VolumeCapability: mountCap(rwx), Secrets: az.secrets()}
					mod(r)
					_, err := d.node.NodeStageVolume(ctx, r)
					return err
				}
			}
			publish := func(mod func(r *csipb.NodePublishVolumeRequest)) func() error {
				return func() error {
					r := &csipb.NodePublishVolumeRequest{VolumeId: good, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(rwx)}
					mod(r)
					_, err := d.node.NodePublishVolume(ctx, r)
					return err
				}
			}
			inline := func(kv ...string) map[string]string {
				return with(map[string]string{keyEphemeral: "true", keyPodNamespace: "team-a", "containerName": "no-such-container-here",
					"storageAccount": az.account, "server": az.endpoint}, kv...)
			}
			create := func(mod func(r *csipb.CreateVolumeRequest)) func() error {
				return func() error {
					r := &csipb.CreateVolumeRequest{Name: "bad-input-create", Parameters: az.params(), Secrets: az.secrets(), VolumeCapabilities: caps}
					mod(r)
					_, err := d.ctrl.CreateVolume(ctx, r)
					return err
				}
			}

			cases := []struct {
				name string
				call func() error
				code codes.Code
				msg  string // the message must contain this
			}{
				{"CreateVolume/no name", create(func(r *csipb.CreateVolumeRequest) { r.Name = "" }), codes.InvalidArgument, "name"},
				{"CreateVolume/no capabilities", create(func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities = nil }), codes.InvalidArgument, "volume_capabilities"},
				{"CreateVolume/block", create(func(r *csipb.CreateVolumeRequest) { r.VolumeCapabilities = []*csipb.VolumeCapability{block} }), codes.InvalidArgument, "block"},
				{"CreateVolume/unknown parameter", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "skuNmae", "Premium_LRS") }), codes.InvalidArgument, `"skuNmae"; did you mean "skuName"?`},
				{"CreateVolume/skuName without an account", create(func(r *csipb.CreateVolumeRequest) {
					r.Parameters, r.Secrets = map[string]string{"skuName": "Premium_LRS"}, nil
				}), codes.InvalidArgument, "skuName=Premium_LRS: blobfs does not create storage accounts"},
				{"CreateVolume/protocol nfs", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "protocol", "nfs") }), codes.InvalidArgument, "nfs"},
				{"CreateVolume/bad account", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "storageAccount", "Bad_Account") }), codes.InvalidArgument, "storageAccount"},
				{"CreateVolume/bad container name", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "containerName", "Bad--Name") }), codes.InvalidArgument, "containerName"},
				{"CreateVolume/bad mount option", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "mountOptions", "cache-dir=/etc") }), codes.InvalidArgument, "cache-dir"},
				{"CreateVolume/server with /../", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "server", dotted("/x/../")) }), codes.InvalidArgument, "server"},
				{"CreateVolume/server with /./", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "server", dotted("/./")) }), codes.InvalidArgument, "server"},
				{"CreateVolume/server with /%2e%2e/", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "server", dotted("/x/%2e%2e/")) }), codes.InvalidArgument, "server"},
				{"CreateVolume/server ending in /..", create(func(r *csipb.CreateVolumeRequest) { r.Parameters = with(az.params(), "server", az.endpoint+"/x/..") }), codes.InvalidArgument, "server"},
				// Every request carries the volume's credential: never to
				// the metadata service or Azure's platform endpoint.
				{"CreateVolume/server at the metadata service", create(func(r *csipb.CreateVolumeRequest) {
					r.Parameters = with(az.params(), "server", "http://169.254.169.254/metadata")
				}), codes.InvalidArgument, "instance metadata service"},
				{"CreateVolume/server at WireServer", create(func(r *csipb.CreateVolumeRequest) {
					r.Parameters = with(az.params(), "server", "http://168.63.129.16/")
				}), codes.InvalidArgument, "WireServer"},
				{"CreateVolume/from snapshot", create(func(r *csipb.CreateVolumeRequest) {
					r.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: "s"}}}
				}), codes.InvalidArgument, "volume_content_source"},
				{"CreateVolume/unknown secret key", create(func(r *csipb.CreateVolumeRequest) { r.Secrets = with(az.secrets(), "password", "x") }), codes.InvalidArgument, `"password"`},
				{"CreateVolume/key not base64", create(func(r *csipb.CreateVolumeRequest) { r.Secrets = with(az.secrets(), secretAccountKey, "not base64!") }), codes.InvalidArgument, "credentials"},
				{"CreateVolume/account mismatch", create(func(r *csipb.CreateVolumeRequest) { r.Secrets = with(az.secrets(), secretAccountName, "otheraccount") }), codes.InvalidArgument, "storageAccount"},
				{"CreateVolume/wrong key", create(func(r *csipb.CreateVolumeRequest) { r.Secrets = wrongKey }), codes.PermissionDenied, ""},
				{"CreateVolume/no account", create(func(r *csipb.CreateVolumeRequest) { r.Parameters, r.Secrets = nil, nil }), codes.InvalidArgument, "storageAccount"},

				{"DeleteVolume/no id", func() error { _, err := d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{}); return err }, codes.InvalidArgument, "volume_id"},
				{"DeleteVolume/malformed id is success", func() error {
					_, err := d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: "blobfs1#x"})
					return err
				}, codes.OK, ""},
				{"DeleteVolume/wrong key", func() error {
					_, err := d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: good, Secrets: wrongKey})
					return err
				}, codes.PermissionDenied, ""},

				{"ValidateVolumeCapabilities/no id", func() error {
					_, err := d.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: caps})
					return err
				}, codes.InvalidArgument, "volume_id"},
				{"ValidateVolumeCapabilities/malformed id", func() error {
					_, err := d.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: "blobfs1#UPPER#c", VolumeCapabilities: caps})
					return err
				}, codes.InvalidArgument, "malformed volume id"},
				{"ValidateVolumeCapabilities/no capabilities", func() error {
					_, err := d.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: good})
					return err
				}, codes.InvalidArgument, "volume_capabilities"},
				{"ValidateVolumeCapabilities/container does not exist", func() error {
					_, err := d.ctrl.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: missing, VolumeCapabilities: caps, Secrets: az.secrets()})
					return err
				}, codes.NotFound, ""},

				{"NodeStageVolume/no id", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeId = "" }), codes.InvalidArgument, "volume_id"},
				{"NodeStageVolume/no path", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = "" }), codes.InvalidArgument, "staging_target_path"},
				{"NodeStageVolume/relative path", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = "plugins/x/globalmount" }), codes.InvalidArgument, "absolute"},
				{"NodeStageVolume/outside kubelet", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = outside }), codes.InvalidArgument, "kubelet directory"},
				{"NodeStageVolume/escaping with ..", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = d.kubelet + "/../outside" }), codes.InvalidArgument, "kubelet directory"},
				{"NodeStageVolume/kubelet dir itself", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = d.kubelet }), codes.InvalidArgument, "kubelet directory"},
				{"NodeStageVolume/path is a file", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = fileStaging }), codes.InvalidArgument, "staging_target_path"},
				{"NodeStageVolume/path below a file", stage(func(r *csipb.NodeStageVolumeRequest) { r.StagingTargetPath = fileStaging + "/sub" }), codes.InvalidArgument, "staging_target_path"},
				{"NodeStageVolume/no capability", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = nil }), codes.InvalidArgument, "volume_capability"},
				{"NodeStageVolume/block", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = block }), codes.InvalidArgument, "block"},
				{"NodeStageVolume/ext4", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = ext4 }), codes.InvalidArgument, "fs_type"},
				{"NodeStageVolume/no access mode", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = noMode }), codes.InvalidArgument, "access_mode"},
				{"NodeStageVolume/malformed id", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeId = "pvc-123" }), codes.InvalidArgument, "volume_id"},
				{"NodeStageVolume/unknown mount option", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = mountCap(rwx, "streaming=true") }), codes.InvalidArgument, "streaming"},
				{"NodeStageVolume/mount group not a number", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = groupCap(rwx, "staff") }), codes.InvalidArgument, "volume_mount_group"},
				{"NodeStageVolume/mount group -1", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = groupCap(rwx, "-1") }), codes.InvalidArgument, "volume_mount_group"},
				{"NodeStageVolume/bad mount option value", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeCapability = mountCap(rwx, "block-cache-mb=lots") }), codes.InvalidArgument, "block-cache-mb"},
				{"NodeStageVolume/unknown context key", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeContext = map[string]string{"containerNmae": "x"} }), codes.InvalidArgument, "containerNmae"},
				{"NodeStageVolume/unknown secret key", stage(func(r *csipb.NodeStageVolumeRequest) { r.Secrets = with(az.secrets(), "azurestorageaccountkey2", "x") }), codes.InvalidArgument, "azurestorageaccountkey2"},
				{"NodeStageVolume/wrong key", stage(func(r *csipb.NodeStageVolumeRequest) { r.Secrets = wrongKey }), codes.PermissionDenied, ""},
				{"NodeStageVolume/endpoint with /../ in the id", stage(func(r *csipb.NodeStageVolumeRequest) {
					r.VolumeId = volumeID{Account: az.account, Container: "bad-input-vol", Endpoint: dotted("/x/../")}.String()
				}), codes.InvalidArgument, "volume_id"},
				{"NodeStageVolume/container does not exist", stage(func(r *csipb.NodeStageVolumeRequest) { r.VolumeId = missing }), codes.NotFound, "no-such-container-here"},
				{"NodeStageVolume/secretName without API", stage(func(r *csipb.NodeStageVolumeRequest) {
					r.Secrets = nil
					r.VolumeContext = map[string]string{"secretName": "s", "secretNamespace": "ns"}
				}), codes.FailedPrecondition, "secretName"},

				{"NodePublishVolume/no id", publish(func(r *csipb.NodePublishVolumeRequest) { r.VolumeId = "" }), codes.InvalidArgument, "volume_id"},
				{"NodePublishVolume/no target", publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "" }), codes.InvalidArgument, "target_path"},
				{"NodePublishVolume/target outside kubelet", publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = filepath.Join(outside, "mount") }), codes.InvalidArgument, "kubelet directory"},
				{"NodePublishVolume/relative target", publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "pods/x/mount" }), codes.InvalidArgument, "absolute"},
				{"NodePublishVolume/target is a file", publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = fileTarget }), codes.InvalidArgument, "target_path"},
				{"NodePublishVolume/staged, target is a file", func() error {
					if err := stage(func(*csipb.NodeStageVolumeRequest) {})(); err != nil {
						t.Fatalf("NodeStageVolume: %v", err)
					}
					defer func() {
						if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: good, StagingTargetPath: staging}); err != nil {
							t.Fatalf("NodeUnstageVolume: %v", err)
						}
					}()
					return publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = fileTarget })()
				}, codes.InvalidArgument, "target_path"},
				{"NodePublishVolume/target below a file", publish(func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = fileTarget + "/sub" }), codes.InvalidArgument, "target_path"},
				{"NodePublishVolume/staging path is a file", publish(func(r *csipb.NodePublishVolumeRequest) { r.StagingTargetPath = fileStaging }), codes.InvalidArgument, "staging_target_path"},
				{"NodePublishVolume/no capability", publish(func(r *csipb.NodePublishVolumeRequest) { r.VolumeCapability = nil }), codes.InvalidArgument, "volume_capability"},
				{"NodePublishVolume/no staging path", publish(func(r *csipb.NodePublishVolumeRequest) { r.StagingTargetPath = "" }), codes.InvalidArgument, "staging_target_path"},
				{"NodePublishVolume/staging outside kubelet", publish(func(r *csipb.NodePublishVolumeRequest) { r.StagingTargetPath = outside }), codes.InvalidArgument, "kubelet directory"},
				{"NodePublishVolume/mount group too large", publish(func(r *csipb.NodePublishVolumeRequest) { r.VolumeCapability = groupCap(rwx, "4294967295") }), codes.InvalidArgument, "volume_mount_group"},
				{"NodePublishVolume/not staged", publish(func(*csipb.NodePublishVolumeRequest) {}), codes.FailedPrecondition, "not staged"},
				{"NodePublishVolume/inline without container", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath, r.Secrets = "csi-0123", "", az.secrets()
					r.VolumeContext = map[string]string{keyEphemeral: "true", keyPodNamespace: "team-a"}
				}), codes.InvalidArgument, "containerName"},
				{"NodePublishVolume/inline without credentials", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath = "csi-0123", ""
					r.VolumeContext = inline()
				}), codes.InvalidArgument, "credentials"},
				{"NodePublishVolume/inline secret of another namespace", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath = "csi-0123", ""
					r.VolumeContext = inline("secretName", "s", "secretNamespace", "kube-system")
				}), codes.PermissionDenied, "kube-system"},
				{"NodePublishVolume/inline container does not exist", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath, r.Secrets = "csi-0123", "", az.secrets()
					r.VolumeContext = inline()
				}), codes.NotFound, "no-such-container-here"},
				{"NodePublishVolume/inline server at the metadata service", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath, r.Secrets = "csi-0123", "", az.secrets()
					r.VolumeContext = inline("containerName", "bad-input-vol", "server", "http://169.254.169.254/metadata")
				}), codes.InvalidArgument, "instance metadata service"},
				{"NodePublishVolume/inline server with /../", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeId, r.StagingTargetPath, r.Secrets = "csi-0123", "", az.secrets()
					r.VolumeContext = inline("containerName", "bad-input-vol", "server", dotted("/x/../"))
				}), codes.InvalidArgument, "server"},
				{"NodePublishVolume/inline bad ephemeral flag", publish(func(r *csipb.NodePublishVolumeRequest) {
					r.VolumeContext = map[string]string{keyEphemeral: "yes please"}
				}), codes.InvalidArgument, "ephemeral"},

				{"NodeUnpublishVolume/no id", func() error {
					_, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{TargetPath: target})
					return err
				}, codes.InvalidArgument, "volume_id"},
				{"NodeUnpublishVolume/no target", func() error {
					_, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: good})
					return err
				}, codes.InvalidArgument, "target_path"},
				{"NodeUnpublishVolume/outside kubelet", func() error {
					_, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: good, TargetPath: outside})
					return err
				}, codes.InvalidArgument, "kubelet directory"},
				{"NodeUnstageVolume/no id", func() error {
					_, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{StagingTargetPath: staging})
					return err
				}, codes.InvalidArgument, "volume_id"},
				{"NodeUnstageVolume/no path", func() error {
					_, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: good})
					return err
				}, codes.InvalidArgument, "staging_target_path"},
				{"NodeUnstageVolume/outside kubelet", func() error {
					_, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: good, StagingTargetPath: "/"})
					return err
				}, codes.InvalidArgument, "kubelet directory"},
				{"NodeGetVolumeStats/no id", func() error {
					_, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumePath: target})
					return err
				}, codes.InvalidArgument, "volume_id"},
				{"NodeGetVolumeStats/no path", func() error {
					_, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: good})
					return err
				}, codes.InvalidArgument, "volume_path"},
				{"NodeGetVolumeStats/unknown volume", func() error {
					_, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: good, VolumePath: target})
					return err
				}, codes.NotFound, "not staged"},
			}
			for _, c := range cases {
				err := c.call()
				st := status.Convert(err)
				if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
					t.Errorf("%s: got %v %q; want %v with %q", c.name, st.Code(), st.Message(), c.code, c.msg)
				}
				if strings.Contains(st.Message(), az.key) || strings.Contains(st.Message(), "d3Jvbmcga2V5") {
					t.Errorf("%s: the error message contains a secret: %q", c.name, st.Message())
				}
				if left := mountsUnder(d.kubelet); len(left) > 0 {
					t.Fatalf("%s left mounts: %v", c.name, left)
				}
			}
			if recs := d.state.List(); len(recs) != 0 {
				t.Errorf("node state records after failed requests: %+v", recs)
			}
		})
	}
}
