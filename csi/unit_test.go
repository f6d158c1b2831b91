package csi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/mountopt"
)

func TestVolumeIDFormat(t *testing.T) {
	for _, v := range []volumeID{
		{Account: "myaccount", Container: "pvc-data"},
		{Account: "devstoreaccount1", Container: "c01", Endpoint: "http://127.0.0.1:10000/devstoreaccount1"},
		{Account: "myaccount", Container: "shared", Retain: true},
		{Account: "myaccount", Container: "shared", Endpoint: "https://x.privatelink.blob.core.windows.net/", Retain: true},
	} {
		s := v.String()
		got, err := parseVolumeID(s)
		if err != nil || got != v {
			t.Errorf("parseVolumeID(%q) = %+v, %v; want %+v", s, got, err, v)
		}
	}
	if s := (volumeID{Account: "acct", Container: "data", Retain: true}).String(); s != "blobfs1#acct#data##retain" {
		t.Errorf("retained id = %q", s)
	}
	for _, bad := range []string{
		"", "pvc-123", "blobfs1", "blobfs1#acct", "blobfs2#acct#data", "blobfs1##data", "blobfs1#acct#",
		"blobfs1#ACCT#data", "blobfs1#acct#Data", "blobfs1#acct#da", "blobfs1#acct#data#ftp://x/",
		"blobfs1#acct#data#https://u:p@x/", "blobfs1#acct#data#https://x/?sig=abc", "blobfs1#acct#data##keep",
		"blobfs1#acct#data#https://x/#retain#more",
	} {
		if _, err := parseVolumeID(bad); err == nil {
			t.Errorf("parseVolumeID(%q) accepted a malformed id", bad)
		}
	}
}

func TestContainerNames(t *testing.T) {
	for _, c := range []struct {
		name   string
		params volumeParams
		want   string // exact, or a prefix ending in "-" followed by a hash
	}{
		{"pvc-1234", volumeParams{}, "pvc-1234"},
		{"pvc-1234", volumeParams{PVCName: "data", PVCNamespace: "team-a"}, "team-a-data"},
		{"pvc-1234", volumeParams{PVCName: "data", PVCNamespace: "team-a", ContainerNamePrefix: "k8s"}, "k8s-team-a-data"},
		{"pvc-1234", volumeParams{ContainerName: "fixed"}, "fixed"},
		{"pvc-1234", volumeParams{ContainerName: "${pvc.metadata.namespace}-${pvc.metadata.name}", PVCName: "web.logs", PVCNamespace: "prod"}, "prod-web-logs-"},
		{"Sanity-Volume_Name", volumeParams{}, "sanity-volume-name-"},
		{strings.Repeat("x", 128), volumeParams{}, strings.Repeat("x", 54) + "-"},
		{"a", volumeParams{}, "a-"},
	} {
		got, err := containerNameFor(c.name, c.params)
		if err != nil {
			t.Errorf("%q %+v: %v", c.name, c.params, err)
			continue
		}
		if err := (volumeID{Account: "acc", Container: got}).check(); err != nil {
			t.Errorf("%q gave an invalid container name %q: %v", c.name, got, err)
		}
		if strings.HasSuffix(c.want, "-") && (!strings.HasPrefix(got, c.want) || len(got) != len(c.want)+8) || !strings.HasSuffix(c.want, "-") && got != c.want {
			t.Errorf("container for %q %+v = %q; want %q", c.name, c.params, got, c.want)
		}
	}
	a, _ := containerNameFor("Data", volumeParams{})
	b, _ := containerNameFor("data", volumeParams{})
	if a == b {
		t.Errorf("names differing in case share container %q", a)
	}
	if _, err := containerNameFor("x", volumeParams{ContainerName: "${pod.name}"}); err == nil {
		t.Error("unknown template accepted")
	}
}

func TestMountOptions(t *testing.T) {
	s, err := parseMountOptions([]string{"ro", "--block-cache-mb=64", "-o allow_other=false,uid=1000", "attr-timeout=0", "umask=027", "read-block-mb=8"}, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !s.FS.ReadOnly || !s.Mount.ReadOnly || s.FS.BlockCacheBytes != 64<<20 || s.Mount.AllowOther || s.FS.UID != 1000 ||
		s.FS.AttrTimeout >= 0 || s.FS.Umask != 0o27 || s.FS.ReadBlockSize != 8<<20 {
		t.Errorf("settings = %+v %+v", s.FS, s.Mount)
	}
	want := "allow-other=false attr-timeout=0 block-cache-mb=64 read-block-mb=8 read-only=true uid=1000 umask=027"
	if got := strings.Join(s.Options, " "); got != want {
		t.Errorf("canonical options %q; want %q", got, want)
	}
	// The canonical form parses to the same settings (node state).
	s2, err := parseMountOptions(s.Options, "f")
	if err != nil || strings.Join(s2.Options, " ") != want {
		t.Errorf("re-parse: %v %v", s2.Options, err)
	}
	for opt, want := range map[string]int{"prefetch-files=4": 4, "prefetch-files=0": -1} {
		s, err := parseMountOptions([]string{opt}, "f")
		if err != nil || s.FS.PrefetchFiles != want {
			t.Errorf("%s: PrefetchFiles %d, %v; want %d", opt, s.FS.PrefetchFiles, err, want)
		}
	}
	if s, err := parseMountOptions([]string{"write-back", "write-back-mb=512"}, "f"); err != nil || !s.FS.WriteBack || s.FS.WriteBackBytes != 512<<20 {
		t.Errorf("write-back options: %+v, %v", s.FS, err)
	}
	for opt, off := range map[string]bool{"verify-md5=false": true, "validate_md5=false": true, "verify-md5": false, "--validate-md5=true": false} {
		if s, err := parseMountOptions([]string{opt}, "f"); err != nil || s.FS.NoContentCheck != off {
			t.Errorf("%s: NoContentCheck %v, %v; want %v", opt, s.FS.NoContentCheck, err, off)
		}
	}
	if defaultMountSettings().FS.NoContentCheck {
		t.Error("CSI volumes do not check Content-MD5 by default")
	}
	d := defaultMountSettings()
	if !d.Mount.AllowOther || d.FS.Umask != 0 {
		t.Errorf("CSI defaults: %+v", d)
	}
	for _, bad := range []string{"cache-dir=/x", "local-dir=/", "container=x", "log-file=/etc/passwd", "uid=-1", "umask=999",
		"block-cache-mb=0", "prefetch-files=-1", "attr-timeout=forever", "ro=maybe", "block-cache-mb=8,read-block-mb=8",
		"write-back=sometimes", "write-back-mb=0", "verify-md5=maybe"} {
		if _, err := parseMountOptions([]string{bad}, "f"); err == nil {
			t.Errorf("mount option %q accepted", bad)
		}
	}
}

func TestParamsAndSecrets(t *testing.T) {
	p, err := parseParams(map[string]string{"StorageAccount": "acct", "CONTAINERNAME": "c1c", "server": "acct.privatelink.blob.core.windows.net",
		"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/provisioner-secret-name": "x"}, "parameters")
	if err != nil || p.StorageAccount != "acct" || p.ContainerName != "c1c" || p.PVCName != "data" {
		t.Fatalf("parseParams: %+v, %v", p, err)
	}
	if ep := p.endpoint(); ep != "https://acct.privatelink.blob.core.windows.net/" {
		t.Errorf("endpoint = %q", ep)
	}
	// What the external-provisioner puts into every PV's volumeAttributes;
	// kubelet passes it on to NodeStageVolume and NodePublishVolume.
	if _, err := parseParams(map[string]string{"storageAccount": "acct",
		"storage.kubernetes.io/csiProvisionerIdentity": "1767225600000-8081-blob.csi.blobfs.io"}, "volume_context"); err != nil {
		t.Errorf("the provisioner's identity key was refused: %v", err)
	}
	if _, err := parseParams(map[string]string{"storageAcount": "acct"}, "parameters"); err == nil || !strings.Contains(err.Error(), `"storageAcount"`) {
		t.Errorf("a misspelt parameter: err = %v, want one naming it", err)
	}
	// secretName alone: the namespace is blob-csi-driver's default, the
	// handle's, else the PVC's, else "default".
	for _, c := range []struct {
		params map[string]string
		handle string
		want   string
	}{
		{map[string]string{"secretName": "s"}, "", "default"},
		{map[string]string{"secretName": "s", keyPVCNamespace: "team-a"}, "", "team-a"},
		{map[string]string{"secretName": "s", keyPVCNamespace: "team-a"}, "team-b", "team-b"},
		{map[string]string{"secretName": "s", "secretNamespace": "team-c", keyPVCNamespace: "team-a"}, "team-b", "team-c"},
	} {
		p, err := parseParams(c.params, "parameters")
		if got := p.secretNamespaceFor(c.handle); err != nil || got != c.want {
			t.Errorf("%v, handle namespace %q: secret namespace %q, %v; want %q", c.params, c.handle, got, err, c.want)
		}
	}
	c, err := parseSecrets(map[string]string{secretConnString: "UseDevelopmentStorage=true"}, "secrets")
	if err != nil {
		t.Fatal(err)
	}
	account, endpoint, err := (volumeParams{}).target(c)
	if err != nil || account != blobstore.AzuriteAccount || !strings.HasSuffix(endpoint, "/devstoreaccount1") {
		t.Errorf("target from connection string = %q %q %v", account, endpoint, err)
	}
	cfg, err := azureConfig(volumeID{Account: account, Container: "c01", Endpoint: endpoint}, c, volumeParams{})
	if err != nil || cfg.ConnectionString == "" {
		t.Errorf("azureConfig with a connection string: %v", err)
	}
	cfg, err = azureConfig(volumeID{Account: "acct", Container: "c01"}, credentials{}, volumeParams{IdentityClientID: "abc"})
	if err != nil || cfg.Auth != blobstore.AzureAuthAzureAD || cfg.ClientID != "abc" {
		t.Errorf("no secret should mean Azure AD: %+v %v", cfg, err)
	}
	if _, err := parseSecrets(map[string]string{secretAccountKey: "a", secretSASToken: "b"}, "secrets"); err == nil {
		t.Error("two credentials accepted")
	}
}

func TestFileState(t *testing.T) {
	dir := t.TempDir()
	s, bad, err := OpenFileState(dir)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	rec := VolumeRecord{VolumeID: "blobfs1#acct#data", StagingPath: "/k/plugins/x/globalmount", Account: "acct", Container: "data",
		Auth: "key", CredentialSource: "request", Targets: map[string]TargetRecord{"/k/pods/a/mount": {ReadOnly: true}}}
	if err := s.Put(rec); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(rec.VolumeID)
	got.Targets["/k/pods/b/mount"] = TargetRecord{} // a copy: must not change the store
	if again, _ := s.Get(rec.VolumeID); len(again.Targets) != 1 {
		t.Error("Get returned shared state")
	}
	os.WriteFile(filepath.Join(dir, "garbage.json"), []byte("{"), 0o600)
	os.WriteFile(filepath.Join(dir, ".tmp-left-over"), []byte("x"), 0o600)
	s2, bad, err := OpenFileState(dir)
	if err != nil || len(bad) != 1 {
		t.Fatalf("reopen: %v, bad %v", err, bad)
	}
	r2, ok := s2.Get(rec.VolumeID)
	if !ok || r2.StagingPath != rec.StagingPath || !r2.Targets["/k/pods/a/mount"].ReadOnly {
		t.Errorf("reloaded %+v", r2)
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-left-over")); !os.IsNotExist(err) {
		t.Error("temporary file of an interrupted write kept")
	}
	if err := s2.Delete(rec.VolumeID); err != nil || len(s2.List()) != 0 {
		t.Errorf("delete: %v", err)
	}
}

// TestNodeLifecycleFake runs the node's state machine against the fake
// mounter: idempotency, Aborted on a busy volume, read-only, inline
// volumes, and repair of a dead staging mount.
func TestNodeLifecycleFake(t *testing.T) {
	fc := newFakeContainers()
	fm := newFakeMounter()
	fm.containers = fc
	secrets := fakeSecrets{"team-a/creds": {secretAccountName: blobstore.AzuriteAccount, secretAccountKey: blobstore.AzuriteAccountKey}}
	d := startDriver(t, driverOptions{mounter: fm, containers: fc, secrets: secrets})
	ctx := context.Background()
	params := map[string]string{"storageAccount": blobstore.AzuriteAccount, "secretName": "creds", "secretNamespace": "team-a"}
	vol, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-1", Parameters: params, VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	vctx := vol.GetVolume().GetVolumeContext()
	staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/x/abc/globalmount")
	target := filepath.Join(d.kubelet, "pods/p1/volumes/kubernetes.io~csi/pv/mount")
	os.MkdirAll(staging, 0o750)
	os.MkdirAll(filepath.Dir(target), 0o750)

	// Busy volume: Aborted, and nothing happens.
	d.locks.tryLock(id)
	_, err = d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap(rwx), VolumeContext: vctx})
	if status.Code(err) != codes.Aborted || fm.count() != 0 {
		t.Fatalf("stage of a busy volume: %v (mounts %d)", err, fm.count())
	}
	d.locks.unlock(id)

	for range 3 {
		if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: mountCap(rwx, "block-cache-mb=32"), VolumeContext: vctx}); err != nil {
			t.Fatal(err)
		}
	}
	pub := &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(rwx), Readonly: true, VolumeContext: vctx}
	for range 3 {
		if _, err := d.node.NodePublishVolume(ctx, pub); err != nil {
			t.Fatal(err)
		}
	}
	if fm.count() != 2 {
		t.Fatalf("%d mounts; want staging + target", fm.count())
	}
	pub.Readonly = false
	if _, err := d.node.NodePublishVolume(ctx, pub); status.Code(err) != codes.AlreadyExists {
		t.Errorf("publish again read-write over a read-only target: %v; want AlreadyExists", err)
	}
	rec, _ := d.state.Get(id)
	if rec.CredentialSource != "secret:team-a/creds" || !rec.Targets[target].ReadOnly || strings.Join(rec.MountOptions, ",") != "block-cache-mb=32" {
		t.Errorf("record %+v", rec)
	}
	b, _ := os.ReadFile(filepath.Join(d.cfg.StateDir, stateFileName(id)))
	if strings.Contains(string(b), blobstore.AzuriteAccountKey) {
		t.Fatal("node state on disk holds the account key")
	}

	// The staging mount dies (its server went away): the health check
	// mounts it again with the Secret it can read again and re-binds the
	// target.
	fm.mu.Lock()
	fm.dead[staging], fm.dead[target] = true, true
	fm.mu.Unlock()
	st, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil || !st.GetVolumeCondition().GetAbnormal() {
		t.Errorf("stats of a dead mount: %v, %v; want abnormal", st, err)
	}
	d.forget(id) // as after a restart: no credentials in memory
	d.checkMounts(ctx)
	if s, err := d.statusOf(ctx, "staging", staging); s.State != PathMounted {
		t.Errorf("staging after repair: %v, %v", s.State, err)
	}
	if s, err := d.statusOf(ctx, "target", target); s.State != PathMounted {
		t.Errorf("target after repair: %v, %v", s.State, err)
	}

	if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unstage while published: %v; want FailedPrecondition", err)
	}
	for range 2 {
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	if fm.count() != 0 || len(d.state.List()) != 0 {
		t.Fatalf("left: %d mounts, %d records", fm.count(), len(d.state.List()))
	}

	// An inline volume with a Secret of its pod's namespace.
	itarget := filepath.Join(d.kubelet, "pods/p2/volumes/kubernetes.io~csi/scratch/mount")
	os.MkdirAll(filepath.Dir(itarget), 0o750)
	ipub := &csipb.NodePublishVolumeRequest{VolumeId: "csi-abcdef", TargetPath: itarget, VolumeCapability: mountCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		VolumeContext: map[string]string{keyEphemeral: "true", keyPodNamespace: "team-a",
			"secretName": "creds", "storageAccount": blobstore.AzuriteAccount}}
	parsed, _ := parseVolumeID(id)
	ipub.VolumeContext["containerName"] = parsed.Container
	for range 2 {
		if _, err := d.node.NodePublishVolume(ctx, ipub); err != nil {
			t.Fatalf("inline publish: %v", err)
		}
	}
	if r, ok := d.state.Get("csi-abcdef"); !ok || !r.Ephemeral || fm.count() != 1 {
		t.Fatalf("inline record %+v, %d mounts", r, fm.count())
	}
	if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-abcdef", TargetPath: itarget}); err != nil {
		t.Fatal(err)
	}
	if fm.count() != 0 || len(d.state.List()) != 0 {
		t.Fatalf("inline volume left: %d mounts, %d records", fm.count(), len(d.state.List()))
	}
}

type fakeSecrets map[string]map[string]string

func (f fakeSecrets) GetSecret(ctx context.Context, ns, name string) (map[string]string, error) {
	if s, ok := f[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, ErrSecretNotFound
}

// TestMountOptionTableMatchesNames: the blobfuse options the errors list
// (blobfuseMountOptions) are the ones accepted without effect
// (unchangingMountOptions, with mount(8)'s rw and defaults), and none of
// them is also one of the table's (mountopt), which would never be
// reached.
func TestMountOptionTableMatchesNames(t *testing.T) {
	listed := map[string]bool{"rw": true, "defaults": true}
	for _, n := range blobfuseMountOptions {
		name, _, _ := strings.Cut(n, "=")
		listed[name] = true
	}
	for n := range listed {
		if unchangingMountOptions[n] == nil {
			t.Errorf("mount option %s is listed but not in unchangingMountOptions", n)
		}
	}
	for n := range unchangingMountOptions {
		if !listed[n] {
			t.Errorf("mount option %s is in unchangingMountOptions but not listed in blobfuseMountOptions", n)
		}
		if mountopt.Lookup(n) != nil {
			t.Errorf("mount option %s is in unchangingMountOptions and in mountopt's table", n)
		}
	}
}
