package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Symlinks below the kubelet directory (issue 14, item 2). Someone who can
// write there swaps a directory on a staging or target path for a symlink
// to a directory outside. The driver must refuse the request naming the
// field, mount nothing outside the kubelet directory, never stack mounts
// while the health check runs, and answer unpublish and unstage promptly.
// Each case runs on the fake mounter and on real mounts (root, /dev/fuse,
// Azurite); the real one reads /proc/self/mountinfo.

// healthEvery is the health check's interval in these tests: several
// rounds pass during settle.
const healthEvery = 50 * time.Millisecond

// prompt bounds an unpublish or unstage: the unstage hung until
// the client's deadline (symlinkCall's, 30 s).
const prompt = 15 * time.Second

// symlinkScene is one volume's paths in a driver's kubelet directory, and a
// directory outside it that symlinks point into.
type symlinkScene struct {
	d       *testDriver
	handle  string
	vctx    map[string]string
	secrets map[string]string
	staging string
	podDir  string
	target  string
	outside string
}

func newSymlinkScene(t *testing.T, b backend) *symlinkScene {
	t.Helper()
	d, az := b.start(t, driverOptions{healthInterval: healthEvery})
	ctx := context.Background()
	name := sha256.Sum256([]byte(t.Name()))
	vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-" + hex.EncodeToString(name[:8]),
		Parameters: az.params(), Secrets: az.secrets(), VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	handle := vol.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		d.ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: handle, Secrets: az.secrets()})
	})
	sum := sha256.Sum256([]byte(handle))
	s := &symlinkScene{
		d: d, handle: handle, vctx: vol.GetVolume().GetVolumeContext(), secrets: az.secrets(),
		staging: filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", hex.EncodeToString(sum[:]), "globalmount"),
		podDir:  filepath.Join(d.kubelet, "pods/7c1d2b4e-pod-a"),
		outside: filepath.Join(filepath.Dir(d.kubelet), "outside"),
	}
	s.target = filepath.Join(s.podDir, "volumes/kubernetes.io~csi/pv/mount")
	// kubelet makes the staging directory and the target's parent.
	for _, p := range []string{s.staging, filepath.Dir(s.target), s.outside} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever a broken driver mounted outside must not outlive the test.
	t.Cleanup(func() {
		for _, m := range mountsUnder(s.outside) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	return s
}

// symlink replaces the directory at link (below the kubelet directory) by
// a symlink to a directory outside, in which the rest of path exists, so
// that following the symlink would work. It returns where path then leads.
func (s *symlinkScene) symlink(t *testing.T, link, path string) string {
	t.Helper()
	rel, err := filepath.Rel(link, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		t.Fatalf("%s is not below %s", path, link)
	}
	dest := filepath.Join(s.outside, filepath.Base(link))
	if err := os.MkdirAll(filepath.Join(dest, rel), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(link); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dest, link); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dest, rel)
}

func (s *symlinkScene) stage(ctx context.Context) error {
	_, err := s.d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: s.handle, StagingTargetPath: s.staging,
		VolumeCapability: mountCap(rwx), VolumeContext: s.vctx, Secrets: s.secrets})
	return err
}

func (s *symlinkScene) publish(ctx context.Context) error {
	_, err := s.d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: s.handle, StagingTargetPath: s.staging,
		TargetPath: s.target, VolumeCapability: mountCap(rwx), VolumeContext: s.vctx})
	return err
}

func (s *symlinkScene) unpublish(ctx context.Context) error {
	_, err := s.d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: s.handle, TargetPath: s.target})
	return err
}

func (s *symlinkScene) unstage(ctx context.Context) error {
	_, err := s.d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: s.handle, StagingTargetPath: s.staging})
	return err
}

// symlinkCall runs one RPC the way kubelet does, with a deadline, again
// while it is Aborted (the health check, running every healthEvery, holds
// the volume now and then), and fails the test if it takes longer than
// prompt.
func symlinkCall(t *testing.T, what string, call func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	err := call(ctx)
	for status.Code(err) == codes.Aborted && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		err = call(ctx)
	}
	if took := time.Since(start); took > prompt {
		t.Errorf("%s took %v (%v); want an answer within %v", what, took.Round(time.Millisecond), err, prompt)
	}
	return err
}

// wantRefused checks a refusal: InvalidArgument naming the field and the
// symlink.
func wantRefused(t *testing.T, what string, err error, field string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), field) || !strings.Contains(st.Message(), "symlink") {
		t.Errorf("%s: %v %q; want InvalidArgument naming %s and the symlink", what, st.Code(), st.Message(), field)
	}
}

// settle lets the health check run several rounds (its loop, and three
// rounds run here so that they surely happen).
func (s *symlinkScene) settle() {
	time.Sleep(10 * healthEvery)
	for range 3 {
		s.d.checkMounts(context.Background())
	}
}

// checkContained fails the test if anything is mounted outside the kubelet
// directory or any mount is stacked on another at the same path.
func (s *symlinkScene) checkContained(t *testing.T) {
	t.Helper()
	if fm, ok := s.d.mounter.(interface{ outside(string) []string }); ok {
		if out := fm.outside(s.d.kubelet); len(out) > 0 {
			t.Errorf("mounted outside the kubelet directory: %v", out)
		}
		return
	}
	if out := mountsUnder(s.outside); len(out) > 0 {
		t.Errorf("mounted outside the kubelet directory (mountinfo): %v", out)
	}
	seen := map[string]int{}
	for _, m := range mountsUnder(filepath.Dir(s.d.kubelet)) {
		seen[m]++
	}
	for m, n := range seen {
		if n > 1 {
			t.Errorf("%d mounts stacked at %s", n, m)
		}
	}
}

// detach removes a mount the test made or moved, as an administrator
// would: real mounts from the kernel, fake ones from the table.
func (s *symlinkScene) detach(t *testing.T, path string) {
	t.Helper()
	if fm, ok := s.d.mounter.(*fakeMounter); ok {
		fm.mu.Lock()
		defer fm.mu.Unlock()
		for p := range fm.mounts {
			if p == path || strings.HasPrefix(p, path+"/") {
				delete(fm.mounts, p)
				delete(fm.real, p)
			}
		}
		return
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatalf("detach %s: %v", path, err)
	}
}

// TestSymlinkedPathsRefused: a request whose staging or target path is, or
// passes through, a symlink out of the kubelet directory is refused with
// InvalidArgument naming the field; nothing is mounted outside, no mount
// stacks while the health check runs, and unpublish/unstage of that path
// answer promptly, follow nothing and remove nothing outside.
func TestSymlinkedPathsRefused(t *testing.T) {
	cases := []struct {
		name  string
		rpc   string                       // the refused request: stage or publish
		link  func(s *symlinkScene) string // what becomes a symlink
		path  func(s *symlinkScene) string // the request's path
		field string
	}{
		{"pod directory", "publish", func(s *symlinkScene) string { return s.podDir }, func(s *symlinkScene) string { return s.target }, "target_path"},
		{"pod's volumes directory", "publish", func(s *symlinkScene) string { return filepath.Join(s.podDir, "volumes") }, func(s *symlinkScene) string { return s.target }, "target_path"},
		{"target itself", "publish", func(s *symlinkScene) string { return s.target }, func(s *symlinkScene) string { return s.target }, "target_path"},
		{"staging path itself", "stage", func(s *symlinkScene) string { return s.staging }, func(s *symlinkScene) string { return s.staging }, "staging_target_path"},
		{"volume directory above the staging path", "stage", func(s *symlinkScene) string { return filepath.Dir(s.staging) }, func(s *symlinkScene) string { return s.staging }, "staging_target_path"},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					s := newSymlinkScene(t, b)
					if c.rpc == "publish" {
						if err := symlinkCall(t, "NodeStageVolume", s.stage); err != nil {
							t.Fatalf("NodeStageVolume: %v", err)
						}
					}
					dest := s.symlink(t, c.link(s), c.path(s))
					for i := range 2 { // kubelet retries
						var err error
						if c.rpc == "stage" {
							err = symlinkCall(t, "NodeStageVolume", s.stage)
						} else {
							err = symlinkCall(t, "NodePublishVolume", s.publish)
						}
						wantRefused(t, fmt.Sprintf("%s (try %d)", c.rpc, i+1), err, c.field)
					}
					s.settle()
					s.checkContained(t)

					// Unpublish/unstage of the refused path: refused as
					// well, promptly, and what the symlink leads to is
					// left as it was.
					if c.rpc == "publish" {
						wantRefused(t, "NodeUnpublishVolume", symlinkCall(t, "NodeUnpublishVolume", s.unpublish), c.field)
						if err := symlinkCall(t, "NodeUnstageVolume", s.unstage); err != nil {
							t.Errorf("NodeUnstageVolume of the (real) staging path: %v", err)
						}
					} else {
						wantRefused(t, "NodeUnstageVolume", symlinkCall(t, "NodeUnstageVolume", s.unstage), c.field)
					}
					if fi, err := os.Stat(dest); err != nil || !fi.IsDir() {
						t.Errorf("%s, where the symlink leads, was touched: %v", dest, err)
					}
					if fi, err := os.Lstat(c.link(s)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
						t.Errorf("the symlink %s was not left alone: %v", c.link(s), err)
					}
					s.checkContained(t)
					if left := mountsUnder(s.d.kubelet); len(left) > 0 {
						t.Errorf("still mounted under the kubelet directory: %v", left)
					}
					if recs := s.d.state.List(); len(recs) != 0 {
						t.Errorf("node state still has %+v", recs)
					}
				})
			}
		})
	}
}

// TestSymlinkedAfterMount: a path is swapped for a symlink after the
// volume was mounted there. The health check must not follow it (the
// issue's driver bind-mounted through it every round: six stacked mounts
// outside after three minutes), unpublish must refuse it promptly, and
// unstage must not hang on a mount of the volume that it cannot reach.
func TestSymlinkedAfterMount(t *testing.T) {
	cases := []struct {
		name string
		// swap replaces a path by a symlink, the way the case says.
		swap func(t *testing.T, s *symlinkScene)
		// published: the target was published (and is then unpublished).
		published bool
		// unstage is what NodeUnstageVolume must answer afterwards.
		unstage codes.Code
	}{
		{"pod directory moved away and replaced", func(t *testing.T, s *symlinkScene) {
			// The bind mount goes with the moved directory: the volume
			// stays mounted there, out of the driver's reach.
			moved := s.podDir + ".moved"
			if err := os.Rename(s.podDir, moved); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(moved) })
			s.symlink(t, s.podDir, s.target)
			if fm, ok := s.d.mounter.(*fakeMounter); ok {
				// The fake's table is by path: move the mount too.
				fm.mu.Lock()
				fm.mounts[strings.Replace(s.target, s.podDir, moved, 1)] = fm.mounts[s.target]
				delete(fm.mounts, s.target)
				fm.mu.Unlock()
			}
			t.Cleanup(func() {
				if fm, ok := s.d.mounter.(*fakeMounter); ok {
					fm.mu.Lock()
					delete(fm.mounts, strings.Replace(s.target, s.podDir, moved, 1))
					fm.mu.Unlock()
				}
			})
		}, true, codes.OK},
		{"target replaced after its mount went", func(t *testing.T, s *symlinkScene) {
			s.detach(t, s.target)
			s.symlink(t, s.target, s.target)
		}, true, codes.OK},
		{"staging path replaced after its mount went", func(t *testing.T, s *symlinkScene) {
			s.detach(t, s.staging)
			s.symlink(t, s.staging, s.staging)
		}, false, codes.InvalidArgument},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					s := newSymlinkScene(t, b)
					if err := symlinkCall(t, "NodeStageVolume", s.stage); err != nil {
						t.Fatalf("NodeStageVolume: %v", err)
					}
					if c.published {
						if err := symlinkCall(t, "NodePublishVolume", s.publish); err != nil {
							t.Fatalf("NodePublishVolume: %v", err)
						}
					}
					// The swap holds the volume's lock, as an RPC would: a
					// health check in between would find the path
					// unmounted and not yet a symlink, and mount it again.
					for deadline := time.Now().Add(30 * time.Second); !s.d.locks.tryLock(s.handle); time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatal("the volume stayed locked for 30 s before the swap")
						}
					}
					c.swap(t, s)
					s.d.locks.unlock(s.handle)
					s.settle()
					s.checkContained(t)
					if rec, ok := s.d.state.Get(s.handle); ok && len(rec.Targets) > 0 {
						t.Errorf("the health check kept the symlinked target in the record: %+v", rec.Targets)
					}

					if c.published {
						wantRefused(t, "NodeUnpublishVolume", symlinkCall(t, "NodeUnpublishVolume", s.unpublish), "target_path")
					}
					err := symlinkCall(t, "NodeUnstageVolume", s.unstage)
					if c.unstage == codes.OK && err != nil {
						t.Errorf("NodeUnstageVolume: %v", err)
					} else if c.unstage != codes.OK {
						wantRefused(t, "NodeUnstageVolume", err, "staging_target_path")
					}
					s.settle()
					s.checkContained(t)
					if recs := s.d.state.List(); len(recs) != 0 {
						t.Errorf("node state still has %+v", recs)
					}
					// What is left is the mount that moved with the pod
					// directory: an administrator's to remove.
					for _, m := range mountsUnder(s.d.kubelet) {
						if !strings.Contains(m, ".moved/") {
							t.Errorf("still mounted under the kubelet directory: %s", m)
						}
						s.detach(t, m)
					}
				})
			}
		})
	}
}
