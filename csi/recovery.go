package csi

import (
	"context"
	"errors"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Start-up recovery and the periodic health check.
//
// The mounts this driver serves live in its process; when the process
// dies, they die with it ("transport endpoint is not connected"). kubelet
// does not stage again after a driver restart, and cannot even try while a
// dead mount sits on the staging path (its mkdir fails), so the node
// repairs by itself: for each recorded volume whose mount is dead or gone,
// it removes the dead mount and mounts the container again when it can get
// the credentials (a Secret it may read, or its Azure AD identity), then
// bind-mounts the targets again. Volumes whose credentials came in the
// request are reported unhealthy (NodeGetVolumeStats, blobfs_mounts)
// until kubelet stages them again. Keeping mounts alive across restarts
// (a keeper process holding /dev/fuse) builds on this.

// adoptMounts takes the node's live mounts back from the keeper, if there
// is one, and remembers their credentials for later repairs. What cannot
// be adopted is repaired by recover.
func (d *Driver) adoptMounts(ctx context.Context) {
	a, ok := d.mounter.(interface {
		AdoptMounts(context.Context) ([]AdoptedMount, error)
	})
	if !ok {
		return
	}
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, d.cfg.AdoptTimeout)
	defer cancel()
	adopted, err := a.AdoptMounts(actx)
	if err != nil {
		d.log.Error("could not take the mounts back from the keeper; dead ones will be mounted again", "err", err)
		return
	}
	for _, am := range adopted {
		c := am.Spec.Azure
		d.setCreds(am.Spec.VolumeID, credentials{Account: c.Account, Key: c.Key, SASToken: c.SASToken, ConnString: c.ConnectionString})
	}
	if len(adopted) > 0 {
		d.log.Info("adopted the live mounts", "mounts", len(adopted), "took", time.Since(start).Round(time.Millisecond))
	}
}

// recover runs once at start-up, before Probe reports ready.
func (d *Driver) recover(ctx context.Context) {
	recs := d.state.List()
	if len(recs) == 0 {
		return
	}
	start := time.Now()
	d.log.Info("recovering node state", "volumes", len(recs))
	d.checkMounts(ctx)
	d.unhealthyMu.Lock()
	waiting := len(d.unhealthy)
	d.unhealthyMu.Unlock()
	d.log.Info("node state recovered", "volumes", len(recs), "serving", len(recs)-waiting, "unhealthy", waiting,
		"took", time.Since(start).Round(time.Millisecond))
}

// healthLoop checks the mounts every HealthInterval until ctx ends.
func (d *Driver) healthLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.checkMounts(ctx)
		}
	}
}

// checkMounts repairs what it can of every recorded volume. A volume busy
// with an RPC is skipped until the next round.
func (d *Driver) checkMounts(ctx context.Context) {
	if r, ok := d.mounter.(interface{ Released() bool }); ok && r.Released() {
		// Another driver serves the mounts now (an upgrade): a slow
		// answer of its is not this one's to "repair".
		return
	}
	for _, rec := range d.state.List() {
		if ctx.Err() != nil {
			return
		}
		if !d.locks.tryLock(rec.VolumeID) {
			continue
		}
		d.checkVolume(ctx, rec)
		d.locks.unlock(rec.VolumeID)
	}
}

// checkVolume repairs one volume's mounts. Every path is opened without
// following symlinks and every mount is made on the directory opened: a
// path that has become a symlink (or passes through one) is reported and
// left alone, never followed, so a repair cannot mount outside the kubelet
// directory. A target is bind-mounted again only when nothing is mounted
// on it (Status finds a mount on the directory, whatever the mount table
// calls its path), so repairs never stack mounts.
func (d *Driver) checkVolume(ctx context.Context, rec VolumeRecord) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if rec.Ephemeral {
		for target := range rec.Targets {
			st, err := d.statusOf(ctx, "target_path", target)
			switch st.State {
			case PathMounted:
				continue
			case PathSymlink:
				d.log.Warn("inline volume's target is or passes through a symlink: not followed, left alone", "volume", rec.VolumeID, "target", target, "err", msgOf(err))
				d.markUnhealthy(rec.VolumeID, "target is a symlink")
				continue
			}
			if err := d.remount(ctx, &rec, "target_path", target, st); err != nil {
				d.logRepairFailure(rec, "inline volume's mount is gone and cannot be mounted again yet", target, st, err)
				continue
			}
			if mp, err := d.openMountPoint("target_path", target, false); err == nil {
				d.replaceDeadViews(&rec, mp)
				mp.Close()
			}
		}
		return
	}
	st, err := d.statusOf(ctx, "staging_target_path", rec.StagingPath)
	if st.State == PathSymlink {
		d.log.Warn("staging path is or passes through a symlink: not followed; volume left alone", "volume", rec.VolumeID, "path", rec.StagingPath, "err", msgOf(err))
		d.markUnhealthy(rec.VolumeID, "staging path is a symlink")
		return
	}
	if st.State != PathMounted {
		if err := d.remount(ctx, &rec, "staging_target_path", rec.StagingPath, st); err != nil {
			d.logRepairFailure(rec, "staging mount is gone and cannot be mounted again yet", rec.StagingPath, st, err)
			if st.State == PathCorrupted {
				// Leave no dead mount: kubelet cannot stage over one.
				if mp, err := d.openMountPoint("staging_target_path", rec.StagingPath, false); err == nil {
					d.mounter.UnmountVolume(ctx, mp)
					mp.Close()
				}
			}
			return
		}
	}
	smp, err := d.openMountPoint("staging_target_path", rec.StagingPath, false)
	if err != nil {
		d.log.Error("cannot open the staging path", "volume", rec.VolumeID, "path", rec.StagingPath, "err", msgOf(err))
		return
	}
	defer smp.Close()
	for target, t := range rec.Targets {
		d.checkTarget(ctx, &rec, smp, target, t)
	}
	d.replaceDeadViews(&rec, smp)
}

// noteDeadDevice records the device of a dead mount of the volume before
// it is removed: the running containers that had the volume hold copies
// of that mount, found by its device once the volume works again.
func (d *Driver) noteDeadDevice(rec *VolumeRecord, field, path string) {
	mp, err := d.openMountPoint(field, path, false)
	if err != nil {
		return
	}
	dev, err := mountDevice(mp)
	mp.Close()
	if err != nil || slices.Contains(rec.DeadDevices, dev) {
		return
	}
	rec.DeadDevices = append(rec.DeadDevices, dev)
	if err := d.state.Put(*rec); err != nil {
		d.log.Error("node state", "err", err)
	}
}

// replaceDeadViews replaces, in running containers, the mounts of the
// volume's dead connections with clones of its working mount at source
// (views.go), once the volume works again.
func (d *Driver) replaceDeadViews(rec *VolumeRecord, source *MountPoint) {
	if len(rec.DeadDevices) == 0 {
		return
	}
	r, ok := d.mounter.(interface {
		ReplaceDeadViews(dev, fsName string, source *MountPoint) ViewRepair
	})
	if !ok {
		return
	}
	for _, dev := range rec.DeadDevices {
		start := time.Now()
		res := r.ReplaceDeadViews(dev, fsNameOf(rec.Container), source)
		attrs := []any{"volume", rec.VolumeID, "device", dev, "namespaces", res.Namespaces, "replaced", res.Replaced,
			"live_left_alone", res.Live, "failed", res.Failed, "took", time.Since(start).Round(time.Millisecond)}
		switch {
		case res.Err != nil:
			// Not retried: what failed once fails again (and the health
			// check must not replace a view every interval).
			d.log.Error("could not give every running container its volume back; their new opens keep failing until they restart", append(attrs, "err", res.Err)...)
		case res.Replaced > 0:
			d.log.Info("running containers have their volume back (files they had open stay failed)", append(attrs, "nested_mounts_kept", res.Nested)...)
		}
		if res.NestedErr != nil {
			// The view itself is back; what was mounted inside it (a
			// configMap, a secret, another volume) is not, at the paths
			// named, until the container restarts.
			d.log.Error("mounts inside a running container's volume could not be put back; the container sees the volume's own directories there", append(attrs, "nested_mounts_kept", res.Nested, "nested_mounts_lost", res.NestedLost, "err", res.NestedErr)...)
		}
		if d.metrics != nil {
			d.metrics.countViewRepairs(res)
		}
	}
	rec.DeadDevices = nil
	if err := d.state.Put(*rec); err != nil {
		d.log.Error("node state", "err", err)
	}
}

// checkTarget bind-mounts a persistent volume's target again if its mount
// is gone, and forgets a target that is gone or has become a symlink.
func (d *Driver) checkTarget(ctx context.Context, rec *VolumeRecord, smp *MountPoint, target string, t TargetRecord) {
	forget := func() {
		delete(rec.Targets, target)
		if err := d.state.Put(*rec); err != nil {
			d.log.Error("node state", "err", err)
		}
	}
	mp, err := d.openMountPoint("target_path", target, false)
	switch {
	case errors.Is(err, errPathMissing):
		forget() // unpublished behind our back (the pod's directory is gone)
		return
	case status.Code(err) == codes.InvalidArgument:
		d.log.Warn("target is or passes through a symlink: not followed; its record is dropped", "volume", rec.VolumeID, "target", target, "err", msgOf(err))
		forget()
		return
	case err != nil:
		d.log.Error("cannot open target", "volume", rec.VolumeID, "target", target, "err", msgOf(err))
		return
	}
	defer mp.Close()
	switch tst := d.mounter.Status(ctx, mp); tst.State {
	case PathMounted:
		return
	case PathMissing:
		forget()
		return
	case PathSymlink:
		d.log.Warn("target is a symlink: not followed; its record is dropped", "volume", rec.VolumeID, "target", target)
		forget()
		return
	case PathCorrupted:
		d.mounter.Unmount(mp)
	}
	if err := d.mounter.BindMount(smp, mp, t.ReadOnly); err != nil {
		d.log.Error("cannot bind-mount target again", "volume", rec.VolumeID, "target", target, "err", err)
		d.markUnhealthy(rec.VolumeID, err.Error())
		return
	}
	d.log.Info("target bind-mounted again", "volume", rec.VolumeID, "target", target)
}

// logRepairFailure says that a volume's mount could not be repaired: at
// error level the first time for a reason, at debug level on the retries
// of every health check after it.
func (d *Driver) logRepairFailure(rec VolumeRecord, msg, path string, st PathStatus, err error) {
	attrs := []any{"volume", rec.VolumeID, "path", path, "state", st.State, "err", msgOf(err), "retry_every", d.cfg.HealthInterval}
	d.markUnhealthy(rec.VolumeID, msgOf(err))
	if d.reportRepairFailure(rec.VolumeID, msgOf(err)) {
		d.log.Error(msg, attrs...)
		d.warnVolume(rec, "VolumeMountLost", msg+": "+msgOf(err))
		return
	}
	d.log.Debug(msg, attrs...)
}

// warnVolume records a Warning event on the volume's PersistentVolume, in
// the background (the API server must not slow the health check down),
// when the driver may use the API.
func (d *Driver) warnVolume(rec VolumeRecord, reason, message string) {
	ev, ok := d.secrets.(VolumeEvents)
	if !ok {
		return
	}
	q := d.pvQuery(rec)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ev.WarnVolume(ctx, q, d.cfg.NodeID, reason, message); err != nil {
			d.log.Warn("could not record an event on the volume's PersistentVolume", "volume", rec.VolumeID, "err", err)
		}
	}()
}

// pvQuery says which PersistentVolume is the volume's, with the names it
// may have from the paths kubelet gave it: a pod's target is
// pods/UID/volumes/kubernetes.io~csi/PVNAME/mount, and an old kubelet's
// staging path plugins/kubernetes.io/csi/pv/PVNAME/globalmount (a newer
// one's has a hash of the handle instead). Wrong guesses cost one GET
// each; the PersistentVolume found must have the volume's handle.
func (d *Driver) pvQuery(rec VolumeRecord) PVQuery {
	q := PVQuery{Driver: d.cfg.DriverName, VolumeHandle: rec.VolumeID}
	add := func(name string) {
		if name != "" && name != "." && name != "/" && !slices.Contains(q.Names, name) {
			q.Names = append(q.Names, name)
		}
	}
	targets := slices.Sorted(maps.Keys(rec.Targets))
	for _, t := range targets {
		if filepath.Base(t) == "mount" && filepath.Base(filepath.Dir(filepath.Dir(t))) == "kubernetes.io~csi" {
			add(filepath.Base(filepath.Dir(t)))
		}
	}
	if s := rec.StagingPath; filepath.Base(s) == "globalmount" && filepath.Base(filepath.Dir(filepath.Dir(s))) == "pv" {
		add(filepath.Base(filepath.Dir(s)))
	}
	return q
}

// msgOf is an error's message, its gRPC status's if it has one.
func msgOf(err error) string {
	if err == nil {
		return ""
	}
	return status.Convert(err).Message()
}

func (d *Driver) markUnhealthy(volumeID, reason string) {
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	d.unhealthy[volumeID] = reason
}

// unhealthyReason is why the last repair of the volume failed, or "".
func (d *Driver) unhealthyReason(volumeID string) string {
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	return d.unhealthy[volumeID]
}

// reportRepairFailure reports whether a failed repair of the volume for
// this reason is news (not said since the volume was last healthy): the
// health check retries every interval, and says so once, not every time.
func (d *Driver) reportRepairFailure(volumeID, reason string) bool {
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	if d.repairReported[volumeID] == reason {
		return false
	}
	d.repairReported[volumeID] = reason
	return true
}

func (d *Driver) markHealthy(volumeID string) {
	d.lookups.reset(volumeID)
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	delete(d.unhealthy, volumeID)
	delete(d.repairReported, volumeID)
}

// mountCounts feeds blobfs_mounts.
func (d *Driver) mountCounts() map[string]int {
	c := map[string]int{}
	for _, rec := range d.state.List() {
		if rec.Ephemeral {
			c["ephemeral"]++
		} else {
			c["staged"]++
			c["published"] += len(rec.Targets)
		}
	}
	d.unhealthyMu.Lock()
	c["unhealthy"] = len(d.unhealthy)
	d.unhealthyMu.Unlock()
	return c
}
