package csi

import (
	"context"
	"slices"
	"strconv"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/fusefs"
)

// A pod's fsGroup (CSI VOLUME_MOUNT_GROUP). The node advertises the
// capability, so kubelet passes the pod's fsGroup as volume_mount_group in
// NodeStageVolume and NodePublishVolume and leaves the volume alone,
// instead of chowning and chmodding every file (on blobfs, one Set Blob
// Metadata per blob, at every pod start). The mount is made for that
// group (withMountGroup): blobs that store no group show it, and the root
// directory shows it with the set-group-ID bit and group rwx, so that
// files and directories the pod makes take the group whoever makes them,
// which is what kubelet's own fsGroup handling arranges on other volumes.
// Files that store another group keep it: kubelet would have chowned them,
// blobfs does not rewrite a container's metadata to mount it.
//
// A persistent volume is staged once per node and bind-mounted into each
// of its pods there, and a FUSE mount has one set of defaults: it cannot
// show different groups to different pods. So a staged mount has one
// group at a time:
//   - the first request that carries a group sets it (NodeStageVolume, or
//     NodePublishVolume when the mount was staged for none or another);
//   - while no pod on the node uses the mount, a request for another group
//     mounts the staging path again for that group (regroup): after the
//     pods of one fsGroup are gone, kubelet keeps a volume staged for the
//     next pod if that pod was already waiting, so the group must be able
//     to change without an unstage (a mount that could not be made again,
//     its credentials having come with a NodeStageVolume before a driver
//     restart, keeps its group: logged);
//   - while a pod uses it, a pod with another fsGroup is refused
//     (FailedPrecondition, naming both groups; kubelet retries, and the pod
//     starts once the other pods are gone). Publishing it anyway would
//     give that pod a volume whose new files it may not be able to share
//     (its fsGroup is not their group), the silent failure kubelet's
//     contract is meant to prevent. A pod without fsGroup asks for nothing
//     and shares any mount.
//
// Other drivers: the SMB and Azure File drivers add gid=fsGroup at
// NodeStageVolume and ignore it at publish, so the first pod's group wins
// silently; the Azure Blob CSI driver (blobfuse) does not honour fsGroup
// at all; mountpoint-s3's driver shares a mount only between pods whose
// fsGroup matches. Mount options that set the owner (uid=, gid=) win over
// volume_mount_group, as the SMB driver's gid= does: the request's group
// is then not applied (and logged).
//
// An inline volume is mounted per pod, at NodePublishVolume: its pod's
// group simply applies.

// mountGroupOf reads and validates a capability's volume_mount_group: a
// decimal group id, returned in canonical form ("" for none).
func mountGroupOf(field string, c *csipb.VolumeCapability) (string, error) {
	g := c.GetMount().GetVolumeMountGroup()
	if g == "" {
		return "", nil
	}
	n, err := strconv.ParseUint(g, 10, 32)
	if err != nil || n > 1<<32-2 { // 4294967295 is (gid_t)-1: "no change"
		return "", invalid("%s.mount.volume_mount_group %q is not a group id (a decimal number below 4294967295)", field, clip(g, 40))
	}
	return strconv.FormatUint(n, 10), nil
}

// withMountGroup makes o a mount for group: the group of every node that
// stores none, and of the root directory, which gets the set-group-ID bit
// and group rwx on top of the mount's directory mode. Nothing changes when
// group is empty or the mount options force the owner.
func withMountGroup(o *fusefs.Options, group string) {
	if group == "" || o.ForceOwner {
		return
	}
	gid, err := strconv.ParseUint(group, 10, 32)
	if err != nil {
		return // validated by mountGroupOf; a hand-edited record shows the defaults
	}
	o.GID = uint32(gid)
	dir := 0o777 &^ o.Umask
	if o.DirMode != 0 {
		dir = o.DirMode
	}
	o.RootMode = dir | syscall.S_ISGID | 0o070
}

// otherTargets returns the recorded targets of rec, except skip, that hold
// a mount: the pods that use the staged mount now.
func (d *Driver) otherTargets(ctx context.Context, rec VolumeRecord, skip string) []string {
	var out []string
	for t := range rec.Targets {
		if t == skip {
			continue
		}
		if st, _ := d.statusOf(ctx, "target_path", t); st.State == PathMounted {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// regroup makes the staged mount of rec (at smp) one for group, for a
// publish at target: it mounts the staging path again if no other pod uses
// it, and refuses the publish otherwise. It returns the updated, persisted
// record. The caller holds the volume's lock.
func (d *Driver) regroup(ctx context.Context, rec VolumeRecord, smp *MountPoint, target, group string) (VolumeRecord, error) {
	settings, err := parseMountOptions(rec.MountOptions, "recorded mount options")
	if err != nil {
		return rec, status.Errorf(codes.Internal, "volume %q: %v", rec.VolumeID, err)
	}
	if settings.FS.ForceOwner {
		d.log.Info("volume_mount_group (the pod's fsGroup) is not applied: the volume's mount options set the owner", "volume", rec.VolumeID, "group", group)
		return rec, nil
	}
	if users := d.otherTargets(ctx, rec, target); len(users) > 0 {
		mine := rec.MountGroup
		if mine == "" {
			mine = "none"
		}
		return rec, status.Errorf(codes.FailedPrecondition,
			"volume %q is mounted on this node for fsGroup %s, used by another pod (%s); this pod's fsGroup %s cannot be applied to the same mount: give the pods that share a volume on a node the same fsGroup (this pod starts once the others are gone)",
			rec.VolumeID, mine, clip(users[0], 200), group)
	}
	if _, err := d.credsFor(ctx, rec); err != nil {
		// Its credentials came with a NodeStageVolume before a restart:
		// unmounting would lose a working mount for good.
		d.log.Warn("staged volume cannot be mounted again for another group: kept as it is", "volume", rec.VolumeID, "group", rec.MountGroup, "asked", group, "err", msgOf(err))
		return rec, nil
	}
	d.log.Info("staged volume is mounted again for another group", "volume", rec.VolumeID, "group", rec.MountGroup, "new", group)
	if err := d.mounter.UnmountVolume(ctx, smp); err != nil {
		return rec, storeError("unmount "+rec.StagingPath+" to mount it for group "+group, err)
	}
	rec.MountGroup = group
	if err := d.remount(ctx, &rec, "staging_target_path", rec.StagingPath, PathStatus{State: PathNotMounted}); err != nil {
		return rec, err
	}
	if err := d.state.Put(rec); err != nil {
		return rec, status.Errorf(codes.Internal, "%v", err)
	}
	return rec, nil
}
