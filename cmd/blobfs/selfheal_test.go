package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// fakeAPIServer answers what the driver asks the Kubernetes API for when
// it repairs a volume: the PersistentVolumes (one, whose nodeStageSecretRef
// names a Secret) and that Secret; it takes events. It returns a
// kubeconfig for it and the requests so far ("METHOD PATH", and the body
// of a POST after a space).
func fakeAPIServer(t *testing.T, volumeHandle string, secret map[string]string) (kubeconfig string, requests func() []string) {
	t.Helper()
	const token = "test-token"
	var (
		mu  sync.Mutex
		log []string
	)
	data := map[string]string{}
	for k, v := range secret {
		data[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entry := r.Method + " " + r.URL.Path
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			entry += " " + string(b)
		}
		mu.Lock()
		log = append(log, entry)
		mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/persistentvolumes":
			json.NewEncoder(w).Encode(map[string]any{"kind": "PersistentVolumeList", "items": []any{
				map[string]any{"metadata": map[string]any{"name": "other"}, "spec": map[string]any{"csi": map[string]any{
					"driver": "blob.csi.blobfs.io", "volumeHandle": "blobfs1#someone#else",
					"nodeStageSecretRef": map[string]any{"name": "wrong", "namespace": "default"}}}},
				map[string]any{"metadata": map[string]any{"name": "pv-data"}, "spec": map[string]any{"csi": map[string]any{
					"driver": "blob.csi.blobfs.io", "volumeHandle": volumeHandle,
					"nodeStageSecretRef": map[string]any{"name": "azure-creds", "namespace": "team-a"}}}},
			}})
		case "/api/v1/namespaces/team-a/secrets/azure-creds":
			json.NewEncoder(w).Encode(map[string]any{"kind": "Secret", "data": data})
		case "/api/v1/namespaces/default/events":
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"kind":"Event"}`))
		default:
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: test
contexts:
- name: test
  context: {cluster: test, user: driver}
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: driver
  user: {token: %s}
`, srv.URL, base64.StdEncoding.EncodeToString(ca), token)
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), log...)
	}
}

// TestSelfHealFromStageSecretRef: the keeper and the driver die together,
// so the volume's mounts die; its credentials came with NodeStageVolume
// (from the PV's nodeStageSecretRef) and are stored nowhere. The restarted
// driver, with API access, reads them again through the PV, and the
// staging mount and the pod's target work again with no CSI call at all.
func TestSelfHealFromStageSecretRef(t *testing.T) {
	r, target := newPublishedRig(t)
	kubeconfig, requests := fakeAPIServer(t, r.volumeID, r.secrets())
	r.killBoth(target)
	start := time.Now()
	r.startKeeper()
	r.startDriver("--kubeconfig=" + kubeconfig)
	deadline := start.Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(target, "kept.txt")); err == nil && string(b) == "still here" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target was not repaired within 30 s without a CSI call; API requests: %q", requests())
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("target works again %v after the driver and keeper were started", time.Since(start).Round(time.Millisecond))
	// New files through the repaired target reach the store.
	if err := os.WriteFile(filepath.Join(target, "after.txt"), []byte("after repair"), 0o644); err != nil {
		t.Fatalf("write after repair: %v", err)
	}
	got := strings.Join(requests(), "\n")
	if !strings.Contains(got, "GET /api/v1/persistentvolumes") || !strings.Contains(got, "GET /api/v1/namespaces/team-a/secrets/azure-creds") {
		t.Errorf("the driver did not read the PV and its Secret:\n%s", got)
	}
	if b, _ := os.ReadFile(r.driverLog.Name()); !strings.Contains(string(b), "nodeStageSecretRef") {
		t.Error("the driver's log does not say where the credentials came from")
	}
	r.teardown(target)
	if c := r.storeContent(); c["after.txt"] == "" || c["kept.txt"] == "" {
		t.Errorf("store after teardown: %v", c)
	}
}

// TestLostMountEventOnPV: the keeper and the driver die together and the
// restarted driver cannot get the volume's credentials again (the Secret
// its PersistentVolume names holds none): it says so with one Warning
// event on the PersistentVolume, where kubectl describe pv shows it, not
// one per health check; the volume is reported abnormal, and kubelet's
// next NodePublishVolume with the credentials repairs it.
func TestLostMountEventOnPV(t *testing.T) {
	r, target := newPublishedRig(t)
	kubeconfig, requests := fakeAPIServer(t, r.volumeID, map[string]string{"unrelated": "x"})
	r.killBoth(target)
	r.startKeeper()
	r.startDriver("--kubeconfig=" + kubeconfig)
	time.Sleep(3500 * time.Millisecond) // health checks every second here
	var events []string
	for _, req := range requests() {
		if strings.HasPrefix(req, "POST /api/v1/namespaces/default/events ") {
			events = append(events, strings.TrimPrefix(req, "POST /api/v1/namespaces/default/events "))
		}
	}
	if len(events) != 1 {
		t.Fatalf("%d events posted in 3.5 s of failed repairs; want 1: %q", len(events), events)
	}
	var ev struct {
		Type, Reason, Message string
		InvolvedObject        struct{ Kind, Name string }
	}
	if err := json.Unmarshal([]byte(events[0]), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != "Warning" || ev.Reason != "VolumeMountLost" || ev.InvolvedObject.Kind != "PersistentVolume" || ev.InvolvedObject.Name != "pv-data" ||
		!strings.Contains(ev.Message, "cannot be mounted again") {
		t.Errorf("event %+v; want a Warning VolumeMountLost on PersistentVolume pv-data that says why", ev)
	}
	stats, err := r.node.NodeGetVolumeStats(context.Background(), &csipb.NodeGetVolumeStatsRequest{VolumeId: r.volumeID, VolumePath: target})
	if err != nil || !stats.GetVolumeCondition().GetAbnormal() {
		t.Errorf("a volume that cannot be repaired is reported %v, %v; want abnormal", stats.GetVolumeCondition(), err)
	}
	target2, err := r.publish("pod-b", r.secrets())
	if err != nil {
		t.Fatalf("NodePublishVolume with the credentials: %v", err)
	}
	r.teardown(target, target2)
}

// linesContaining returns the lines of s that contain sub.
func linesContaining(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
