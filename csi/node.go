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
// target at NodePublishVolume. Every RPC runs in one order: validate the
// request into one value (request.go: InvalidArgument naming the field),
// lock the volume (Aborted when busy), return early when already done,
// act, persist the node state.
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
	r, err := d.parseStage(ctx, req)
	if err != nil {
		return nil, err
	}
	if !d.locks.tryLock(r.volumeID) {
		return nil, busy(r.volumeID)
	}
	defer d.locks.unlock(r.volumeID)

	old, staged := d.state.Get(r.volumeID)
	switch {
	case staged && old.Ephemeral:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is in use as an inline volume", r.volumeID)
	case staged && old.StagingPath != r.staging:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is already staged at %s", r.volumeID, old.StagingPath)
	}
	// Opened under the lock: opening creates the path's missing parents.
	mp, err := d.openForMount("staging_target_path", r.staging)
	if err != nil {
		return nil, err
	}
	defer mp.Close()
	st := d.mounter.Status(ctx, mp)
	if staged && st.State == PathMounted && r.mountGroup != "" && r.mountGroup != old.MountGroup {
		if st, err = d.unmountForGroup(ctx, r, old, mp, st); err != nil {
			return nil, err
		}
	}
	if staged && st.State == PathMounted {
		// Already done: a retry.
		d.setCreds(r.volumeID, r.creds)
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	deadDev, err := d.mountStaging(ctx, r, mp, st)
	if err != nil {
		return nil, err
	}
	rec := r.record()
	rec.StagingPath = r.staging
	rec.Targets, rec.DeadDevices = old.Targets, old.DeadDevices
	if deadDev != "" && !slices.Contains(rec.DeadDevices, deadDev) {
		rec.DeadDevices = append(rec.DeadDevices, deadDev)
	}
	// Running containers' views of the dead mount are replaced by the
	// next health check, after it has bound the targets again: their
	// dead binds must be gone from the node's namespaces first, or the
	// scan would take them for containers' views.
	if err := d.recordMounted(ctx, r.nodeVolume, rec, mp); err != nil {
		return nil, err
	}
	d.log.Info("volume staged", "volume", r.volumeID, "container", r.id.Container, "path", r.staging, "read_only", r.readOnly, "group", rec.MountGroup)
	return &csipb.NodeStageVolumeResponse{}, nil
}

// unmountForGroup unmounts a volume staged for another fsGroup
// (mountgroup.go), so that it is mounted again for the request's, if no
// pod uses it, and returns the staging path's new status; else the mount
// keeps its group (NodePublishVolume then refuses the pod) and st, the
// path's status, is returned as it was.
func (d *Driver) unmountForGroup(ctx context.Context, r stageRequest, old VolumeRecord, mp *MountPoint, st PathStatus) (PathStatus, error) {
	if users := d.otherTargets(ctx, old, ""); len(users) > 0 {
		d.log.Info("staged volume keeps its group while pods use it", "volume", r.volumeID, "group", old.MountGroup, "asked", r.mountGroup, "targets", len(users))
		return st, nil
	}
	d.log.Info("staged volume is mounted again for another group", "volume", r.volumeID, "group", old.MountGroup, "new", r.mountGroup)
	if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
		return PathStatus{}, storeError("unmount "+r.staging+" to mount it for group "+r.mountGroup, err)
	}
	return PathStatus{State: PathNotMounted}, nil
}

// mountStaging mounts the volume at its staging path, st being what is
// there. A dead mount is removed first, and its device returned: running
// containers still hold copies of it (views.go). A live mount without a
// record (the record was lost) is kept: the path names the volume, since
// kubelet puts the hash of the volume id in it.
func (d *Driver) mountStaging(ctx context.Context, r stageRequest, mp *MountPoint, st PathStatus) (deadDev string, err error) {
	switch st.State {
	case PathMounted:
		return "", nil
	case PathCorrupted:
		d.log.Warn("staging path holds a dead mount; mounting again", "volume", r.volumeID, "path", r.staging, "err", st.Err)
		if dev, err := mountDevice(mp); err == nil {
			deadDev = dev
		}
		if err := d.mounter.UnmountVolume(ctx, mp); err != nil {
			return "", status.Errorf(codes.Internal, "remove dead mount at %s: %v", r.staging, err)
		}
	}
	if err := mp.mkdir(); err != nil {
		return "", pathError(err)
	}
	if err := d.mounter.MountVolume(ctx, mp, d.mountSpec(r.volumeID, r.cfg, r.settings, r.readOnly, r.mountGroup)); err != nil {
		return "", storeError(fmt.Sprintf("mount container %q at %s", r.id.Container, r.staging), err)
	}
	return deadDev, nil
}

func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	r, err := d.parseUnmount(req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	id, staging := r.volumeID, r.path
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
	r, err := d.parseUnmount(req.GetVolumeId(), "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	id, target := r.volumeID, r.path
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
	if src := rec.CredentialSource; strings.HasPrefix(src, "keyvault:") {
		return d.credsFromKeyVault(ctx, src)
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
