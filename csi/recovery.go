package csi

import (
	"context"
	"time"
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
	if len(recs) > 0 {
		d.log.Info("recovering node state", "volumes", len(recs))
	}
	d.checkMounts(ctx)
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

func (d *Driver) checkVolume(ctx context.Context, rec VolumeRecord) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if rec.Ephemeral {
		for target := range rec.Targets {
			if st := d.mounter.Status(ctx, target); st.State != PathMounted {
				d.log.Warn("inline volume's mount is gone", "volume", rec.VolumeID, "target", target, "state", st.State, "err", st.Err)
				if err := d.remount(ctx, rec, target, st); err != nil {
					d.log.Error("cannot mount inline volume again", "volume", rec.VolumeID, "err", err)
				}
			}
		}
		return
	}
	st := d.mounter.Status(ctx, rec.StagingPath)
	if st.State != PathMounted {
		d.log.Warn("staging mount is gone", "volume", rec.VolumeID, "path", rec.StagingPath, "state", st.State, "err", st.Err)
		if err := d.remount(ctx, rec, rec.StagingPath, st); err != nil {
			d.log.Error("cannot mount volume again", "volume", rec.VolumeID, "err", err)
			if st.State == PathCorrupted {
				// Leave no dead mount: kubelet cannot stage over one.
				d.mounter.UnmountVolume(ctx, rec.StagingPath)
			}
			return
		}
	}
	for target, t := range rec.Targets {
		tst := d.mounter.Status(ctx, target)
		switch tst.State {
		case PathMounted:
			continue
		case PathMissing:
			// Unpublished behind our back (the pod's directory is gone).
			delete(rec.Targets, target)
			if err := d.state.Put(rec); err != nil {
				d.log.Error("node state", "err", err)
			}
			continue
		case PathCorrupted:
			d.mounter.Unmount(target)
		}
		if err := d.mounter.BindMount(rec.StagingPath, target, t.ReadOnly); err != nil {
			d.log.Error("cannot bind-mount target again", "volume", rec.VolumeID, "target", target, "err", err)
			d.markUnhealthy(rec.VolumeID, err.Error())
			continue
		}
		d.log.Info("target bind-mounted again", "volume", rec.VolumeID, "target", target)
	}
}

func (d *Driver) markUnhealthy(volumeID, reason string) {
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	d.unhealthy[volumeID] = reason
}

func (d *Driver) markHealthy(volumeID string) {
	d.unhealthyMu.Lock()
	defer d.unhealthyMu.Unlock()
	delete(d.unhealthy, volumeID)
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
