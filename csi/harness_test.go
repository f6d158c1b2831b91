package csi

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// testDriver is a driver serving on a unix socket in a temporary kubelet
// directory, with clients connected to it.
type testDriver struct {
	*Driver
	kubelet  string
	endpoint string
	conn     *grpc.ClientConn
	id       csipb.IdentityClient
	ctrl     csipb.ControllerClient
	node     csipb.NodeClient
}

type driverOptions struct {
	mounter    Mounter
	containers Containers
	secrets    SecretGetter
	keyVault   KeyVault
	metrics    string // metrics address
	state      string // state dir; default a temp dir
	logger     *slog.Logger
	// healthInterval runs the periodic health check this often; zero
	// leaves it off, so that tests that do not test it are not raced.
	healthInterval time.Duration
}

// testLogger writes the driver's log to the test log under -v only.
func testLogger(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startDriver runs a driver serving every service until the test ends,
// then checks that nothing is left mounted under its kubelet directory.
func startDriver(t testing.TB, o driverOptions) *testDriver {
	t.Helper()
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.MkdirAll(kubelet, 0o750); err != nil {
		t.Fatal(err)
	}
	if o.state == "" {
		o.state = filepath.Join(dir, "state")
	}
	cfg := Config{
		DriverName:     "blob.csi.blobfs.io",
		Version:        "test",
		Endpoint:       "unix://" + filepath.Join(dir, "csi.sock"),
		Controller:     true,
		Node:           true,
		NodeID:         "node-1",
		KubeletDir:     kubelet,
		StateDir:       o.state,
		CacheDir:       filepath.Join(dir, "cache"),
		MetricsAddress: o.metrics,
		HealthInterval: cmp.Or(o.healthInterval, -1),
		Mounter:        o.mounter,
		Containers:     o.containers,
		Secrets:        o.secrets,
		KeyVault:       o.keyVault,
		Logger:         o.logger,
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	conn, err := grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	td := &testDriver{Driver: d, kubelet: kubelet, endpoint: cfg.Endpoint, conn: conn,
		id: csipb.NewIdentityClient(conn), ctrl: csipb.NewControllerClient(conn), node: csipb.NewNodeClient(conn)}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("driver did not stop")
		}
		if left := mountsUnder(kubelet); len(left) > 0 {
			t.Errorf("left mounted under the kubelet directory: %v", left)
			for i := len(left) - 1; i >= 0; i-- {
				unix.Unmount(left[i], unix.MNT_DETACH)
			}
		}
	})
	// Wait until it answers and has recovered.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := td.id.Probe(context.Background(), &csipb.ProbeRequest{})
		if err == nil && r.GetReady().GetValue() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return td
}

// mountsUnder lists the mount points under dir, from the mount table.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// needFUSE skips a test that mounts for real when it cannot.
func needFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("real mounts need root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
}

// azurite is what the tests need to reach the emulator: the account, the
// endpoint and secrets with its key. Skips without BLOBFS_TEST_AZURITE.
type azurite struct {
	account, endpoint, key string
}

func azuriteEnv(t testing.TB) azurite {
	t.Helper()
	ep := os.Getenv(storetest.EnvAzurite)
	if ep == "" {
		t.Skipf("Azurite tests disabled: set %s", storetest.EnvAzurite)
	}
	key := os.Getenv(storetest.EnvAzuriteKey)
	if key == "" {
		key = blobstore.AzuriteAccountKey
	}
	u, err := url.Parse(ep)
	if err != nil {
		t.Fatalf("%s=%q: %v", storetest.EnvAzurite, ep, err)
	}
	account, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	return azurite{account: account, endpoint: ep, key: key}
}

func (a azurite) secrets() map[string]string {
	return map[string]string{secretAccountName: a.account, secretAccountKey: a.key}
}

func (a azurite) params() map[string]string {
	return map[string]string{"storageAccount": a.account, "server": a.endpoint}
}

// --- fakes ---------------------------------------------------------------

// fakeMounter keeps mounts in a table instead of the kernel. Paths are
// real directories, so that the driver's mkdir and remove run for real,
// and a mount is "made" on the directory the MountPoint opens, as the
// real mounter's: where that directory really is is kept in real, so that
// a test can tell a mount that would have landed outside the kubelet
// directory.
type fakeMounter struct {
	mu     sync.Mutex
	mounts map[string]string // path -> "blobfs:CONTAINER" or "bind:SOURCE"
	real   map[string]string // path -> where the directory mounted on really is
	dead   map[string]bool
	specs  map[string]MountSpec
	// mountErr, when set, is what MountVolume fails with.
	mountErr error
	// containers, when set, is asked whether the container exists and
	// the credentials are right, as the real mounter asks the store.
	containers *fakeContainers
}

func newFakeMounter() *fakeMounter {
	return &fakeMounter{mounts: map[string]string{}, real: map[string]string{}, dead: map[string]bool{}, specs: map[string]MountSpec{}}
}

// mountOn opens mp's directory as the real mounter does, refuses to stack
// a mount, and records the mount. f.mu is held.
func (f *fakeMounter) mountOn(mp *MountPoint, what string) error {
	dir, err := mp.dir()
	if err != nil {
		return err
	}
	defer dir.Close()
	if _, ok := f.mounts[mp.Path]; ok {
		return fmt.Errorf("%s is mounted already: not mounting on top of it", mp.Path)
	}
	real, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()))
	if err != nil {
		return err
	}
	f.mounts[mp.Path] = what
	f.real[mp.Path] = real
	return nil
}

func (f *fakeMounter) MountVolume(ctx context.Context, mp *MountPoint, spec MountSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mountErr != nil {
		return f.mountErr
	}
	if err := spec.Azure.Validate(); err != nil {
		return err
	}
	if f.containers != nil {
		if err := f.containers.Check(ctx, spec.Azure); err != nil {
			return err
		}
	}
	if err := f.mountOn(mp, "blobfs:"+spec.Azure.Container); err != nil {
		return err
	}
	f.specs[mp.Path] = spec
	return nil
}

func (f *fakeMounter) UnmountVolume(ctx context.Context, mp *MountPoint) error {
	return f.Unmount(mp)
}

func (f *fakeMounter) BindMount(source, target *MountPoint, readOnly bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mounts[source.Path]; !ok {
		return fmt.Errorf("bind source %s is not mounted", source.Path)
	}
	return f.mountOn(target, "bind:"+source.Path)
}

func (f *fakeMounter) Unmount(mp *MountPoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mounts, mp.Path)
	delete(f.real, mp.Path)
	delete(f.dead, mp.Path)
	delete(f.specs, mp.Path)
	return nil
}

func (f *fakeMounter) Status(ctx context.Context, mp *MountPoint) PathStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mounts[mp.Path]; ok {
		if f.dead[mp.Path] {
			return PathStatus{State: PathCorrupted, Err: unix.ENOTCONN}
		}
		return PathStatus{State: PathMounted}
	}
	switch k, _, err := mp.kind(); {
	case err != nil:
		return PathStatus{State: PathCorrupted, Err: err}
	case k == kindMissing:
		return PathStatus{State: PathMissing}
	case k == kindSymlink:
		return PathStatus{State: PathSymlink}
	}
	return PathStatus{State: PathNotMounted}
}

// outside lists the fake mounts whose directory is not inside dir.
func (f *fakeMounter) outside(dir string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p, real := range f.real {
		if !strings.HasPrefix(real, dir+"/") {
			out = append(out, p+" -> "+real)
		}
	}
	return out
}

func (f *fakeMounter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mounts)
}

// fakeContainers is an in-memory blob service with one valid key, and
// optionally one valid SAS token and a working Azure AD identity.
type fakeContainers struct {
	mu       sync.Mutex
	key      string
	sas      string          // accepted SAS token; "" accepts none
	identity bool            // Azure AD sign-in works
	have     map[string]bool // account/container
}

func newFakeContainers() *fakeContainers {
	return &fakeContainers{key: blobstore.AzuriteAccountKey, have: map[string]bool{}}
}

func (f *fakeContainers) auth(cfg blobstore.AzureConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	sas, identity := f.sas, f.identity
	f.mu.Unlock()
	switch {
	case cfg.Key == f.key:
	case sas != "" && cfg.SASToken == sas:
	case identity && cfg.Auth == blobstore.AzureAuthAzureAD:
	default:
		return fmt.Errorf("fake: %w", blobstore.ErrUnauthorized)
	}
	return nil
}

func (f *fakeContainers) Create(ctx context.Context, cfg blobstore.AzureConfig) error {
	if err := f.auth(cfg); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.have[cfg.Account+"/"+cfg.Container] = true
	return nil
}

func (f *fakeContainers) Delete(ctx context.Context, cfg blobstore.AzureConfig) error {
	if err := f.auth(cfg); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.have, cfg.Account+"/"+cfg.Container)
	return nil
}

func (f *fakeContainers) Check(ctx context.Context, cfg blobstore.AzureConfig) error {
	if err := f.auth(cfg); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.have[cfg.Account+"/"+cfg.Container] {
		return fmt.Errorf("fake container %s: %w", cfg.Container, blobstore.ErrNotFound)
	}
	return nil
}

// mountCap is a mount capability with the given access mode.
func mountCap(mode csipb.VolumeCapability_AccessMode_Mode, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwx = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER

// TestSocketTakeover: a second driver on the same socket path (the new pod
// of a surge update) takes the name over, and the first one, stopping
// later, leaves the second one's socket alone.
func TestSocketTakeover(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	run := func() (context.CancelFunc, chan error) {
		d, err := New(Config{Endpoint: "unix://" + sock, Controller: true, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		return cancel, done
	}
	waitSock := func() os.FileInfo {
		for range 500 {
			if fi, err := os.Stat(sock); err == nil {
				return fi
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("no socket")
		return nil
	}
	stop1, done1 := run()
	first := waitSock()
	stop2, done2 := run()
	var second os.FileInfo
	for range 500 {
		if fi, err := os.Stat(sock); err == nil && !os.SameFile(fi, first) {
			second = fi
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if second == nil {
		t.Fatal("second driver did not take the socket over")
	}
	stop1()
	<-done1
	if fi, err := os.Stat(sock); err != nil || !os.SameFile(fi, second) {
		t.Fatalf("the old driver removed the new one's socket: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csipb.NewIdentityClient(conn).GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{}); err != nil {
		t.Fatalf("new driver does not answer: %v", err)
	}
	stop2()
	<-done2
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after the last driver stopped: %v", err)
	}
}
