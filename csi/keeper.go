package csi

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/fusefs/handoff"
)

// Mounts that outlive the driver.
//
// With a keeper (a `blobfs keeper` process beside the driver, see
// fusefs/handoff/keeper.go), every mount this driver makes is given to it: a dup of
// its /dev/fuse fd, its state region, and a record of how to serve it again
// (keeperRecord: the volume, the store's configuration with its credentials,
// the options). The record lives only in the keeper's memory. When the
// driver dies, the kernel keeps the mounts alive on the keeper's fds and
// their requests wait; the next driver adopts them (AdoptMounts) before it
// reports ready, and they go on where they stopped.
//
// Upgrades: when a newer driver adopts while this one runs, the keeper asks
// this one to release first: its readers stop between requests (every
// request read is answered), its filesystems close, and only then does the
// newer one serve. Dirty files are not uploaded on the way: their spill
// files pass to the successor through the state region.

// keeperRecord is what the keeper keeps of a mount. It holds credentials:
// memory only, never logged.
type keeperRecord struct {
	Target string
	Spec   MountSpec
}

// adoptConcurrency bounds the mounts adopted at once (each opens a store
// client and replays its state region).
const adoptConcurrency = 8

// UseKeeper makes the mounter give every mount to the keeper listening at
// socket (and take them back with AdoptMounts). The connection is made in
// the background and remade whenever it drops.
func (m *BlobfsMounter) UseKeeper(socket string) {
	m.keeper = handoff.Dial(socket, m.log.With("component", "keeper-client"), m.releaseAll)
}

// hold gives a mount to the keeper. A keeper that does not answer now gets
// it when it does; until then the mount dies with this process.
func (m *BlobfsMounter) hold(target string, lm *liveMount, spec MountSpec) {
	rec, err := json.Marshal(keeperRecord{Target: target, Spec: spec})
	if err != nil {
		m.log.Error("keeper: cannot record the mount; it will not survive a restart", "mountpoint", target, "err", err)
		return
	}
	if err := m.keeper.Hold(target, lm.sess.Fd(), lm.state, rec); err != nil {
		m.log.Warn("keeper: could not hand the mount over yet; it will be when the keeper answers", "mountpoint", target, "err", err)
	}
}

// AdoptedMount is a mount taken back from the keeper.
type AdoptedMount struct {
	Target string
	Spec   MountSpec
}

// AdoptMounts takes over every mount the keeper holds (after the process
// serving them, if one still does, released them) and serves them here. A
// mount that cannot be served is left to the start-up repair. It returns
// the mounts adopted.
func (m *BlobfsMounter) AdoptMounts(ctx context.Context) ([]AdoptedMount, error) {
	if m.keeper == nil {
		return nil, nil
	}
	held, err := m.keeper.Adopt(ctx)
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		adopted []AdoptedMount
	)
	g := new(errgroup.Group)
	g.SetLimit(adoptConcurrency)
	for _, h := range held {
		g.Go(func() error {
			defer h.Fuse.Close()
			start := time.Now()
			am, err := m.adopt(h)
			if err != nil {
				m.log.Error("cannot serve a mount taken back from the keeper; repair will mount it again", "mountpoint", h.Key, "err", err)
				h.State.Close()
				if dropErr := m.keeper.Drop(h.Key); dropErr != nil {
					m.log.Warn("keeper: drop", "mountpoint", h.Key, "err", dropErr)
				}
				return nil
			}
			attrs := []any{"mountpoint", am.Target, "volume", am.Spec.VolumeID, "took", time.Since(start).Round(time.Millisecond)}
			if !h.UnservedSince.IsZero() {
				pause := time.Since(h.UnservedSince)
				attrs = append(attrs, "unserved_for", pause.Round(time.Millisecond))
				if m.metrics != nil {
					m.metrics.ObserveRestartPause(pause)
				}
			}
			m.log.Info("adopted a live mount", attrs...)
			mu.Lock()
			adopted = append(adopted, am)
			mu.Unlock()
			return nil
		})
	}
	g.Wait()
	return adopted, nil
}

// adopt serves one held mount. h.State becomes the mount's; h.Fuse stays
// the caller's (the session gets a dup).
func (m *BlobfsMounter) adopt(h handoff.HeldMount) (AdoptedMount, error) {
	var rec keeperRecord
	if err := json.Unmarshal(h.Record, &rec); err != nil {
		return AdoptedMount{}, fmt.Errorf("mount record: %w", err)
	}
	if rec.Target != h.Key {
		return AdoptedMount{}, fmt.Errorf("mount record is for %q, held as %q", rec.Target, h.Key)
	}
	m.mu.Lock()
	_, busy := m.mounts[rec.Target]
	m.mu.Unlock()
	if busy {
		return AdoptedMount{}, fmt.Errorf("%s is already served by this driver", rec.Target)
	}
	// No store check: the mount is live and its applications wait; a
	// store that fails now fails their requests, as it would have anyway.
	store, vol, err := m.openStore(rec.Spec)
	if err != nil {
		return AdoptedMount{}, err
	}
	fd, err := unix.FcntlInt(h.Fuse.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return AdoptedMount{}, err
	}
	if _, err := m.serve(rec.Target, nil, fd, h.State, store, vol, rec.Spec); err != nil {
		unix.Close(fd)
		return AdoptedMount{}, err
	}
	return AdoptedMount{Target: rec.Target, Spec: rec.Spec}, nil
}

// Released tells whether another driver took the mounts over.
func (m *BlobfsMounter) Released() bool { return m.keeper != nil && m.keeper.Released() }

// releaseAll stops serving every mount, between requests, and closes their
// filesystems: another process adopts them. Called by the keeper client.
func (m *BlobfsMounter) releaseAll() {
	start := time.Now()
	n := m.stopAll()
	m.log.Info("released the mounts to another process", "mounts", n, "took", time.Since(start).Round(time.Millisecond))
}

// stopAll stops every session and waits for their filesystems to close.
func (m *BlobfsMounter) stopAll() int {
	m.mu.Lock()
	live := make([]*liveMount, 0, len(m.mounts))
	for _, lm := range m.mounts {
		live = append(live, lm)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, lm := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lm.sess.Stop()
			<-lm.done
		}()
	}
	wg.Wait()
	return len(live)
}

// Shutdown is the driver's way out. With a keeper, the mounts stay alive
// on its fds for the next driver: dirty data is uploaded (so that a node
// drained for good loses nothing), then the sessions stop between requests.
// Without one, dirty data is uploaded and the mounts die with the process.
func (m *BlobfsMounter) Shutdown(ctx context.Context) error {
	if m.keeper != nil && m.keeper.Released() {
		return nil // another process serves them now
	}
	err := m.SyncAll(ctx)
	if m.keeper != nil {
		m.stopAll()
		m.keeper.Close()
	}
	return err
}
