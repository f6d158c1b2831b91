package csi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// Request parsing. A node RPC first turns its request into one checked
// value (parseStage, parsePublish, parseUnmount), then acts on that value
// alone (node.go): what the request itself gets wrong is refused here
// (InvalidArgument naming the field), before the volume is locked; what
// is found on the node (a symlink on a path, a dead mount) is the act's
// to find. Parsing takes no lock and touches no path below the kubelet
// directory, so that a refused request changes nothing there; resolving
// a volume may read a Secret through the API (which credentials a
// request means is part of what it asks).

// stageRequest is a NodeStageVolume request, checked and resolved: the
// volume (container, credentials and where they came from, mount
// settings, fsGroup) and the staging path. The path is checked here, not
// opened: opening it creates its missing parents, which a request refused
// under the lock (busy, staged at another path) must not do.
type stageRequest struct {
	nodeVolume
	staging string // checked to lie in the kubelet directory
}

// parseStage checks a NodeStageVolume request and resolves its volume, in
// the order its errors are reported.
func (d *Driver) parseStage(ctx context.Context, req *csipb.NodeStageVolumeRequest) (stageRequest, error) {
	var r stageRequest
	if req.GetVolumeId() == "" {
		return r, invalid("volume_id is missing")
	}
	var err error
	if r.staging, err = d.checkPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return r, invalid("%v", err)
	}
	if req.GetVolumeCapability() == nil {
		return r, invalid("volume_capability is missing")
	}
	if r.nodeVolume, err = d.resolveVolume(ctx, req.GetVolumeId(), req.GetVolumeContext(), req.GetSecrets(), req.GetVolumeCapability(), false); err != nil {
		return r, err
	}
	if r.params.Ephemeral {
		return r, invalid("volume_context: inline ephemeral volumes are not staged")
	}
	return r, nil
}

// nodeVolume is the volume a stage or an inline publish mounts, resolved
// from its request.
type nodeVolume struct {
	volumeID string
	id       volumeID
	params   volumeParams
	creds    credentials
	source   string // credentials' source, for the node state
	cfg      blobstore.AzureConfig
	settings mountSettings
	readOnly bool
	// mountGroup is the pod's fsGroup (volume_mount_group), decimal;
	// empty: none, or ignored because the mount options set the owner.
	mountGroup string
}

// resolveVolume validates what a stage or an ephemeral publish needs and
// works out the container and credentials. The volume id names the
// container when it is blobfs's. Any other id is taken as the Azure Blob
// CSI driver takes it: volume_context containerName, storageAccount (or
// the secret's account) and server say which container, and a handle in
// its RG#ACCOUNT#CONTAINER#... format names what they leave out
// (blobcsi.go). Inline volumes are named by volume_context alone.
func (d *Driver) resolveVolume(ctx context.Context, volID string, volCtx, secrets map[string]string, c *csipb.VolumeCapability, readOnly bool) (nodeVolume, error) {
	v := nodeVolume{volumeID: volID}
	p, err := parseParams(volCtx, "volume_context")
	if err != nil {
		return v, invalid("%v", err)
	}
	ro, flags, err := checkCapability("volume_capability", c)
	if err != nil {
		return v, err
	}
	v.settings, err = parseMountOptions(append(append([]string{}, flags...), p.MountOptions...), "volume_capability.mount.mount_flags or volume_context[mountOptions]")
	if err != nil {
		return v, invalid("%v", err)
	}
	v.readOnly = readOnly || ro || v.settings.FS.ReadOnly
	if v.mountGroup, err = mountGroupOf("volume_capability", c); err != nil {
		return v, err
	}
	if v.mountGroup != "" && p.NoFSGroup {
		d.log.Info("volume_mount_group (the pod's fsGroup) is not applied: fsGroupChangePolicy is None", "volume", volID, "group", v.mountGroup)
		v.mountGroup = ""
	}
	if v.mountGroup != "" && v.settings.FS.ForceOwner {
		d.log.Info("volume_mount_group (the pod's fsGroup) is not applied: the volume's mount options set the owner", "volume", volID, "group", v.mountGroup)
		v.mountGroup = ""
	}

	id, idErr := parseVolumeID(volID)
	// foreign: a persistent volume whose id is not blobfs's. h is its
	// handle when that is in blob-csi-driver's format (hErr nil).
	foreign := idErr != nil && !p.Ephemeral
	var h blobCSIHandle
	hErr := idErr
	if foreign && !strings.HasPrefix(volID, volumeIDPrefix+"#") {
		h, hErr = parseBlobCSIHandle(volID)
	}
	if foreign && hErr != nil && p.ContainerName == "" {
		return v, invalid("volume_id: %v", hErr)
	}
	secretNS := p.secretNamespaceFor(h.SecretNamespace)
	if !p.Ephemeral && p.SecretName != "" {
		p.SecretNamespace = secretNS
	}
	v.params = p

	podNS := ""
	if p.Ephemeral {
		podNS = p.PodNamespace
	}
	v.creds, v.source, err = d.credentialsFor(ctx, secrets, p, "secrets", podNS)
	if err != nil {
		return v, err
	}
	if foreign && v.source == "identity" && !azureADAuthType(p.AuthType) {
		account := p.StorageAccount
		if account == "" {
			account = h.Account
		}
		if v.creds, v.source, err = d.blobCSISecret(ctx, account, secretNS); err != nil {
			return v, err
		}
	}
	switch {
	case !foreign && !p.Ephemeral:
		if p.ContainerName != "" && p.ContainerName != id.Container || p.StorageAccount != "" && p.StorageAccount != id.Account {
			return v, invalid("volume_context: containerName/storageAccount %q/%q contradict the volume id's %q/%q", p.ContainerName, p.StorageAccount, id.Container, id.Account)
		}
	case p.Ephemeral && p.ContainerName == "":
		return v, invalid("volume_context: an inline volume needs containerName (and storageAccount or a secret naming the account)")
	default:
		// volume_context first, then the handle, as blob-csi-driver.
		q := p
		if q.ContainerName == "" {
			q.ContainerName = h.Container
		}
		if q.StorageAccount == "" && v.creds.Account == "" {
			q.StorageAccount = h.Account
		}
		account, endpoint, err := q.target(v.creds)
		if err != nil {
			return v, invalid("volume_context: %v", err)
		}
		id = volumeID{Account: account, Container: q.ContainerName, Endpoint: endpoint}
		if err := id.check(); err != nil {
			return v, invalid("volume_context: %v", err)
		}
	}
	if p.Ephemeral && (azureADAuthType(p.AuthType) || p.AuthType == "" && v.creds.empty()) {
		// A Secret with only an account name (or msisecret), or an
		// Azure AD auth type, would borrow the driver's identity.
		return v, invalid("credentials: an inline volume needs an account key, SAS token or connection string in its Secret; the driver's own Azure AD identity is not lent to inline volumes")
	}
	v.id = id
	v.cfg, err = azureConfig(id, v.creds, p)
	if err != nil {
		return v, invalid("credentials: %v", err)
	}
	return v, nil
}

// checkCapability accepts mount access of any access mode (a container
// can be shared by any number of readers and writers) with no file system
// type or blobfs's own. It returns whether the mode is read-only and the
// mount flags.
func checkCapability(field string, c *csipb.VolumeCapability) (readOnly bool, flags []string, err error) {
	if c == nil {
		return false, nil, invalid("%s is missing", field)
	}
	if c.GetBlock() != nil {
		return false, nil, invalid("%s: block access is not supported; blobfs volumes are filesystems (use access_type mount)", field)
	}
	m := c.GetMount()
	if m == nil {
		return false, nil, invalid("%s.access_type is missing (use mount)", field)
	}
	switch strings.ToLower(m.GetFsType()) {
	case "", "fuse", "blobfs", "fuse.blobfs":
	default:
		return false, nil, invalid("%s.mount.fs_type %q is not supported: leave it empty (or blobfs)", field, clip(m.GetFsType(), 40))
	}
	switch mode := c.GetAccessMode().GetMode(); mode {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		readOnly = true
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	default:
		return false, nil, invalid("%s.access_mode is missing or unknown (%v)", field, mode)
	}
	return readOnly, m.GetMountFlags(), nil
}

// credentialsFor picks a request's credentials: the request's secrets;
// else the Secret named by secretName/secretNamespace; else none, which
// means the driver's Azure AD identity (workload or managed identity).
// Inline volumes (podNamespace set) may only name Secrets in their pod's
// namespace and never borrow the driver's identity: any pod can declare
// one. It returns the credentials and where they came from (the node
// state records that, not the secrets).
func (d *Driver) credentialsFor(ctx context.Context, secrets map[string]string, p volumeParams, field, podNamespace string) (credentials, string, error) {
	if len(secrets) > 0 {
		c, err := parseSecrets(secrets, field)
		if err != nil {
			return c, "", invalid("%v", err)
		}
		return c, "request", nil
	}
	inline := podNamespace != "" || p.Ephemeral
	if p.KeyVaultURL != "" {
		switch {
		case inline:
			return credentials{}, "", invalid("volume_context[keyVaultURL]: an inline volume may not read its credentials from Key Vault: the driver's own identity is not lent to inline volumes; use a nodePublishSecretRef or secretName")
		case p.SecretName != "":
			return credentials{}, "", invalid("give secretName or keyVaultURL, not both: both would say where the volume's credentials are")
		}
		c, err := d.keyVaultCreds(ctx, p.KeyVaultURL, p.KeyVaultSecretName, p.KeyVaultSecretVersion)
		return c, keyVaultSource(p), err
	}
	if p.SecretName != "" {
		ns := p.SecretNamespace
		if inline {
			if podNamespace == "" {
				return credentials{}, "", invalid("volume_context: an inline volume with secretName needs the pod's namespace (CSIDriver podInfoOnMount: true)")
			}
			if ns != "" && ns != podNamespace {
				return credentials{}, "", status.Errorf(codes.PermissionDenied, "volume_context[secretNamespace]: an inline volume may only use Secrets of its pod's namespace %q, not %q", podNamespace, ns)
			}
			ns = podNamespace
		}
		if d.secrets == nil {
			return credentials{}, "", status.Errorf(codes.FailedPrecondition, "secretName %s/%s: the driver has no access to the Kubernetes API (not running in a pod); pass the secret through the provisioner or node-stage secret instead", ns, p.SecretName)
		}
		data, err := d.secrets.GetSecret(ctx, ns, p.SecretName)
		if errors.Is(err, ErrSecretNotFound) {
			// blob-csi-driver writes the account key into secretName
			// (storeAccountKey); blobfs has no key to write.
			return credentials{}, "", status.Errorf(codes.FailedPrecondition, "secretName %s/%s: the Secret does not exist; blobfs reads credentials from it and does not create it (unlike blob-csi-driver's storeAccountKey): create it with %s and a key or SAS token", ns, p.SecretName, secretAccountName)
		}
		if err != nil {
			return credentials{}, "", storeError("read secret", err)
		}
		c, err := parseSecrets(data, fmt.Sprintf("secret %s/%s", ns, p.SecretName))
		if err != nil {
			return c, "", invalid("%v", err)
		}
		return c, "secret:" + ns + "/" + p.SecretName, nil
	}
	if inline {
		return credentials{}, "", invalid("an inline volume needs credentials: a nodePublishSecretRef or volumeAttributes secretName (in the pod's namespace); the driver's own identity is not lent to inline volumes")
	}
	return credentials{}, "identity", nil
}

// azureADAuthType: the volume asks for Azure AD (the driver's identity),
// not a key.
func azureADAuthType(t string) bool {
	switch t {
	case "msi", "workloadidentity", "spn", blobstore.AzureAuthAzureAD:
		return true
	}
	return false
}

// blobCSISecret reads the Secret blob-csi-driver keeps an account's key in
// (blobCSISecretName), for a volume with a handle of its making that came
// with no credentials. When it does not exist, or the driver has no
// Kubernetes API to ask (it runs outside a cluster), the driver's identity
// is used, as blob-csi-driver then uses its cluster identity; any other
// failure to read it is Unavailable (kubelet retries). It returns the
// credentials and where they came from.
func (d *Driver) blobCSISecret(ctx context.Context, account, ns string) (credentials, string, error) {
	if d.secrets == nil || account == "" {
		return credentials{}, "identity", nil
	}
	name := blobCSISecretName(account)
	data, err := d.secrets.GetSecret(ctx, ns, name)
	switch {
	case errors.Is(err, ErrSecretNotFound):
		return credentials{}, "identity", nil
	case err != nil:
		return credentials{}, "", status.Errorf(codes.Unavailable, "read blob-csi-driver's account key Secret %s/%s: %v", ns, name, err)
	}
	c, err := parseSecrets(data, fmt.Sprintf("secret %s/%s", ns, name))
	if err != nil {
		return c, "", invalid("%v", err)
	}
	d.log.Info("credentials from blob-csi-driver's account key Secret", "secret", ns+"/"+name)
	return c, "secret:" + ns + "/" + name, nil
}

// publishRequest is a NodePublishVolume request, checked: what the rest
// of the call acts on.
type publishRequest struct {
	id       string
	target   string // checked to lie in the kubelet directory
	staging  string // "" for an inline volume
	readOnly bool   // the capability's or the request's
	group    string // the fsGroup to mount for ("" none)
	params   volumeParams
}

// parsePublish checks a NodePublishVolume request, in the order its errors
// are reported. An inline volume has no staging path to check.
func (d *Driver) parsePublish(req *csipb.NodePublishVolumeRequest) (publishRequest, error) {
	r := publishRequest{id: req.GetVolumeId()}
	if r.id == "" {
		return r, invalid("volume_id is missing")
	}
	var err error
	if r.target, err = d.checkPath("target_path", req.GetTargetPath()); err != nil {
		return r, invalid("%v", err)
	}
	if r.readOnly, _, err = checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
		return r, err
	}
	r.readOnly = r.readOnly || req.GetReadonly()
	if r.group, err = mountGroupOf("volume_capability", req.GetVolumeCapability()); err != nil {
		return r, err
	}
	if r.params, err = parseParams(req.GetVolumeContext(), "volume_context"); err != nil {
		return r, invalid("%v", err)
	}
	if r.params.Ephemeral {
		return r, nil
	}
	if r.params.NoFSGroup {
		r.group = "" // fsGroupChangePolicy None, as at NodeStageVolume
	}
	if r.staging, err = d.checkPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return r, invalid("%v (this driver stages volumes)", err)
	}
	if len(req.GetSecrets()) > 0 {
		if _, err := parseSecrets(req.GetSecrets(), "secrets"); err != nil {
			return r, invalid("%v", err)
		}
	}
	return r, nil
}

// unmountRequest is a NodeUnstageVolume or NodeUnpublishVolume request,
// checked: the volume and the path to unmount.
type unmountRequest struct {
	volumeID string
	path     string // checked to lie in the kubelet directory
}

// parseUnmount checks the volume id and the path (named field: the
// staging or the target path) of an unstage or unpublish request.
func (d *Driver) parseUnmount(volumeID, field, path string) (unmountRequest, error) {
	r := unmountRequest{volumeID: volumeID}
	if r.volumeID == "" {
		return r, invalid("volume_id is missing")
	}
	var err error
	if r.path, err = d.checkPath(field, path); err != nil {
		return r, invalid("%v", err)
	}
	return r, nil
}
