package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// Node service. A persistent volume is mounted once per node, in this
// process, at its staging path (NodeStageVolume) and bind-mounted into each
// pod (NodePublishVolume); an inline ephemeral volume is mounted at its one
// target at NodePublishVolume. Every RPC runs in one order: validate
// (InvalidArgument naming the field), lock the volume (Aborted when busy),
// return early when already done, act, persist the node state.
//
// NodeGetVolumeStats and NodeGetInfo take no lock: they only read, and
// kubelet polls stats while it stages and publishes.

func (d *Driver) NodeGetInfo(ctx context.Context, req *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

func (d *Driver) NodeGetCapabilities(ctx context.Context, req *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_VOLUME_CONDITION,
		// kubelet then passes a pod's fsGroup as volume_mount_group
		// (mountgroup.go) instead of chowning every file itself.
		csipb.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: t},
		}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// nodeVolume is a validated request for a mount.
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
	if !p.Ephemeral && p.SecretName != "" {
		p.SecretNamespace = p.secretNamespaceFor(h.SecretNamespace)
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
		if v.creds, v.source, err = d.blobCSISecret(ctx, account, p.secretNamespaceFor(h.SecretNamespace)); err != nil {
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

// cacheDirFor is a volume's spill directory.
func (d *Driver) cacheDirFor(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return filepath.Join(d.cfg.CacheDir, hex.EncodeToString(sum[:12]))
}

func (d *Driver) mountSpec(volumeID string, cfg blobstore.AzureConfig, s mountSettings, readOnly bool, group string) MountSpec {
	spec := MountSpec{VolumeID: volumeID, Azure: cfg, FS: s.FS, Mount: s.Mount, Retry: s.Retry}
	withMountGroup(&spec.FS, group)
	spec.FS.CacheDir = d.cacheDirFor(volumeID)
	spec.FS.StoreID = volumeID
	spec.FS.ReadOnly = readOnly
	spec.Mount.ReadOnly = readOnly
	return spec
}

func (v nodeVolume) record() VolumeRecord {
	return VolumeRecord{
		VolumeID:         v.volumeID,
		Account:          v.id.Account,
		Container:        v.id.Container,
		Endpoint:         v.id.Endpoint,
		Auth:             v.cfg.Auth,
		CredentialSource: v.source,
		IdentityClientID: v.cfg.ClientID,
		ReadOnly:         v.readOnly,
		MountOptions:     v.settings.Options,
		MountGroup:       v.mountGroup,
	}
}

func (d *Driver) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	staging, err := d.checkPath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, invalid("%v", err)
	}
	if req.GetVolumeCapability() == nil {
		return nil, invalid("volume_capability is missing")
	}
	v, err := d.resolveVolume(ctx, req.GetVolumeId(), req.GetVolumeContext(), req.GetSecrets(), req.GetVolumeCapability(), false)
	if err != nil {
		return nil, err
	}
	if v.params.Ephemeral {
		return nil, invalid("volume_context: inline ephemeral volumes are not staged")
	}

	if !d.locks.tryLock(v.volumeID) {
		return nil, busy(v.volumeID)
	}
	defer d.locks.unlock(v.volumeID)

	if rec, ok := d.state.Get(v.volumeID); ok {
		if rec.Ephemeral {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is in use as an inline volume", v.volumeID)
		}
		if rec.StagingPath != staging {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is already staged at %s", v.volumeID, rec.StagingPath)
		}
	}
	mp, err := d.openForMount("staging_target_path", staging)
	if err != nil {
		return nil, err
	}
	defer mp.Close()
	st := d.mounter.Status(ctx, mp)
	deadDev := "" // the device of a dead mount replaced here (views.go)
	if old, ok := d.state.Get(v.volumeID); ok && st.State == PathMounted && v.mountGroup != "" && v.mountGroup != old.MountGroup {
		// Staged for another fsGroup (mountgroup.go): mounted again
		// for this one if no pod uses it; else it keeps its group and
		// NodePublishVolume refuses the pod.
		if users := d.otherTargets(ctx, old, ""); len(users) > 0 {
			d.log.Info("staged volume keeps its group while pods use it", "volume", v.volumeID, "group", old.MountGroup, "asked", v.mountGroup, "targets", len(users))
		} else {
			d.log.Info("staged volume is mounted again for another group", "volume", v.volumeID, "group", old.MountGroup, "new", v.mountGroup)
			if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
				return nil, storeError("unmount "+staging+" to mount it for group "+v.mountGroup, err)
			}
			st = PathStatus{State: PathNotMounted}
		}
	}
	switch st.State {
	case PathMounted:
		// Already staged (a retry, or a record lost): the path names the
		// volume (kubelet puts the hash of the volume id in it).
		if _, ok := d.state.Get(v.volumeID); ok {
			d.setCreds(v.volumeID, v.creds)
			return &csipb.NodeStageVolumeResponse{}, nil
		}
	case PathCorrupted:
		d.log.Warn("staging path holds a dead mount; mounting again", "volume", v.volumeID, "path", staging, "err", st.Err)
		if dev, err := mountDevice(mp); err == nil {
			deadDev = dev
		}
		if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
			return nil, status.Errorf(codes.Internal, "remove dead mount at %s: %v", staging, err)
		}
		fallthrough
	default:
		if err := mp.mkdir(); err != nil {
			return nil, pathError(err)
		}
		if err := d.mounter.MountVolume(ctx, mp, d.mountSpec(v.volumeID, v.cfg, v.settings, v.readOnly, v.mountGroup)); err != nil {
			return nil, storeError(fmt.Sprintf("mount container %q at %s", v.id.Container, staging), err)
		}
	}
	rec := v.record()
	rec.StagingPath = staging
	if old, ok := d.state.Get(v.volumeID); ok {
		rec.Targets = old.Targets
		rec.DeadDevices = old.DeadDevices
	}
	if deadDev != "" && !slices.Contains(rec.DeadDevices, deadDev) {
		rec.DeadDevices = append(rec.DeadDevices, deadDev)
	}
	// Running containers' views of the dead mount are replaced by the
	// next health check, after it has bound the targets again: their
	// dead binds must be gone from the node's namespaces first, or the
	// scan would take them for containers' views.
	if err := d.recordMounted(ctx, v, rec, mp); err != nil {
		return nil, err
	}
	d.log.Info("volume staged", "volume", v.volumeID, "container", v.id.Container, "path", staging, "read_only", v.readOnly, "group", rec.MountGroup)
	return &csipb.NodeStageVolumeResponse{}, nil
}

func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	staging, err := d.checkPath("staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, invalid("%v", err)
	}
	id := req.GetVolumeId()
	if !d.locks.tryLock(id) {
		return nil, busy(id)
	}
	defer d.locks.unlock(id)

	rec, ok := d.state.Get(id)
	if ok && rec.Ephemeral {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is an inline volume: it is not staged", id)
	}
	if ok {
		for t := range rec.Targets {
			// A target that is gone, or reached only through a
			// symlink, holds no mount of this driver's.
			if st, _ := d.statusOf(ctx, "target_path", t); st.State == PathMounted {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still published at %s; unpublish it first", id, t)
			}
		}
	}
	// A staging path that is or passes through a symlink is refused, and
	// nothing is followed or touched: whatever the symlink points at is
	// not this driver's to unmount (it never mounts through a symlink; a
	// mount made before a directory was swapped went with the directory,
	// and is served until it is unmounted). The record goes, so that the
	// health check stops looking at the volume.
	refuse := func(refusal error) (*csipb.NodeUnstageVolumeResponse, error) {
		d.log.Warn("staging path is or passes through a symlink: not followed; its record is dropped",
			"volume", id, "path", staging, "err", msgOf(refusal))
		if ok && rec.StagingPath == staging {
			if err := d.state.Delete(id); err != nil {
				return nil, status.Errorf(codes.Internal, "%v", err)
			}
			d.forget(id)
		}
		return nil, refusal
	}
	mp, err := d.openMountPoint("staging_target_path", staging, false)
	switch {
	case errors.Is(err, errPathMissing):
	case status.Code(err) == codes.InvalidArgument:
		return refuse(err)
	case err != nil:
		return nil, err
	default:
		defer mp.Close()
		switch st := d.mounter.Status(ctx, mp); st.State {
		case PathSymlink:
			return refuse(invalid("%v", &symlinkError{field: "staging_target_path", path: staging, link: staging}))
		case PathMounted, PathCorrupted:
			// Uploads dirty data first; a failure leaves the mount for
			// a retry.
			if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
				return nil, storeError("unstage "+staging, err)
			}
		}
	}
	if ok && rec.StagingPath == staging {
		if err := d.state.Delete(id); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		d.forget(id)
	}
	d.log.Info("volume unstaged", "volume", id, "path", staging)
	return &csipb.NodeUnstageVolumeResponse{}, nil
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

func (d *Driver) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	r, err := d.parsePublish(req)
	if err != nil {
		return nil, err
	}
	if r.params.Ephemeral {
		return d.publishEphemeral(ctx, req, r.target)
	}
	id, target, staging, ro, group := r.id, r.target, r.staging, r.readOnly, r.group
	if !d.locks.tryLock(id) {
		return nil, busy(id)
	}
	defer d.locks.unlock(id)

	rec, ok := d.state.Get(id)
	switch {
	case ok && rec.Ephemeral:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is in use as an inline volume", id)
	case ok && rec.StagingPath != staging:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged at %s, not at %s", id, rec.StagingPath, staging)
	}
	smp, err := d.openMountPoint("staging_target_path", staging, false)
	var sst PathStatus
	switch {
	case errors.Is(err, errPathMissing):
		sst.State = PathMissing
	case err != nil:
		return nil, err
	default:
		defer smp.Close()
		sst = d.mounter.Status(ctx, smp)
	}
	if sst.State == PathSymlink {
		return nil, invalid("%v", &symlinkError{field: "staging_target_path", path: staging, link: staging})
	}
	if smp != nil {
		if err := smp.checkDir(); err != nil {
			return nil, pathError(err)
		}
	}
	// The target is opened before anything is mounted, so that a request
	// whose target is refused changes nothing.
	tmp, err := d.openForMount("target_path", target)
	if err != nil {
		return nil, err
	}
	defer tmp.Close()
	switch st := sst; {
	case st.State == PathMounted && !ok:
		// Staged, but the record was lost: adopt the mount.
		rec = VolumeRecord{VolumeID: id, StagingPath: staging, CredentialSource: "request"}
	case st.State == PathMounted:
	case !ok:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged at %s: call NodeStageVolume first", id, staging)
	default:
		// Staged once, but the mount is gone (the process that served it
		// died): mount it again if its credentials can be had; secrets
		// in this request (a node-publish secret) serve as well.
		if c, err := parseSecrets(req.GetSecrets(), "secrets"); err == nil && !c.empty() {
			d.setCreds(id, c)
		}
		if err := d.remount(ctx, &rec, "staging_target_path", staging, st); err != nil {
			return nil, err
		}
		if smp == nil {
			if smp, err = d.openMountPoint("staging_target_path", staging, false); err != nil {
				return nil, pathError(err)
			}
			defer smp.Close()
		}
	}
	if group != "" && group != rec.MountGroup {
		if rec, err = d.regroup(ctx, rec, smp, target, group); err != nil {
			return nil, err
		}
	}
	if err := d.bindTarget(ctx, id, rec, smp, tmp, target, ro); err != nil {
		return nil, err
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

// bindTarget bind-mounts the staged volume smp at the target tmp (the
// path target), unless it is published there already, replacing what else
// is mounted there, and records the target.
func (d *Driver) bindTarget(ctx context.Context, id string, rec VolumeRecord, smp, tmp *MountPoint, target string, ro bool) error {
	switch st := d.mounter.Status(ctx, tmp); st.State {
	case PathMounted:
		if t, found := rec.Targets[target]; found {
			if t.ReadOnly != ro {
				return status.Errorf(codes.AlreadyExists, "volume %q is already published at %s with read-only=%v", id, target, t.ReadOnly)
			}
			return nil
		}
		// Something else is mounted there: replace it.
		if err := d.mounter.Unmount(tmp); err != nil {
			return status.Errorf(codes.Internal, "%v", err)
		}
	case PathCorrupted:
		if err := d.mounter.Unmount(tmp); err != nil {
			return status.Errorf(codes.Internal, "remove dead mount at %s: %v", target, err)
		}
	}
	if err := tmp.mkdir(); err != nil {
		return pathError(err)
	}
	if err := d.mounter.BindMount(smp, tmp, ro); err != nil {
		return storeError("publish", err)
	}
	if rec.Targets == nil {
		rec.Targets = map[string]TargetRecord{}
	}
	rec.Targets[target] = TargetRecord{ReadOnly: ro}
	if err := d.state.Put(rec); err != nil {
		d.mounter.Unmount(tmp)
		return status.Errorf(codes.Internal, "%v", err)
	}
	d.log.Info("volume published", "volume", id, "target", target, "read_only", ro)
	return nil
}

// publishEphemeral mounts an inline volume at its target.
func (d *Driver) publishEphemeral(ctx context.Context, req *csipb.NodePublishVolumeRequest, target string) (*csipb.NodePublishVolumeResponse, error) {
	v, err := d.resolveVolume(ctx, req.GetVolumeId(), req.GetVolumeContext(), req.GetSecrets(), req.GetVolumeCapability(), req.GetReadonly())
	if err != nil {
		return nil, err
	}
	if !d.locks.tryLock(v.volumeID) {
		return nil, busy(v.volumeID)
	}
	defer d.locks.unlock(v.volumeID)

	rec, ok := d.state.Get(v.volumeID)
	if ok && !rec.Ephemeral {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is staged as a persistent volume, not an inline one", v.volumeID)
	}
	if ok {
		if _, found := rec.Targets[target]; !found {
			return nil, status.Errorf(codes.FailedPrecondition, "inline volume %q is already published at another target", v.volumeID)
		}
	}
	mp, err := d.openForMount("target_path", target)
	if err != nil {
		return nil, err
	}
	defer mp.Close()
	switch st := d.mounter.Status(ctx, mp); st.State {
	case PathMounted:
		if ok {
			if rec.ReadOnly != v.readOnly {
				return nil, status.Errorf(codes.AlreadyExists, "volume %q is already published at %s with read-only=%v", v.volumeID, target, rec.ReadOnly)
			}
			d.setCreds(v.volumeID, v.creds)
			return &csipb.NodePublishVolumeResponse{}, nil
		}
		fallthrough
	case PathCorrupted:
		if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
			return nil, status.Errorf(codes.Internal, "remove old mount at %s: %v", target, err)
		}
	}
	if err := mp.mkdir(); err != nil {
		return nil, pathError(err)
	}
	if err := d.mounter.MountVolume(ctx, mp, d.mountSpec(v.volumeID, v.cfg, v.settings, v.readOnly, v.mountGroup)); err != nil {
		mp.remove()
		return nil, storeError(fmt.Sprintf("mount container %q at %s", v.id.Container, target), err)
	}
	rec = v.record()
	rec.Ephemeral = true
	rec.Targets = map[string]TargetRecord{target: {ReadOnly: v.readOnly}}
	if err := d.recordMounted(ctx, v, rec, mp); err != nil {
		return nil, err
	}
	d.log.Info("inline volume published", "volume", v.volumeID, "container", v.id.Container, "target", target, "read_only", v.readOnly)
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	target, err := d.checkPath("target_path", req.GetTargetPath())
	if err != nil {
		return nil, invalid("%v", err)
	}
	id := req.GetVolumeId()
	if !d.locks.tryLock(id) {
		return nil, busy(id)
	}
	defer d.locks.unlock(id)

	rec, ok := d.state.Get(id)
	mp, err := d.openMountPoint("target_path", target, false)
	switch {
	case errors.Is(err, errPathMissing):
		// Nothing there: nothing to unmount or remove.
	case status.Code(err) == codes.InvalidArgument:
		return nil, d.unpublishSymlink(id, target, rec, ok, err)
	case err != nil:
		return nil, err
	default:
		defer mp.Close()
		switch st := d.mounter.Status(ctx, mp); st.State {
		case PathSymlink:
			return nil, d.unpublishSymlink(id, target, rec, ok, invalid("%v", &symlinkError{field: "target_path", path: target, link: target}))
		case PathMounted, PathCorrupted:
			// For an inline volume this uploads its dirty data first;
			// for a bind mount it just unmounts.
			if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
				return nil, storeError("unpublish "+target, err)
			}
		}
		// The CO created the parent; the target is ours to remove.
		if err := mp.remove(); err != nil {
			return nil, status.Errorf(codes.Internal, "remove target_path: %v", err)
		}
	}
	if err := d.dropTarget(id, target, rec, ok); err != nil {
		return nil, err
	}
	d.log.Info("volume unpublished", "volume", id, "target", target)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// unpublishSymlink answers an unpublish whose target is or passes through
// a symlink: nothing is followed, unmounted or removed (this driver never
// mounts through a symlink, so nothing of its can be reached there: a bind
// mount made before a directory was swapped went with the directory), the
// record of the target is dropped so that the health check stops looking
// at it, and the request is refused naming target_path.
func (d *Driver) unpublishSymlink(id, target string, rec VolumeRecord, ok bool, refusal error) error {
	d.log.Warn("target path is or passes through a symlink: not followed; its record is dropped",
		"volume", id, "target", target, "err", status.Convert(refusal).Message())
	if err := d.dropTarget(id, target, rec, ok); err != nil {
		return err
	}
	return refusal
}

// dropTarget removes target from the volume's record (the record itself
// for an inline volume).
func (d *Driver) dropTarget(id, target string, rec VolumeRecord, ok bool) error {
	if !ok {
		return nil
	}
	if _, found := rec.Targets[target]; !found {
		return nil
	}
	delete(rec.Targets, target)
	var err error
	if rec.Ephemeral {
		err = d.state.Delete(id)
		d.forget(id)
	} else {
		err = d.state.Put(rec)
	}
	if err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	return nil
}

// openMountPoint opens a staging or target path (checked by checkPath)
// below the kubelet directory without following symlinks (paths.go). A
// path that passes through a symlink or a file is InvalidArgument naming
// field; a missing parent directory (create unset) is errPathMissing,
// unwrapped; anything else is Internal. create makes missing parents
// (kubelet makes them; a path kubelet did not make yet gets them as with
// mkdir -p).
func (d *Driver) openMountPoint(field, path string, create bool) (*MountPoint, error) {
	mp, err := openMountPoint(d.kubeletDir, field, path, create)
	var symlink *symlinkError
	var notDir *notDirError
	switch {
	case err == nil:
		return mp, nil
	case errors.As(err, &symlink):
		return nil, invalid("%v", symlink)
	case errors.As(err, &notDir):
		return nil, invalid("%v", notDir)
	case errors.Is(err, errPathMissing):
		return nil, err
	}
	return nil, status.Errorf(codes.Internal, "%v", err)
}

// openForMount opens a path to mount on (stage, publish): its parents are
// created, and a symlink or a file anywhere on it, the last component
// included, is InvalidArgument naming field.
func (d *Driver) openForMount(field, path string) (*MountPoint, error) {
	mp, err := d.openMountPoint(field, path, true)
	if err != nil {
		return nil, pathError(err)
	}
	if err := mp.checkDir(); err != nil {
		mp.Close()
		return nil, pathError(err)
	}
	return mp, nil
}

// statusOf is the mounter's Status of a recorded path. A path that is
// gone is PathMissing; one that is or passes through a symlink is
// PathSymlink (and err says where): it is never followed.
func (d *Driver) statusOf(ctx context.Context, field, path string) (PathStatus, error) {
	mp, err := openMountPoint(d.kubeletDir, field, path, false)
	var symlink *symlinkError
	switch {
	case errors.Is(err, errPathMissing):
		return PathStatus{State: PathMissing}, nil
	case errors.As(err, &symlink):
		err = invalid("%v", symlink)
		return PathStatus{State: PathSymlink, Err: err}, err
	case err != nil:
		err = status.Errorf(codes.Internal, "%v", err)
		return PathStatus{State: PathCorrupted, Err: err}, err
	}
	defer mp.Close()
	return d.mounter.Status(ctx, mp), nil
}

func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is missing")
	}
	rec, ok := d.state.Get(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged or published on this node", req.GetVolumeId())
	}
	path := filepath.Clean(req.GetVolumePath())
	if _, isTarget := rec.Targets[path]; !isTarget && (path != rec.StagingPath || rec.StagingPath == "") {
		return nil, status.Errorf(codes.NotFound, "volume %q is not mounted at %q", req.GetVolumeId(), clip(req.GetVolumePath(), 200))
	}
	abnormal := func(msg string) *csipb.NodeGetVolumeStatsResponse {
		if why := d.unhealthyReason(rec.VolumeID); why != "" {
			// Why the health check has not mounted it again: what the
			// operator reading the condition needs next.
			msg += "; not mounted again yet: " + why
		}
		return &csipb.NodeGetVolumeStatsResponse{VolumeCondition: &csipb.VolumeCondition{Abnormal: true, Message: msg}}
	}
	mp, err := d.openMountPoint("volume_path", path, false)
	if errors.Is(err, errPathMissing) {
		return abnormal(fmt.Sprintf("%s is not mounted", path)), nil
	} else if err != nil {
		return abnormal(status.Convert(err).Message()), nil
	}
	defer mp.Close()
	st := d.mounter.Status(ctx, mp)
	switch st.State {
	case PathMissing, PathNotMounted:
		return abnormal(fmt.Sprintf("%s is not mounted", path)), nil
	case PathSymlink:
		return abnormal((&symlinkError{field: "volume_path", path: path, link: path}).Error()), nil
	case PathCorrupted:
		return abnormal(fmt.Sprintf("the mount at %s is dead: %v", path, st.Err)), nil
	}
	dir, err := mp.dir()
	if err != nil {
		return abnormal(err.Error()), nil
	}
	var fs unix.Statfs_t
	if err := statfsTimeout(ctx, dir, &fs); err != nil {
		return abnormal(fmt.Sprintf("statfs %s: %v", path, err)), nil
	}
	bs := int64(fs.Bsize)
	return &csipb.NodeGetVolumeStatsResponse{
		Usage: []*csipb.VolumeUsage{
			{Unit: csipb.VolumeUsage_BYTES, Total: int64(fs.Blocks) * bs, Available: int64(fs.Bavail) * bs, Used: int64(fs.Blocks-fs.Bfree) * bs},
			{Unit: csipb.VolumeUsage_INODES, Total: int64(fs.Files), Available: int64(fs.Ffree), Used: int64(fs.Files - fs.Ffree)},
		},
		VolumeCondition: &csipb.VolumeCondition{Abnormal: false, Message: "mounted and answering"},
	}, nil
}

// statfsTimeout is fstatfs(2) of dir that gives up after statTimeout, so
// that a hung mount cannot hang the caller (the goroutine stays until it
// returns). It takes dir over and closes it.
func statfsTimeout(ctx context.Context, dir *os.File, out *unix.Statfs_t) error {
	type result struct {
		st  unix.Statfs_t
		err error
	}
	ch := make(chan result, 1)
	go func() {
		defer dir.Close()
		var r result
		r.err = unix.Fstatfs(int(dir.Fd()), &r.st)
		ch <- r
	}()
	t := time.NewTimer(statTimeout)
	defer t.Stop()
	select {
	case r := <-ch:
		*out = r.st
		return r.err
	case <-t.C:
		return fmt.Errorf("no answer within %v", statTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// --- credentials kept in memory ----------------------------------------

func (d *Driver) setCreds(volumeID string, c credentials) {
	d.credsMu.Lock()
	defer d.credsMu.Unlock()
	d.creds[volumeID] = c
}

func (d *Driver) forget(volumeID string) {
	d.credsMu.Lock()
	delete(d.creds, volumeID)
	d.credsMu.Unlock()
	d.markHealthy(volumeID)
}

// credsFor returns the credentials to mount a recorded volume again.
func (d *Driver) credsFor(ctx context.Context, rec VolumeRecord) (credentials, error) {
	d.credsMu.Lock()
	c, ok := d.creds[rec.VolumeID]
	d.credsMu.Unlock()
	if ok {
		return c, nil
	}
	if rec.CredentialSource == "identity" {
		return credentials{}, nil
	}
	// Through the API: not again at every health check while it fails.
	if err := d.lookups.wait(rec.VolumeID); err != nil {
		return c, err
	}
	c, err := d.credsFromAPI(ctx, rec)
	if err != nil {
		d.lookups.failed(rec.VolumeID, err)
	}
	return c, err
}

// credsFromAPI reads a recorded volume's credentials again through the
// Kubernetes API: the Secret its secretName names, or the one its
// PersistentVolume's nodeStageSecretRef names.
func (d *Driver) credsFromAPI(ctx context.Context, rec VolumeRecord) (credentials, error) {
	var c credentials
	readSecret := func(ns, name string) (credentials, error) {
		data, err := d.secrets.GetSecret(ctx, ns, name)
		if err != nil {
			return credentials{}, storeError("read secret", err)
		}
		c, err := parseSecrets(data, "secret "+ns+"/"+name)
		if err != nil {
			return c, invalid("%v", err)
		}
		return c, nil
	}
	if src := rec.CredentialSource; strings.HasPrefix(src, "secret:") {
		ns, name, _ := strings.Cut(strings.TrimPrefix(src, "secret:"), "/")
		if d.secrets == nil {
			return c, status.Errorf(codes.FailedPrecondition, "secret %s/%s: no access to the Kubernetes API", ns, name)
		}
		return readSecret(ns, name)
	}
	// The credentials came with NodeStageVolume: kubelet read them from
	// the PersistentVolume's nodeStageSecretRef, and so can the driver.
	refs, ok := d.secrets.(StageSecretRefs)
	if !ok {
		return c, status.Errorf(codes.Unavailable,
			"volume %q lost its mount, and its credentials came with NodeStageVolume and the driver has no access to the Kubernetes API to read them again: it waits for kubelet to stage the volume (a new pod using it)", rec.VolumeID)
	}
	ns, name, err := refs.StageSecretRef(ctx, d.pvQuery(rec))
	if err != nil {
		return c, status.Errorf(codes.Unavailable,
			"volume %q lost its mount, and its credentials came with NodeStageVolume: %v; it waits for kubelet to stage the volume (a new pod using it)", rec.VolumeID, err)
	}
	c, err = readSecret(ns, name)
	if err == nil {
		d.log.Info("read the credentials of a volume again from its PersistentVolume's nodeStageSecretRef", "volume", rec.VolumeID, "secret", ns+"/"+name)
		d.setCreds(rec.VolumeID, c)
	}
	return c, err
}

// remount mounts a recorded volume again at path (its staging path, or an
// inline volume's target) after its mount was lost.
func (d *Driver) remount(ctx context.Context, rec *VolumeRecord, field, path string, st PathStatus) error {
	if st.State == PathCorrupted {
		// Before the dead mount goes: running containers hold copies of
		// it, found by its device once the volume works again.
		d.noteDeadDevice(rec, field, path)
	}
	creds, err := d.credsFor(ctx, *rec)
	if err != nil {
		d.markUnhealthy(rec.VolumeID, status.Convert(err).Message())
		return err
	}
	id := volumeID{Account: rec.Account, Container: rec.Container, Endpoint: rec.Endpoint}
	p := volumeParams{IdentityClientID: rec.IdentityClientID}
	if rec.Auth != "anonymous" {
		p.AuthType = rec.Auth
	}
	cfg, err := azureConfig(id, creds, p)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: recorded configuration: %v", rec.VolumeID, err)
	}
	settings, err := parseMountOptions(rec.MountOptions, "recorded mount options")
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: %v", rec.VolumeID, err)
	}
	mp, err := d.openForMount(field, path)
	if err != nil {
		return err
	}
	defer mp.Close()
	if st.State == PathCorrupted {
		if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
			return status.Errorf(codes.Internal, "remove dead mount at %s: %v", path, err)
		}
	}
	if err := mp.mkdir(); err != nil {
		return pathError(err)
	}
	if err := d.mounter.MountVolume(ctx, mp, d.mountSpec(rec.VolumeID, cfg, settings, rec.ReadOnly, rec.MountGroup)); err != nil {
		err = storeError(fmt.Sprintf("mount container %q again at %s", rec.Container, path), err)
		d.markUnhealthy(rec.VolumeID, status.Convert(err).Message())
		return err
	}
	d.markHealthy(rec.VolumeID)
	d.log.Info("volume mounted again", "volume", rec.VolumeID, "path", path, "was", st.State, "group", rec.MountGroup)
	return nil
}

// recordMounted persists the record of a volume just mounted at path (the
// mount is undone if that fails: state and mounts must agree) and keeps its
// credentials in memory for repairs.
func (d *Driver) recordMounted(ctx context.Context, v nodeVolume, rec VolumeRecord, mp *MountPoint) error {
	if err := d.state.Put(rec); err != nil {
		d.mounter.UnmountVolume(context.WithoutCancel(ctx), mp)
		return status.Errorf(codes.Internal, "%v", err)
	}
	d.setCreds(v.volumeID, v.creds)
	d.markHealthy(v.volumeID)
	return nil
}
