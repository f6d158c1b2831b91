package csi

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// FuzzRequests feeds the request handlers arbitrary ids, paths, parameters,
// mount options and secrets. Whatever comes in, a handler must answer with
// a gRPC status (never panic, never a bare error), refuse paths outside the
// kubelet directory, never echo a secret, and what it mounts must go away
// again with the matching unpublish/unstage. Without -fuzz it runs the seed
// corpus as a normal test.
func FuzzRequests(f *testing.F) {
	kubelet := filepath.Join(f.TempDir(), "kubelet")
	fc := newFakeContainers()
	fm := newFakeMounter()
	fm.containers = fc
	d, err := New(Config{Endpoint: "unix://" + filepath.Join(f.TempDir(), "csi.sock"), Controller: true, Node: true, NodeID: "n",
		KubeletDir: kubelet, StateDir: f.TempDir(), CacheDir: f.TempDir(), Mounter: fm, Containers: fc, Logger: slog.New(slog.DiscardHandler)}) // f.Log may not be called from the target
	if err != nil {
		f.Fatal(err)
	}
	good := volumeID{Account: blobstore.AzuriteAccount, Container: "fuzz-data", Endpoint: "http://127.0.0.1:10000/devstoreaccount1"}
	if err := fc.Create(context.Background(), blobstore.AzureConfig{Account: good.Account, Container: good.Container, Endpoint: good.Endpoint, Key: fc.key}); err != nil {
		f.Fatal(err)
	}
	const key = "c2VjcmV0LWtleS1mb3ItZnV6emluZw=="
	fc.key = key
	stagingOK := filepath.Join(kubelet, "plugins/kubernetes.io/csi/d/h/globalmount")
	targetOK := filepath.Join(kubelet, "pods/u/volumes/kubernetes.io~csi/pv/mount")

	// op, volume id, path, key, value, mount flag, secret key, secret value
	f.Add(uint8(0), good.String(), stagingOK, "containerName", "fuzz-data", "ro", secretAccountKey, key)
	f.Add(uint8(1), good.String(), targetOK, "mountOptions", "uid=1000,umask=022", "", secretAccountKey, key)
	f.Add(uint8(2), "csi-1234", targetOK, keyEphemeral, "true", "block-cache-mb=16", secretAccountKey, key)
	f.Add(uint8(3), "blobfs1#UPPER#x", "../../etc", "protocol", "nfs", "cache-dir=/", "password", "hunter2")
	f.Add(uint8(4), good.String()+"##retain", "/etc/passwd", "storageAccount", "Bad_Acct", "-o allow_other", secretConnString, "UseDevelopmentStorage=true")
	f.Add(uint8(5), "blobfs1#a#b#c#d#e", kubelet+"/../x", "secretName", "s", "attr-timeout=-1s", secretSASToken, "?sv=1&sig=x")
	f.Add(uint8(6), "\x00", "relative/path", "csi.storage.k8s.io/pod.namespace", "ns", "umask=8888", "", "")
	f.Add(uint8(7), good.String(), stagingOK, "containerNamePrefix", "a--b", "fuse-readers=999", secretAccountName, "devstoreaccount1")
	// blob-csi-driver's handle, parameters, blobfuse options and secret keys.
	f.Add(uint8(0), "rg#devstoreaccount1#fuzz-data#uuid#ns", stagingOK, "skuName", "Premium_LRS", "-o allow_other --file-cache-timeout-in-seconds=120", "msisecret", "not-used")
	f.Add(uint8(4), "rg#devstoreaccount1#fuzz-data", stagingOK, "keyVaultURL", "https://kv.vault.azure.net/", "--use-adls=true", "azurestoragespnclientsecret", "s3cret-value")

	f.Fuzz(func(t *testing.T, op uint8, volID, path, k, v, flag, sk, sv string) {
		ctx := context.Background()
		vctx := map[string]string{}
		if k != "" {
			vctx[k] = v
		}
		secrets := map[string]string{secretAccountName: blobstore.AzuriteAccount}
		if sk != "" {
			secrets[sk] = sv
		}
		c := mountCap(rwx)
		if flag != "" {
			c = mountCap(rwx, flag)
		}
		var err error
		var undo func()
		switch op % 8 {
		case 0:
			_, err = d.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: volID, StagingTargetPath: path, VolumeCapability: c, VolumeContext: vctx, Secrets: secrets})
			undo = func() {
				if _, err := d.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: path}); err != nil {
					t.Fatalf("unstage after a successful stage: %v", err)
				}
			}
		case 1, 2:
			if op%8 == 2 {
				vctx[keyEphemeral] = "true"
				vctx[keyPodNamespace] = "ns"
			}
			_, err = d.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: volID, TargetPath: path, StagingTargetPath: stagingOK, VolumeCapability: c, VolumeContext: vctx, Secrets: secrets})
			undo = func() {
				if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: path}); err != nil {
					t.Fatalf("unpublish after a successful publish: %v", err)
				}
			}
		case 3:
			_, err = d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: volID, Parameters: vctx, Secrets: secrets, VolumeCapabilities: []*csipb.VolumeCapability{c}})
		case 4:
			_, err = d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: volID, Secrets: secrets})
			if err == nil {
				// keep the seed container for the other cases
				fc.Create(ctx, blobstore.AzureConfig{Account: good.Account, Container: good.Container, Endpoint: good.Endpoint, Key: key})
			}
		case 5:
			_, err = d.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: volID, VolumeCapabilities: []*csipb.VolumeCapability{c}, VolumeContext: vctx, Secrets: secrets})
		case 6:
			_, err = d.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: volID, VolumePath: path})
		case 7:
			_, err = d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: path})
		}
		if err != nil {
			st, ok := status.FromError(err)
			if !ok || st.Code() == codes.Unknown {
				t.Fatalf("op %d: not a gRPC status: %v", op%8, err)
			}
			public := strings.Join([]string{volID, path, k, v, flag, sk, d.kubeletDir}, "\n")
			if len(sv) >= 8 && !strings.EqualFold(sk, secretAccountName) && !strings.Contains(public, sv) && strings.Contains(st.Message(), sv) {
				t.Fatalf("op %d: error echoes a secret: %q", op%8, st.Message())
			}
			return
		}
		if op%8 <= 2 || op%8 == 7 {
			if _, perr := d.checkPath("path", path); perr != nil {
				t.Fatalf("op %d accepted a path outside the kubelet directory: %q", op%8, path)
			}
		}
		if undo != nil {
			undo()
		}
		if n := fm.count(); n != 0 {
			t.Fatalf("op %d: %d mounts left after undoing it", op%8, n)
		}
	})
}
