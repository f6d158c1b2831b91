package csi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/blobfs/blobfs/blobstore"
)

// fakeAPI is the Kubernetes API as the driver uses it: Secrets, the
// PersistentVolumes' nodeStageSecretRef, and Warning events on them.
type fakeAPI struct {
	fakeSecrets
	stageRefs map[string]string // volume handle -> "namespace/name"

	mu     sync.Mutex
	events []string // "handle reason"
}

func (a *fakeAPI) StageSecretRef(ctx context.Context, pv PVQuery) (string, string, error) {
	ref, ok := a.stageRefs[pv.VolumeHandle]
	if !ok {
		return "", "", ErrNoStageSecretRef
	}
	ns, name, _ := strings.Cut(ref, "/")
	return ns, name, nil
}

func (a *fakeAPI) WarnVolume(ctx context.Context, pv PVQuery, node, reason, message string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, pv.VolumeHandle+" "+reason)
	return nil
}

func (a *fakeAPI) eventsFor(handle string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, e := range a.events {
		if strings.HasPrefix(e, handle+" ") {
			out = append(out, e)
		}
	}
	return out
}

// TestSelfHealEveryCredentialSource: the driver and its keeper die
// together, so every mount is dead and the credentials the driver kept in
// memory are gone. With no CSI call, the health check mounts each volume
// again with credentials it gets by itself, from wherever they came the
// first time: the Secret named by the volume's secretName, the Secret
// named by its PersistentVolume's nodeStageSecretRef, or the driver's own
// Azure AD identity (a user-assigned one picked by client id, as it was).
// A volume whose credentials only kubelet can give (secrets in the request,
// no PersistentVolume naming them) waits for kubelet, says so with one
// event on its PersistentVolume however many checks run, and is mounted
// again by the next NodeStageVolume that carries them.
func TestSelfHealEveryCredentialSource(t *testing.T) {
	fc := newFakeContainers()
	fc.identity = true
	fm := newFakeMounter()
	fm.containers = fc
	key := map[string]string{secretAccountName: blobstore.AzuriteAccount, secretAccountKey: blobstore.AzuriteAccountKey}
	api := &fakeAPI{
		fakeSecrets: fakeSecrets{"team-a/creds": key, "team-b/stage-creds": key},
		stageRefs:   map[string]string{},
	}
	d := startDriver(t, driverOptions{mounter: fm, containers: fc, secrets: api})
	ctx := context.Background()
	const clientID = "11111111-2222-3333-4444-555555555555"

	type volume struct {
		name       string
		params     map[string]string // StorageClass parameters
		attrs      map[string]string // added to the volume context (a PV's volumeAttributes)
		reqSecrets map[string]string // node-stage secrets kubelet sends
		stageRef   string            // the PV's nodeStageSecretRef, readable through the API
		wantSource string
		wantAuth   string // the Azure config the volume is mounted again with
		selfHeals  bool

		id, staging, target string
		vctx                map[string]string
	}
	vols := []*volume{
		{name: "secret-name", params: map[string]string{"secretName": "creds", "secretNamespace": "team-a"},
			wantSource: "secret:team-a/creds", wantAuth: blobstore.AzureAuthKey, selfHeals: true},
		{name: "stage-secret-ref", reqSecrets: key, stageRef: "team-b/stage-creds",
			wantSource: "request", wantAuth: blobstore.AzureAuthKey, selfHeals: true},
		{name: "identity", attrs: map[string]string{"AzureStorageIdentityClientID": clientID},
			wantSource: "identity", wantAuth: blobstore.AzureAuthAzureAD, selfHeals: true},
		{name: "request-only", reqSecrets: key,
			wantSource: "request", wantAuth: blobstore.AzureAuthKey, selfHeals: false},
	}
	for _, v := range vols {
		params := map[string]string{"storageAccount": blobstore.AzuriteAccount}
		for k, val := range v.params {
			params[k] = val
		}
		resp, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-" + v.name, Parameters: params, Secrets: v.reqSecrets,
			VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
		if err != nil {
			t.Fatalf("%s: CreateVolume: %v", v.name, err)
		}
		v.id, v.vctx = resp.GetVolume().GetVolumeId(), map[string]string{}
		for k, val := range resp.GetVolume().GetVolumeContext() {
			v.vctx[k] = val
		}
		for k, val := range v.attrs {
			v.vctx[k] = val
		}
		if v.stageRef != "" {
			api.stageRefs[v.id] = v.stageRef
		}
		v.staging = filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", v.name, "globalmount")
		v.target = filepath.Join(d.kubelet, "pods/pod-"+v.name, "volumes/kubernetes.io~csi", v.name, "mount")
		for _, p := range []string{v.staging, filepath.Dir(v.target)} {
			if err := os.MkdirAll(p, 0o750); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
			VolumeCapability: mountCap(rwx), VolumeContext: v.vctx, Secrets: v.reqSecrets}); err != nil {
			t.Fatalf("%s: NodeStageVolume: %v", v.name, err)
		}
		if _, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target,
			VolumeCapability: mountCap(rwx), VolumeContext: v.vctx}); err != nil {
			t.Fatalf("%s: NodePublishVolume: %v", v.name, err)
		}
		if rec, _ := d.state.Get(v.id); rec.CredentialSource != v.wantSource {
			t.Errorf("%s: recorded credential source %q, want %q", v.name, rec.CredentialSource, v.wantSource)
		}
	}

	// Keeper and driver gone: every mount dead, no credentials in memory.
	fm.mu.Lock()
	for _, v := range vols {
		fm.dead[v.staging], fm.dead[v.target] = true, true
	}
	fm.mu.Unlock()
	for _, v := range vols {
		d.forget(v.id)
	}
	for range 3 { // several health intervals
		d.checkMounts(ctx)
	}

	mounted := func(v *volume) bool {
		s, _ := d.statusOf(ctx, "staging_target_path", v.staging)
		tg, _ := d.statusOf(ctx, "target_path", v.target)
		return s.State == PathMounted && tg.State == PathMounted
	}
	for _, v := range vols {
		t.Run(v.name, func(t *testing.T) {
			if got := mounted(v); got != v.selfHeals {
				t.Fatalf("staging and target mounted again with no CSI call: %v, want %v", got, v.selfHeals)
			}
			if !v.selfHeals {
				stats, err := d.node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: v.target})
				if err != nil || !stats.GetVolumeCondition().GetAbnormal() || !strings.Contains(stats.GetVolumeCondition().GetMessage(), "waits for kubelet") {
					t.Errorf("volume that waits for kubelet: condition %v, %v; want abnormal, saying it waits for kubelet", stats.GetVolumeCondition(), err)
				}
				waitFor(t, "one VolumeMountLost event", func() bool { return len(api.eventsFor(v.id)) > 0 })
				if ev := api.eventsFor(v.id); len(ev) != 1 || !strings.HasSuffix(ev[0], " VolumeMountLost") {
					t.Errorf("events on the PersistentVolume after 3 health checks: %q, want one VolumeMountLost", ev)
				}
				// kubelet stages it again for a new pod, with the secrets.
				if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
					VolumeCapability: mountCap(rwx), VolumeContext: v.vctx, Secrets: v.reqSecrets}); err != nil {
					t.Fatalf("NodeStageVolume with the secrets: %v", err)
				}
				d.checkMounts(ctx) // binds the old target again
				if !mounted(v) {
					t.Fatalf("not mounted again after NodeStageVolume carried the secrets")
				}
			} else if ev := api.eventsFor(v.id); len(ev) != 0 {
				t.Errorf("a volume that healed by itself got events %q", ev)
			}
			fm.mu.Lock()
			spec := fm.specs[v.staging].Azure
			fm.mu.Unlock()
			if (spec.Auth == blobstore.AzureAuthAzureAD) != (v.wantAuth == blobstore.AzureAuthAzureAD) {
				t.Errorf("mounted again with auth %q, want %q", spec.Auth, v.wantAuth)
			}
			if v.wantAuth == blobstore.AzureAuthAzureAD && spec.ClientID != clientID {
				t.Errorf("mounted again with identity client id %q, want the recorded %q", spec.ClientID, clientID)
			}
			if v.wantAuth == blobstore.AzureAuthKey && spec.Key != blobstore.AzuriteAccountKey {
				t.Errorf("mounted again without the account key (auth %q)", spec.Auth)
			}
		})
	}

	for _, v := range vols {
		if _, err := d.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
			t.Fatal(err)
		}
	}
	if n := fm.count(); n != 0 {
		t.Errorf("%d mounts left: %s", n, fmt.Sprint(fm.mounts))
	}
}

// TestStageSecretLookupSparesTheAPI: two volumes whose credentials came
// with NodeStageVolume lose their mounts, and the Secret their
// PersistentVolumes name holds no credentials, so every repair fails. The
// health check runs 20 times, an interval apart. The driver reads the
// PersistentVolume of the published volume by the name in its pod's
// target path, never by listing them all; it finds the other one (staged
// only: a staging path has no name) by listing them page by page. And it
// asks about each volume only at the backoff's schedule (after 1, 2, 4
// and 8 intervals: 5 times in 20), not at every check; once the volume is
// healthy again, the schedule starts over.
func TestStageSecretLookupSparesTheAPI(t *testing.T) {
	var (
		mu       sync.Mutex
		requests []string
	)
	pv := func(name, handle string) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": name}, "spec": map[string]any{"csi": map[string]any{
			"driver": "blob.csi.blobfs.io", "volumeHandle": handle,
			"nodeStageSecretRef": map[string]any{"name": "no-creds", "namespace": "team-a"}}}}
	}
	handles := map[string]string{} // PV name -> volume handle, set below
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		q := r.URL.Query()
		switch name, byName := strings.CutPrefix(r.URL.Path, "/api/v1/persistentvolumes/"); {
		case r.URL.Path == "/api/v1/persistentvolumes" && q.Get("continue") == "":
			// Page 1: someone else's.
			list := map[string]any{"items": []any{pv("other", "blobfs1#someone#else")}}
			if q.Get("limit") != "" {
				list["metadata"] = map[string]any{"continue": "page2"}
			} else {
				list["items"] = []any{pv("other", "blobfs1#someone#else"), pv("pv-a", handles["pv-a"]), pv("pv-b", handles["pv-b"])}
			}
			json.NewEncoder(w).Encode(list)
		case r.URL.Path == "/api/v1/persistentvolumes" && q.Get("continue") == "page2":
			json.NewEncoder(w).Encode(map[string]any{"items": []any{pv("pv-a", handles["pv-a"]), pv("pv-b", handles["pv-b"])}})
		case byName && handles[name] != "":
			json.NewEncoder(w).Encode(pv(name, handles[name]))
		case r.URL.Path == "/api/v1/namespaces/team-a/secrets/no-creds":
			json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"unrelated": "eA=="}})
		case r.URL.Path == "/api/v1/namespaces/default/events":
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"kind":"Event"}`))
		default:
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	count := func(prefix string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range requests {
			if strings.HasPrefix(r, prefix) {
				n++
			}
		}
		return n
	}

	fc := newFakeContainers()
	fm := newFakeMounter()
	fm.containers = fc
	api := &kubeSecrets{host: srv.URL, hc: srv.Client()}
	d := startDriver(t, driverOptions{mounter: fm, containers: fc, secrets: api})
	now := time.Now()
	const interval = 30 * time.Second
	d.lookups = newAPIBackoff(interval, maxLookupBackoff)
	d.lookups.now = func() time.Time { return now }
	ctx := context.Background()
	key := map[string]string{secretAccountName: blobstore.AzuriteAccount, secretAccountKey: blobstore.AzuriteAccountKey}

	type volume struct{ pv, id, staging, target string }
	vols := []*volume{{pv: "pv-a"}, {pv: "pv-b"}}
	for i, v := range vols {
		resp, err := d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-" + v.pv, Secrets: key,
			Parameters: map[string]string{"storageAccount": blobstore.AzuriteAccount}, VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)}})
		if err != nil {
			t.Fatal(err)
		}
		v.id = resp.GetVolume().GetVolumeId()
		handles[v.pv] = v.id
		v.staging = filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", fmt.Sprintf("%064x", i), "globalmount")
		if err := os.MkdirAll(v.staging, 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
			VolumeCapability: mountCap(rwx), VolumeContext: resp.GetVolume().GetVolumeContext(), Secrets: key}); err != nil {
			t.Fatal(err)
		}
		if v.pv == "pv-a" { // published; pv-b only staged
			v.target = filepath.Join(d.kubelet, "pods/pod-a/volumes/kubernetes.io~csi", v.pv, "mount")
			if err := os.MkdirAll(filepath.Dir(v.target), 0o750); err != nil {
				t.Fatal(err)
			}
			if _, err := d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging,
				TargetPath: v.target, VolumeCapability: mountCap(rwx), VolumeContext: resp.GetVolume().GetVolumeContext()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	die := func() {
		fm.mu.Lock()
		for _, v := range vols {
			fm.dead[v.staging] = true
			if v.target != "" {
				fm.dead[v.target] = true
			}
		}
		fm.mu.Unlock()
		for _, v := range vols {
			d.forget(v.id) // the driver restarted: no credentials in memory
		}
	}
	die()
	const checks = 20
	for range checks {
		d.checkMounts(ctx)
		now = now.Add(interval)
	}
	// One Warning event per volume, each after a lookup of its own, in
	// the background.
	waitFor(t, "an event on each PersistentVolume", func() bool { return count("POST /api/v1/namespaces/default/events") == 2 })
	// Repair lookups at intervals 0, 1, 3, 7 and 15, and the event's.
	const want = 5 + 1
	if n := count("GET /api/v1/persistentvolumes/pv-a"); n != want {
		t.Errorf("the published volume's PersistentVolume was read by name %d times in %d health checks; want %d (5 repairs, 1 event)", n, checks, want)
	}
	if n := count("GET /api/v1/namespaces/team-a/secrets/no-creds"); n != 2*5 {
		t.Errorf("the Secret was read %d times in %d health checks for 2 volumes; want %d", n, checks, 2*5)
	}
	if n := count("GET /api/v1/persistentvolumes?"); n != 2*want { // two pages a lookup
		t.Errorf("%d list requests in %d health checks (only the staged-only volume needs them, 2 pages a lookup); want %d", n, checks, 2*want)
	}
	if n := count("GET /api/v1/persistentvolumes?limit=500"); n != want {
		t.Errorf("%d lists started with a page limit; want %d", n, want)
	}
	if n := count("GET /api/v1/persistentvolumes") - count("GET /api/v1/persistentvolumes?") - count("GET /api/v1/persistentvolumes/"); n != 0 {
		t.Errorf("%d unpaged lists of every PersistentVolume", n)
	}

	// Healthy again (kubelet staged it with the secrets), lost again: the
	// next check asks at once.
	b := vols[1]
	if _, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: b.id, StagingTargetPath: b.staging,
		VolumeCapability: mountCap(rwx), Secrets: key}); err != nil {
		t.Fatal(err)
	}
	before := count("GET /api/v1/persistentvolumes?limit=500")
	die()
	d.checkMounts(ctx)
	// Its repair's lookup and its new event's.
	waitFor(t, "the new events", func() bool { return count("POST /api/v1/namespaces/default/events") == 4 })
	if n := count("GET /api/v1/persistentvolumes?limit=500") - before; n != 2 {
		t.Errorf("a volume healthy again and lost again was looked up %d times at the next check; want 2 (its repair, its event)", n)
	}
}
