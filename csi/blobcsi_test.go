package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"
	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// blobCSICase is a StorageClass, a static PersistentVolume or an inline
// volume written for the Azure Blob CSI driver, from its documented
// parameters (docs/driver-parameters.md of kubernetes-sigs/blob-csi-driver
// and its deploy/example manifests), with the driver name changed to
// blobfs's, and what the table in docs/kubernetes.md says blobfs does
// with it.
type blobCSICase struct {
	name string
	kind string // "StorageClass", "PV" or "inline"

	params       map[string]string // StorageClass parameters
	handle       string            // PV volumeHandle
	attrs        map[string]string // PV or inline volumeAttributes
	mountOptions []string          // StorageClass or PV mountOptions
	// secrets are the provisioner and node-stage secrets (StorageClass,
	// PV: nodeStageSecretRef) or the node-publish secret (inline).
	secrets map[string]string
	group   string // the pod's fsGroup

	// Served: the container the volume is (for a PV or inline volume it
	// exists beforehand); optionally the endpoint (checked on the fake
	// backend, which does not reach it), where the credentials came
	// from, the group the mount's root shows, and that DeleteVolume
	// keeps the container (blobfs did not make it). endpoint "default" is
	// the account's public-cloud endpoint.
	container string
	endpoint  string
	source    string
	rootGroup string
	kept      bool

	// Refused: at which call, with what code and message.
	at   string
	code codes.Code
	msg  string

	// fakeOnly says why a case cannot run against Azurite (an endpoint
	// it does not serve, an Azure AD identity it does not have).
	fakeOnly string
}

// blobCSICorpus builds the cases for an Azurite account (or the fake's).
// sasToken is a SAS token for the container "sas-data".
func blobCSICorpus(az azurite, sasToken string) []blobCSICase {
	acct, ep := az.account, az.endpoint
	key := map[string]string{secretAccountName: acct, secretAccountKey: az.key}
	// blob-csi-driver's storageclass-blobfuse.yaml mountOptions.
	blobfuseOpts := []string{"-o allow_other", "--file-cache-timeout-in-seconds=120", "--use-attr-cache=true",
		"--cancel-list-on-mount-seconds=10", "-o attr_timeout=120", "-o entry_timeout=120", "-o negative_timeout=120",
		"--log-level=LOG_WARNING", "--cache-size-mb=1000"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := maps.Clone(m)
		if out == nil {
			out = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	const noIdentity = "uses the driver's Azure AD identity, which Azurite does not have"
	const notAzurite = "its endpoint is not Azurite's"
	existing := map[string]string{"storageAccount": acct, "server": ep}
	return []blobCSICase{
		// --- StorageClasses ----------------------------------------------
		{name: "storageclass-blobfuse.yaml: skuName, no account", kind: "StorageClass",
			params: map[string]string{"skuName": "Premium_LRS"}, mountOptions: blobfuseOpts,
			at: "CreateVolume", code: codes.InvalidArgument, msg: "skuName=Premium_LRS: blobfs does not create storage accounts"},
		{name: "account settings and no account", kind: "StorageClass",
			params: map[string]string{"resourceGroup": "rg", "location": "eastus", "storageAccountType": "Standard_LRS"},
			at:     "CreateVolume", code: codes.InvalidArgument, msg: "location=eastus, resourceGroup=rg, storageAccountType=Standard_LRS: blobfs does not create storage accounts"},
		{name: "no parameters", kind: "StorageClass",
			at: "CreateVolume", code: codes.InvalidArgument, msg: "no storage account: set parameter storageAccount"},
		{name: "existing account with every account setting, fuse2, blobfuse mount options", kind: "StorageClass",
			params: with(existing, "skuName", "Premium_LRS", "location", "eastus", "resourceGroup", "rg", "subscriptionID", "00000000-0000-0000-0000-000000000000",
				"protocol", "fuse2", "accessTier", "Hot", "allowBlobPublicAccess", "false", "allowSharedKeyAccess", "true",
				"requireInfraEncryption", "true", "publicNetworkAccess", "Enabled", "networkEndpointType", "privateEndpoint",
				"vnetResourceGroup", "vnet-rg", "vnetName", "vnet", "vnetLinkName", "link", "subnetName", "subnet",
				"tags", "team=a,env=prod", "matchTags", "true", "softDeleteBlobs", "7", "softDeleteContainers", "7",
				"enableBlobVersioning", "true", "isHnsEnabled", "false", "storeAccountKey", "true", "getLatestAccountKey", "true",
				"useDataPlaneAPI", "true", "mountPermissions", "0777", "containerNamePrefix", "team"),
			secrets: key, mountOptions: blobfuseOpts, container: "team-team-a-claim"},
		{name: "containerName templates", kind: "StorageClass",
			params: with(existing, "containerName", "${pvc.metadata.namespace}-${pvc.metadata.name}"), secrets: key, container: "team-a-claim"},
		{name: "storageEndpointSuffix", kind: "StorageClass",
			params:  map[string]string{"storageAccount": acct, "storageEndpointSuffix": "core.chinacloudapi.cn", "containerName": "sovereign"},
			secrets: key, container: "sovereign", endpoint: "https://" + acct + ".blob.core.chinacloudapi.cn/", fakeOnly: notAzurite},
		{name: "server wins over storageEndpointSuffix", kind: "StorageClass",
			params: with(existing, "storageEndpointSuffix", "core.windows.net", "containerName", "private-link"), secrets: key, container: "private-link"},
		{name: "secretName read by the driver", kind: "StorageClass",
			params:    with(existing, "secretName", "azure-secret", "secretNamespace", "default", "containerName", "from-secret"),
			container: "from-secret", source: "secret:default/azure-secret"},
		{name: "secretName alone: the PVC's namespace", kind: "StorageClass",
			params:    with(existing, "secretName", "azure-secret", "containerName", "pvc-namespace-secret"),
			container: "pvc-namespace-secret", source: "secret:team-a/azure-secret"},
		{name: "secretName of a Secret blob-csi-driver would have written", kind: "StorageClass",
			params: with(existing, "secretName", "not-there", "storeAccountKey", "true"),
			at:     "CreateVolume", code: codes.FailedPrecondition, msg: "does not create it (unlike blob-csi-driver's storeAccountKey)"},
		{name: "no secrets: the driver's identity", kind: "StorageClass",
			params: map[string]string{"storageAccount": acct, "containerName": "by-identity"}, container: "by-identity", source: "identity", fakeOnly: noIdentity},
		{name: "storageclass-blob-nfs.yaml: protocol nfs", kind: "StorageClass",
			params: map[string]string{"protocol": "nfs", "skuName": "Premium_LRS"},
			at:     "CreateVolume", code: codes.InvalidArgument, msg: "protocol=nfs: blobfs mounts containers with FUSE through the Blob API; NFSv3 is not supported"},
		{name: "protocol aznfs", kind: "StorageClass", params: with(existing, "protocol", "aznfs"),
			at: "CreateVolume", code: codes.InvalidArgument, msg: "protocol=aznfs: blobfs mounts containers with FUSE"},
		{name: "isHnsEnabled", kind: "StorageClass", params: with(existing, "isHnsEnabled", "true"),
			at: "CreateVolume", code: codes.InvalidArgument, msg: "isHnsEnabled=true: blobfs does not create Data Lake"},
		{name: "a misspelt parameter", kind: "StorageClass", params: with(existing, "contianerName", "x"),
			at: "CreateVolume", code: codes.InvalidArgument, msg: `unknown parameter "contianerName"; did you mean "containerName"? (known: storageAccount`},
		{name: "a bad value", kind: "StorageClass", params: with(existing, "softDeleteBlobs", "a week"),
			at: "CreateVolume", code: codes.InvalidArgument, msg: "softDeleteBlobs=a week: not a number of days"},
		{name: "use-adls mount option", kind: "StorageClass", params: existing, secrets: key, mountOptions: []string{"--use-adls=true"}, container: "team-a-claim",
			at: "NodeStageVolume", code: codes.InvalidArgument, msg: `mount option "--use-adls=true": blobfs does not create Data Lake`},
		{name: "fsGroup applied", kind: "StorageClass", params: with(existing, "containerName", "fsgroup-applied"), secrets: key,
			group: "2000", container: "fsgroup-applied", rootGroup: "2000"},
		{name: "fsGroupChangePolicy None", kind: "StorageClass", params: with(existing, "containerName", "fsgroup-none", "fsGroupChangePolicy", "None"),
			secrets: key, group: "2000", container: "fsgroup-none", rootGroup: "0"},

		// --- static PersistentVolumes -------------------------------------
		{name: "pv-blobfuse-csi.yaml: own handle, volumeAttributes, nodeStageSecretRef", kind: "PV",
			handle: acct + "_static-data", attrs: map[string]string{"resourceGroup": "rg", "storageAccount": acct, "containerName": "static-data", "server": ep},
			secrets: key, mountOptions: []string{"-o allow_other", "--file-cache-timeout-in-seconds=120"}, container: "static-data", source: "request"},
		{name: "handle RG#ACCOUNT#CONTAINER", kind: "PV", handle: "rg#" + acct + "#by-handle", attrs: map[string]string{"server": ep},
			secrets: key, container: "by-handle"},
		{name: "handle RG#ACCOUNT#CONTAINER at the public endpoint", kind: "PV", handle: "rg#" + acct + "#public", secrets: key,
			container: "public", endpoint: "default", fakeOnly: notAzurite},
		{name: "a PV blob-csi-driver provisioned: its Secret, its attributes", kind: "PV",
			handle: "mc_rg#" + acct + "#pvc-7f3a#3c4c2f44-0ad2-4b3b-9e1f-7d1e7b2d6a11#team-a",
			attrs: map[string]string{"skuName": "Premium_LRS", "containerName": "pvc-7f3a", "secretnamespace": "team-a", "server": ep,
				keyPVCName: "claim", keyPVCNamespace: "team-a", keyPVName: "pvc-7f3a",
				"storage.kubernetes.io/csiProvisionerIdentity": "1767225600000-8081-blob.csi.azure.com"},
			container: "pvc-7f3a", source: "secret:team-a/" + blobCSISecretName(acct)},
		{name: "a PV blob-csi-driver provisioned, reclaim Delete", kind: "PV",
			handle: "mc_rg#" + acct + "#pvc-0d1e#0b8f2b0e-9f5e-4d7e-a0a4-5c5f1b0c9d21#team-b", container: "pvc-0d1e", source: "identity", kept: true,
			fakeOnly: noIdentity},
		{name: "SAS token secret", kind: "PV", handle: "sas-handle", attrs: map[string]string{"storageAccount": acct, "containerName": "sas-data", "server": ep},
			secrets: map[string]string{secretAccountName: acct, secretSASToken: sasToken}, container: "sas-data"},
		{name: "fuse2, getLatestAccountKey, mountPermissions, mountWithWorkloadIdentityToken false", kind: "PV", handle: "fuse2-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "fuse2-data", "server": ep, "protocol": "fuse2",
				"getLatestAccountKey": "true", "mountPermissions": "0750", "mountWithWorkloadIdentityToken": "false", "subscriptionID": "sub"},
			secrets: key, container: "fuse2-data"},
		{name: "pv-blobfuse-auth.yaml: MSI with msisecret", kind: "PV", handle: "msi-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "msi-data", "AzureStorageAuthType": "MSI",
				"AzureStorageIdentityClientID": "11111111-2222-3333-4444-555555555555"},
			secrets: map[string]string{"msisecret": "not-used"}, container: "msi-data", fakeOnly: noIdentity},
		{name: "pv-blobfuse-auth.yaml: SPN", kind: "PV", handle: "spn-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "spn-data", "AzureStorageAuthType": "SPN",
				"AzureStorageSPNClientID": "11111111-2222-3333-4444-555555555555", "AzureStorageSPNTenantID": "tenant"},
			secrets: map[string]string{"azurestoragespnclientsecret": "s3cret"},
			at:      "NodeStageVolume", code: codes.InvalidArgument, msg: "AzureStorageSPNClientID=11111111-2222-3333-4444-555555555555: blobfs does not sign in as a service principal"},
		{name: "SPN client secret in the Secret", kind: "PV", handle: "spn-secret-handle",
			attrs:   map[string]string{"storageAccount": acct, "containerName": "spn-data", "server": ep},
			secrets: map[string]string{"azurestoragespnclientsecret": "s3cret"},
			at:      "NodeStageVolume", code: codes.InvalidArgument, msg: "key azurestoragespnclientsecret is refused: blobfs does not sign in as a service principal"},
		{name: "pv-blobfuse-csi-keyvault.yaml: the account key in Key Vault", kind: "PV", handle: "kv-handle",
			attrs:     map[string]string{"storageAccount": acct, "containerName": "kv-data", "server": ep, "keyVaultURL": "https://kv.vault.azure.net/", "keyVaultSecretName": "key"},
			container: "kv-data", source: "keyvault:https://kv.vault.azure.net/#key#"},
		{name: "a Key Vault secret that does not exist", kind: "PV", handle: "kv-missing-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "kv-data", "server": ep, "keyVaultURL": "https://kv.vault.azure.net/", "keyVaultSecretName": "gone"},
			at:    "NodeStageVolume", code: codes.FailedPrecondition, msg: "read secret gone of Key Vault https://kv.vault.azure.net/"},
		{name: "a Key Vault URL that is not a vault's", kind: "PV", handle: "kv-bad-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "kv-data", "keyVaultURL": "http://169.254.169.254/metadata", "keyVaultSecretName": "key"},
			at:    "NodeStageVolume", code: codes.InvalidArgument, msg: "keyVaultURL"},
		{name: "pv-blobfuse-nfs.yaml", kind: "PV", handle: "rg#" + acct + "#nfs-data",
			attrs: map[string]string{"resourceGroup": "rg", "storageAccount": acct, "containerName": "nfs-data", "protocol": "nfs"},
			at:    "NodeStageVolume", code: codes.InvalidArgument, msg: "protocol=nfs: blobfs mounts containers with FUSE"},
		{name: "workload identity clientID", kind: "PV", handle: "wi-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "wi-data", "clientID": "11111111-2222-3333-4444-555555555555", "tenantID": "t"},
			at:    "NodeStageVolume", code: codes.InvalidArgument, msg: "clientID=11111111-2222-3333-4444-555555555555: blobfs does not mount with the pod's service account token"},
		{name: "identity by resource id", kind: "PV", handle: "rid-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "rid-data", "AzureStorageIdentityResourceID": "/subscriptions/s/id"},
			at:    "NodeStageVolume", code: codes.InvalidArgument, msg: "use AzureStorageIdentityClientID"},
		{name: "MSIEndpoint", kind: "PV", handle: "msiep-handle",
			attrs: map[string]string{"storageAccount": acct, "containerName": "msi-data", "MSIEndpoint": "http://169.254.169.254/x"},
			at:    "NodeStageVolume", code: codes.InvalidArgument, msg: "MSIEndpoint=http://169.254.169.254/x: blobfs gets managed identity tokens from the node's own identity endpoint"},
		{name: "a handle that names no valid account", kind: "PV", handle: "rg#Not_An_Account#data", secrets: key,
			at: "NodeStageVolume", code: codes.InvalidArgument, msg: "volume_id: malformed volume id"},

		// --- inline volumes -----------------------------------------------
		{name: "nginx-blobfuse-inline-volume.yaml", kind: "inline",
			attrs:     map[string]string{"containerName": "inline-data", "secretName": "azure-secret", "server": ep, "mountOptions": "-o allow_other --file-cache-timeout-in-seconds=120"},
			container: "inline-data", source: "secret:team-a/azure-secret"},
		{name: "inline with a nodePublishSecretRef", kind: "inline",
			attrs: map[string]string{"storageAccount": acct, "containerName": "inline-data", "server": ep, "protocol": "fuse"}, secrets: key, container: "inline-data"},
		{name: "inline MSI: no identity for inline volumes", kind: "inline",
			attrs:   map[string]string{"storageAccount": acct, "containerName": "inline-data", "server": ep, "AzureStorageAuthType": "MSI"},
			secrets: map[string]string{"msisecret": "x", secretAccountName: acct},
			at:      "NodePublishVolume", code: codes.InvalidArgument, msg: "the driver's own Azure AD identity is not lent to inline volumes"},
		{name: "inline nfs", kind: "inline", attrs: map[string]string{"containerName": "inline-data", "secretName": "azure-secret", "protocol": "nfs"},
			at: "NodePublishVolume", code: codes.InvalidArgument, msg: "protocol=nfs"},
	}
}

// TestBlobCSICorpus feeds the controller and the node blob-csi-driver
// StorageClasses, static PVs and inline volumes (blobCSICorpus) the way
// the external-provisioner and kubelet pass them: each is served (the
// container created or found, mounted, a file written through the mount
// and found in that container) or refused with the message the table in
// docs/kubernetes.md promises, at the call that should refuse it, leaving
// nothing mounted.
func TestBlobCSICorpus(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			secrets := fakeSecrets{}
			vault := fakeKeyVault{}
			d, az := b.start(t, driverOptions{secrets: secrets, keyVault: vault})
			ctx := context.Background()
			fc, fake := d.containers.(*fakeContainers)
			sasToken := "sv=2025-01-05&sr=c&sp=racwdl&sig=ZmFrZQ%3D%3D"
			if fake {
				fc.mu.Lock()
				fc.sas, fc.identity = sasToken, true
				fc.mu.Unlock()
			} else {
				sasToken = containerSAS(t, az, "sas-data")
			}
			key := map[string]string{secretAccountName: az.account, secretAccountKey: az.key}
			secrets["default/azure-secret"] = key
			secrets["team-a/azure-secret"] = key
			secrets["team-a/"+blobCSISecretName(az.account)] = key
			vault["https://kv.vault.azure.net/#key#"] = az.key
			for i, c := range blobCSICorpus(az, sasToken) {
				t.Run(c.kind+"/"+c.name, func(t *testing.T) {
					if c.fakeOnly != "" && !fake {
						t.Skip(c.fakeOnly)
					}
					runBlobCSICase(t, ctx, d, az, c, i)
				})
			}
			if left := mountsUnder(d.kubelet); len(left) > 0 {
				t.Errorf("left mounted: %v", left)
			}
		})
	}
}

func runBlobCSICase(t *testing.T, ctx context.Context, d *testDriver, az azurite, c blobCSICase, n int) {
	adminCfg := func(name string) blobstore.AzureConfig {
		return blobstore.AzureConfig{Account: az.account, Endpoint: az.endpoint, Key: az.key, Container: name}
	}
	// refused reports whether err is the refusal the case expects at
	// call; any other outcome there fails the test.
	refused := func(call string, err error) bool {
		t.Helper()
		st := status.Convert(err)
		switch {
		case err == nil && c.at == call:
			t.Fatalf("%s succeeded; want %v with %q", call, c.code, c.msg)
		case err == nil:
			return false
		case c.at != call:
			t.Fatalf("%s: %v %q; want it served", call, st.Code(), st.Message())
		case st.Code() != c.code || !strings.Contains(st.Message(), c.msg):
			t.Fatalf("%s: %v %q; want %v with %q", call, st.Code(), st.Message(), c.code, c.msg)
		}
		if strings.Contains(st.Message(), az.key) {
			t.Fatalf("%s: the message holds the account key", call)
		}
		if left := mountsUnder(d.kubelet); len(left) > 0 {
			t.Fatalf("%s refused, but left mounts: %v", call, left)
		}
		return true
	}
	if c.kind != "StorageClass" && c.container != "" {
		// The container of a static or inline volume exists.
		if err := d.containers.Create(ctx, adminCfg(c.container)); err != nil {
			t.Fatal(err)
		}
	}
	capability := mountCap(rwx, c.mountOptions...)
	if c.group != "" {
		capability.GetMount().VolumeMountGroup = c.group
	}
	pv := fmt.Sprintf("pv-%d", n)
	target := filepath.Join(d.kubelet, "pods", fmt.Sprintf("pod-%d", n), "volumes/kubernetes.io~csi", pv, "mount")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	handle, volCtx, mountPath := c.handle, c.attrs, target

	switch c.kind {
	case "StorageClass":
		// With --extra-create-metadata, as deploy/ runs the provisioner.
		params := maps.Clone(c.params)
		if params == nil {
			params = map[string]string{}
		}
		params[keyPVCName], params[keyPVCNamespace], params[keyPVName] = "claim", "team-a", pv
		vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: pv, Parameters: params, Secrets: c.secrets,
			VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
		if refused("CreateVolume", err) {
			return
		}
		handle, volCtx = vol.GetVolume().GetVolumeId(), vol.GetVolume().GetVolumeContext()
		t.Cleanup(func() { // as an administrator, whatever the case's credentials
			if _, err := d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: handle, Secrets: az.secrets()}); err != nil {
				t.Errorf("DeleteVolume: %v", err)
			}
		})
		if id, err := parseVolumeID(handle); err != nil || id.Container != c.container {
			t.Fatalf("volume id %q: %+v, %v; want container %q", handle, id, err, c.container)
		}
		fallthrough
	case "PV":
		sum := sha256.Sum256([]byte(handle))
		staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", hex.EncodeToString(sum[:]), "globalmount")
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		_, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: staging,
			VolumeCapability: capability, VolumeContext: volCtx, Secrets: c.secrets})
		if refused("NodeStageVolume", err) {
			return
		}
		t.Cleanup(func() {
			if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: staging}); err != nil {
				t.Errorf("NodeUnstageVolume: %v", err)
			}
		})
		_, err = d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: handle, StagingTargetPath: staging, TargetPath: target,
			VolumeCapability: capability, VolumeContext: volCtx})
		if refused("NodePublishVolume", err) {
			return
		}
		mountPath = staging
	case "inline":
		handle = fmt.Sprintf("csi-%064x", n)
		volCtx = maps.Clone(c.attrs)
		volCtx[keyEphemeral], volCtx[keyPodNamespace] = "true", "team-a"
		_, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: handle, TargetPath: target,
			VolumeCapability: capability, VolumeContext: volCtx, Secrets: c.secrets})
		if refused("NodePublishVolume", err) {
			return
		}
	}
	t.Cleanup(func() {
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
			t.Errorf("NodeUnpublishVolume: %v", err)
		}
	})
	if c.at != "" {
		t.Fatalf("served; want %v at %s with %q", c.code, c.at, c.msg)
	}

	rec, ok := d.state.Get(handle)
	if !ok || rec.Container != c.container || rec.Account != az.account {
		t.Fatalf("node state %+v; want container %q of %s", rec, c.container, az.account)
	}
	if c.source != "" && rec.CredentialSource != c.source {
		t.Errorf("credentials from %q; want %q", rec.CredentialSource, c.source)
	}
	if fm, ok := d.mounter.(*fakeMounter); ok {
		fm.mu.Lock()
		spec := fm.specs[mountPath]
		fm.mu.Unlock()
		wantEndpoint := c.endpoint
		if wantEndpoint == "default" {
			wantEndpoint = ""
		}
		if spec.Azure.Container != c.container || c.endpoint != "" && spec.Azure.Endpoint != wantEndpoint {
			t.Errorf("mounted %s at %q; want %s at %q", spec.Azure.Container, spec.Azure.Endpoint, c.container, c.endpoint)
		}
		if c.rootGroup != "" && fmt.Sprint(spec.FS.GID) != c.rootGroup {
			t.Errorf("mounted for group %d; want %s", spec.FS.GID, c.rootGroup)
		}
	} else {
		// A file written through the pod's mount is in the container.
		data := []byte("written through a blob-csi-driver volume: " + c.name)
		if err := os.WriteFile(filepath.Join(target, "blobcsi-corpus.txt"), data, 0o644); err != nil {
			t.Fatalf("write through the mount: %v", err)
		}
		store, err := blobstore.NewAzure(adminCfg(c.container))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(data)+1)
		n, err := store.ReadAt(ctx, "blobcsi-corpus.txt", buf, 0, "")
		if (err != nil && !errors.Is(err, io.EOF)) || string(buf[:n]) != string(data) {
			t.Errorf("container %s holds %q, %v; want %q", c.container, buf[:n], err, data)
		}
		if c.rootGroup != "" {
			fi, err := os.Stat(target)
			if err != nil || fmt.Sprint(fi.Sys().(*syscall.Stat_t).Gid) != c.rootGroup {
				t.Errorf("mount root: %v, %v; want group %s", fi, err, c.rootGroup)
			}
		}
	}
	if c.kept {
		for _, call := range []func() error{
			func() error {
				_, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target})
				return err
			},
			func() error {
				_, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: handle, StagingTargetPath: mountPath})
				return err
			},
			func() error {
				_, err := d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: handle, Secrets: c.secrets})
				return err
			},
		} {
			if err := call(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.containers.Check(ctx, adminCfg(c.container)); err != nil {
			t.Errorf("container after DeleteVolume of its blob-csi-driver handle: %v; want it kept", err)
		}
	}
}

// containerSAS signs a SAS token for one container of Azurite's account.
func containerSAS(t *testing.T, az azurite, name string) string {
	t.Helper()
	cred, err := container.NewSharedKeyCredential(az.account, az.key)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sas.BlobSignatureValues{
		Protocol:      sas.ProtocolHTTPSandHTTP,
		StartTime:     time.Now().Add(-time.Hour),
		ExpiryTime:    time.Now().Add(time.Hour),
		Permissions:   (&sas.ContainerPermissions{Read: true, Add: true, Create: true, Write: true, Delete: true, List: true}).String(),
		ContainerName: name,
	}.SignWithSharedKey(cred)
	if err != nil {
		t.Fatal(err)
	}
	return q.Encode()
}

// TestBlobCSITableInDocs: the table of blob-csi-driver's names in
// docs/kubernetes.md ("Moving over from blob-csi-driver") lists every one
// the driver knows, and nothing it does not.
func TestBlobCSITableInDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Moving over from blob-csi-driver\n")
	if !ok {
		t.Fatal(`docs/kubernetes.md has no "## Moving over from blob-csi-driver"`)
	}
	section, _, _ = strings.Cut(section, "\n#")
	listed := map[string]bool{}
	span := regexp.MustCompile("`([^`]+)`")
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "|---") {
			continue
		}
		rows++
		first := strings.Split(line, "|")[1]
		for _, m := range span.FindAllStringSubmatch(first, -1) {
			name, _, _ := strings.Cut(m[1], ":")
			listed[strings.ToLower(strings.TrimSpace(name))] = true
		}
	}
	if rows < 10 {
		t.Fatalf("found %d table rows: the parser is broken", rows)
	}
	// blobfs's own parameters that blob-csi-driver has too.
	shared := []string{"storageAccount", "containerName", "containerNamePrefix", "server", "storageEndpointSuffix", "protocol",
		"secretName", "secretNamespace", "mountOptions", "AzureStorageAuthType", "AzureStorageIdentityClientID", "fsGroupChangePolicy",
		"keyVaultURL", "keyVaultSecretName", "keyVaultSecretVersion"}
	want := append(append(shared, compatParamNames()...), secretAccountName, secretAccountKey, secretSASToken, secretMSI)
	for k := range refusedSecretKeys {
		want = append(want, k)
	}
	known := map[string]bool{}
	for _, n := range want {
		known[strings.ToLower(n)] = true
		if !listed[strings.ToLower(n)] {
			t.Errorf("docs/kubernetes.md's blob-csi-driver table does not list %s", n)
		}
	}
	for n := range listed {
		if !known[n] && !strings.Contains(n, "#") {
			t.Errorf("docs/kubernetes.md's blob-csi-driver table lists %q, which the driver does not know", n)
		}
	}
}

// TestBlobCSIHandles parses blob-csi-driver's volume handle formats.
func TestBlobCSIHandles(t *testing.T) {
	for handle, want := range map[string]blobCSIHandle{
		"rg#acct#data":                     {ResourceGroup: "rg", Account: "acct", Container: "data"},
		"#acct#data":                       {Account: "acct", Container: "data"},
		"rg#acct#pvc-1#uuid#team-a":        {ResourceGroup: "rg", Account: "acct", Container: "pvc-1", SecretNamespace: "team-a"},
		"rg#acct#pvc-1#uuid#team-a#sub-id": {ResourceGroup: "rg", Account: "acct", Container: "pvc-1", SecretNamespace: "team-a", SubscriptionID: "sub-id"},
	} {
		if got, err := parseBlobCSIHandle(handle); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", handle, got, err, want)
		}
	}
	for _, bad := range []string{"acct_data", "rg#acct", "rg#ACCT#data", "rg#acct#Bad--Name", "a#b#c#d#e#f#g"} {
		if _, err := parseBlobCSIHandle(bad); !errors.Is(err, errMalformedID) {
			t.Errorf("%s: %v; want a malformed id", bad, err)
		}
	}
	// A handle that is neither blobfs's nor blob-csi-driver's is no
	// volume to delete (success, nothing deleted).
	if _, err := idOfHandle("pvc-1234", volumeParams{}); err == nil {
		t.Error("idOfHandle accepted a handle of no known format")
	}
	if id, err := idOfHandle("rg#acct#data", volumeParams{EndpointSuffix: "core.chinacloudapi.cn"}); err != nil || id.Endpoint != "https://acct.blob.core.chinacloudapi.cn/" {
		t.Errorf("idOfHandle with an endpoint suffix: %+v, %v", id, err)
	}
}

// TestBlobfuseMountOptions: the blobfuse options of blob-csi-driver's
// examples apply or change nothing, and one blobfs cannot honour is
// refused.
func TestBlobfuseMountOptions(t *testing.T) {
	s, err := parseMountOptions([]string{"-o allow_other --file-cache-timeout-in-seconds=120", "-o attr_timeout=120,entry_timeout=30",
		"--use-attr-cache=true", "--log-level=LOG_WARNING", "--tmp-path=/mnt/blobfusetmp", "--virtual-directory=true", "-o gid=1000"}, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Mount.AllowOther || s.FS.AttrTimeout != 120*time.Second || s.FS.EntryTimeout != 30*time.Second || s.FS.GID != 1000 {
		t.Errorf("settings %+v", s)
	}
	if got := strings.Join(s.Options, ","); got != "allow-other=true,attr-timeout=120,entry-timeout=30,gid=1000" {
		t.Errorf("recorded options %q", got)
	}
	again, err := parseMountOptions(s.Options, "recorded")
	if err != nil || again.FS.AttrTimeout != s.FS.AttrTimeout {
		t.Errorf("recorded options do not parse back: %v", err)
	}
	for _, bad := range []string{"--use-adls=true", "--virtual-directory=false", "--file-cache-timeout-in-seconds=soon", "--streaming"} {
		if _, err := parseMountOptions([]string{bad}, "f"); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
