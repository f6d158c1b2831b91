package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const testDriver = "blobfs.test.csi"

// fakeCSI is a driver that records what it is asked.
type fakeCSI struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer

	mu      sync.Mutex
	ready   *wrapperspb.BoolValue // nil: Probe leaves Ready unset
	creates []*csipb.CreateVolumeRequest
	deletes []*csipb.DeleteVolumeRequest
}

func (f *fakeCSI) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: testDriver, VendorVersion: "test"}, nil
}

func (f *fakeCSI) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &csipb.ProbeResponse{Ready: f.ready}, nil
}

func (f *fakeCSI) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{
		VolumeId: "account#" + req.GetName(), CapacityBytes: 2 << 30,
		VolumeContext: map[string]string{"container": "c-" + req.GetName()},
	}}, nil
}

func (f *fakeCSI) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deletes = append(f.deletes, req)
	return &csipb.DeleteVolumeResponse{}, nil
}

// startCSI serves a fakeCSI on a unix socket; stop takes it away again.
func startCSI(t *testing.T) (f *fakeCSI, sock string, stop func()) {
	t.Helper()
	// Short: a unix socket path is limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock = filepath.Join(dir, "csi.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f = &fakeCSI{}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, f)
	csipb.RegisterControllerServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { srv.Stop(); os.Remove(sock) }) }
	t.Cleanup(stop)
	return f, sock, stop
}

func dialTest(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := dialCSI(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// fakeAPI is an API server holding a few objects in maps.
type fakeAPI struct {
	mu       sync.Mutex
	token    string
	classes  map[string]storagev1.StorageClass
	claims   map[string]corev1.PersistentVolumeClaim // namespace/name
	volumes  map[string]corev1.PersistentVolume
	secrets  map[string]corev1.Secret // namespace/name
	posted   []corev1.PersistentVolume
	deleted  []string
	conflict map[string]bool // PV names whose POST is answered 409
}

func status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		status(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	path := r.URL.Path
	switch {
	case r.Method == http.MethodGet && path == "/apis/storage.k8s.io/v1/storageclasses":
		reply(storagev1.StorageClassList{Items: slices.Collect(maps.Values(a.classes))})
	case r.Method == http.MethodGet && path == "/api/v1/persistentvolumeclaims":
		reply(corev1.PersistentVolumeClaimList{Items: slices.Collect(maps.Values(a.claims))})
	case r.Method == http.MethodGet && path == "/api/v1/persistentvolumes":
		reply(corev1.PersistentVolumeList{Items: slices.Collect(maps.Values(a.volumes))})
	case r.Method == http.MethodPost && path == "/api/v1/persistentvolumes":
		var pv corev1.PersistentVolume
		if err := json.NewDecoder(r.Body).Decode(&pv); err != nil {
			status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		a.posted = append(a.posted, pv)
		if _, ok := a.volumes[pv.Name]; ok || a.conflict[pv.Name] {
			status(w, http.StatusConflict, metav1.StatusReasonAlreadyExists, `persistentvolumes "`+pv.Name+`" already exists`)
			return
		}
		a.volumes[pv.Name] = pv
		w.WriteHeader(http.StatusCreated)
		reply(pv)
	case r.Method == http.MethodDelete && strings.HasPrefix(path, "/api/v1/persistentvolumes/"):
		name := strings.TrimPrefix(path, "/api/v1/persistentvolumes/")
		if _, ok := a.volumes[name]; !ok {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound, `persistentvolumes "`+name+`" not found`)
			return
		}
		delete(a.volumes, name)
		a.deleted = append(a.deleted, name)
		reply(metav1.Status{Status: metav1.StatusSuccess})
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/api/v1/namespaces/"):
		// /api/v1/namespaces/NS/secrets/NAME
		parts := strings.Split(strings.TrimPrefix(path, "/api/v1/namespaces/"), "/")
		if len(parts) != 3 || parts[1] != "secrets" {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path")
			return
		}
		s, ok := a.secrets[parts[0]+"/"+parts[2]]
		if !ok {
			status(w, http.StatusNotFound, metav1.StatusReasonNotFound, `secrets "`+parts[2]+`" not found`)
			return
		}
		reply(s)
	default:
		status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path")
	}
}

// startAPI serves a fakeAPI over TLS and returns a client for it set up
// as in a pod: CA and token files.
func startAPI(t *testing.T) (*fakeAPI, *kubeAPI) {
	t.Helper()
	a := &fakeAPI{token: "token-1", classes: map[string]storagev1.StorageClass{}, claims: map[string]corev1.PersistentVolumeClaim{},
		volumes: map[string]corev1.PersistentVolume{}, secrets: map[string]corev1.Secret{}, conflict: map[string]bool{}}
	srv := httptest.NewTLSServer(a)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(a.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := newKubeAPI(srv.URL, tok, ca)
	if err != nil {
		t.Fatal(err)
	}
	return a, k
}

// logBuffer collects log lines from the code under test.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	t  *testing.T
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type setup struct {
	csi  *fakeCSI
	api  *fakeAPI
	p    *provisioner
	logs *logBuffer
}

func newSetup(t *testing.T, extraMetadata bool) *setup {
	t.Helper()
	f, sock, _ := startCSI(t)
	a, k := startAPI(t)
	conn := dialTest(t, sock)
	logs := &logBuffer{t: t}
	log := newLogger(logs, 4, "csi-provisioner")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name, err := driverName(ctx, csipb.NewIdentityClient(conn), time.Second, log)
	if err != nil || name != testDriver {
		t.Fatalf("driverName: %q, %v", name, err)
	}
	p := newProvisioner(k, csipb.NewControllerClient(conn), name,
		provisionerFlags{timeout: 5 * time.Second, extraMetadata: extraMetadata}, log)
	return &setup{csi: f, api: a, p: p, logs: logs}
}

func (s *setup) round(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s.p.round(ctx)
}

func class(name, provisioner string, params map[string]string, reclaim corev1.PersistentVolumeReclaimPolicy) storagev1.StorageClass {
	return storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner,
		Parameters: params, ReclaimPolicy: &reclaim, MountOptions: []string{"allow_other"}}
}

func claim(ns, name, uid, class string) corev1.PersistentVolumeClaim {
	return corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

func secret(ns, name string, data map[string]string) corev1.Secret {
	s := corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func TestProvision(t *testing.T) {
	s := newSetup(t, true)
	s.api.classes["ours"] = class("ours", testDriver, map[string]string{
		"account":   "acct",
		"container": "data",
		"csi.storage.k8s.io/provisioner-secret-name":      "prov",
		"csi.storage.k8s.io/provisioner-secret-namespace": "kube-system",
		"csi.storage.k8s.io/node-stage-secret-name":       "stage",
		"csi.storage.k8s.io/node-stage-secret-namespace":  "kube-system",
		"csi.storage.k8s.io/fstype":                       "fuse",
	}, corev1.PersistentVolumeReclaimRetain)
	s.api.classes["theirs"] = class("theirs", "other.csi.example.com", nil, corev1.PersistentVolumeReclaimDelete)
	s.api.claims["app/data"] = claim("app", "data", "1234", "ours")
	s.api.claims["app/foreign"] = claim("app", "foreign", "5678", "theirs")
	s.api.secrets["kube-system/prov"] = secret("kube-system", "prov", map[string]string{"accountkey": "k1"})

	s.round(t)

	if len(s.csi.creates) != 1 {
		t.Fatalf("CreateVolume calls: %d, want 1 (the other provisioner's claim is not ours)", len(s.csi.creates))
	}
	req := s.csi.creates[0]
	if req.GetName() != "pvc-1234" {
		t.Errorf("volume name %q", req.GetName())
	}
	wantParams := map[string]string{
		"account": "acct", "container": "data",
		"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pvc/namespace": "app", "csi.storage.k8s.io/pv/name": "pvc-1234",
	}
	if !maps.Equal(req.GetParameters(), wantParams) {
		t.Errorf("parameters %v, want %v", req.GetParameters(), wantParams)
	}
	if !maps.Equal(req.GetSecrets(), map[string]string{"accountkey": "k1"}) {
		t.Errorf("secrets %v", req.GetSecrets())
	}
	if req.GetCapacityRange().GetRequiredBytes() != 1<<30 {
		t.Errorf("required bytes %d", req.GetCapacityRange().GetRequiredBytes())
	}
	if c := req.GetVolumeCapabilities(); len(c) != 1 || c[0].GetAccessMode().GetMode() != csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER ||
		!slices.Equal(c[0].GetMount().GetMountFlags(), []string{"allow_other"}) {
		t.Errorf("capabilities %v", c)
	}

	if len(s.api.posted) != 1 {
		t.Fatalf("PVs posted: %d, want 1", len(s.api.posted))
	}
	pv := s.api.posted[0]
	if pv.Name != "pvc-1234" || pv.Kind != "PersistentVolume" || pv.APIVersion != "v1" {
		t.Errorf("PV %s %s/%s", pv.Name, pv.APIVersion, pv.Kind)
	}
	if r := pv.Spec.ClaimRef; r == nil || r.Namespace != "app" || r.Name != "data" || r.UID != "1234" || r.Kind != "PersistentVolumeClaim" {
		t.Errorf("claimRef %+v", r)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("reclaim policy %s, want the class's", pv.Spec.PersistentVolumeReclaimPolicy)
	}
	if pv.Spec.StorageClassName != "ours" || !slices.Equal(pv.Spec.MountOptions, []string{"allow_other"}) {
		t.Errorf("class %q, mount options %v", pv.Spec.StorageClassName, pv.Spec.MountOptions)
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Value() != 2<<30 {
		t.Errorf("capacity %s, want the driver's answer", q.String())
	}
	csi := pv.Spec.CSI
	if csi == nil {
		t.Fatal("no CSI source")
	}
	if csi.Driver != testDriver || csi.VolumeHandle != "account#pvc-1234" {
		t.Errorf("driver %q handle %q", csi.Driver, csi.VolumeHandle)
	}
	if r := csi.NodeStageSecretRef; r == nil || r.Name != "stage" || r.Namespace != "kube-system" {
		t.Errorf("node-stage secret ref %+v", r)
	}
	wantAttrs := map[string]string{"container": "c-pvc-1234", provisionerIdentityKey: s.p.identity}
	if !maps.Equal(csi.VolumeAttributes, wantAttrs) {
		t.Errorf("volumeAttributes %v, want %v", csi.VolumeAttributes, wantAttrs)
	}
	if !strings.HasSuffix(s.p.identity, "-8081-"+testDriver) {
		t.Errorf("identity %q", s.p.identity)
	}
	wantAnn := map[string]string{provisionedByKey: testDriver, deletionSecretName: "prov", deletionSecretNS: "kube-system"}
	if !maps.Equal(pv.Annotations, wantAnn) {
		t.Errorf("annotations %v, want %v", pv.Annotations, wantAnn)
	}
	if l := s.logs.String(); !strings.Contains(l, "msg=provisioned role=csi-provisioner pvc=app/data pv=pvc-1234 volume_id=account#pvc-1234") {
		t.Errorf("no provisioned line in the log:\n%s", l)
	}

	// Until the PV controller binds the claim, it stays pending; the PV
	// exists, so nothing is asked again.
	s.round(t)
	if len(s.csi.creates) != 1 || len(s.api.posted) != 1 {
		t.Errorf("second round: %d CreateVolume, %d POST; want no new ones", len(s.csi.creates), len(s.api.posted))
	}
}

func TestProvisionWithoutExtraMetadataAndConflict(t *testing.T) {
	s := newSetup(t, false)
	s.api.classes["ours"] = class("ours", testDriver, map[string]string{"container": "data"}, corev1.PersistentVolumeReclaimDelete)
	s.api.claims["app/data"] = claim("app", "data", "42", "ours")
	// The PV exists but the list has not shown it yet.
	s.api.conflict["pvc-42"] = true

	s.round(t)

	if len(s.csi.creates) != 1 {
		t.Fatalf("CreateVolume calls: %d", len(s.csi.creates))
	}
	if got := s.csi.creates[0].GetParameters(); !maps.Equal(got, map[string]string{"container": "data"}) {
		t.Errorf("parameters %v, want the class's only", got)
	}
	if s.csi.creates[0].GetSecrets() != nil {
		t.Errorf("secrets %v, want none", s.csi.creates[0].GetSecrets())
	}
	pv := s.api.posted[0]
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.CSI.NodeStageSecretRef != nil {
		t.Errorf("reclaim %s, node-stage ref %+v", pv.Spec.PersistentVolumeReclaimPolicy, pv.Spec.CSI.NodeStageSecretRef)
	}
	if l := s.logs.String(); strings.Contains(l, "failed") || strings.Contains(l, "msg=provisioned") {
		t.Errorf("a 409 is neither a failure nor a new PV:\n%s", l)
	}
}

func TestProvisionFailureLoggedOnce(t *testing.T) {
	s := newSetup(t, true)
	s.api.classes["ours"] = class("ours", testDriver, map[string]string{
		"csi.storage.k8s.io/provisioner-secret-name":      "missing",
		"csi.storage.k8s.io/provisioner-secret-namespace": "kube-system",
	}, corev1.PersistentVolumeReclaimDelete)
	s.api.claims["app/data"] = claim("app", "data", "1", "ours")

	s.round(t)
	s.round(t)

	l := s.logs.String()
	if n := strings.Count(l, "msg=failed"); n != 1 {
		t.Errorf("%d failure lines, want 1:\n%s", n, l)
	}
	if !strings.Contains(l, `404 Not Found (NotFound): secrets \"missing\" not found`) {
		t.Errorf("the failure does not carry the API's status:\n%s", l)
	}
	if strings.Contains(l, s.api.token) {
		t.Errorf("the token is in the log:\n%s", l)
	}
	if len(s.csi.creates) != 0 {
		t.Errorf("CreateVolume without its secret")
	}
}

func TestDelete(t *testing.T) {
	s := newSetup(t, true)
	pv := func(name, driver string, reclaim corev1.PersistentVolumeReclaimPolicy, phase corev1.PersistentVolumePhase) corev1.PersistentVolume {
		return corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
				provisionedByKey: driver, deletionSecretName: "prov", deletionSecretNS: "kube-system"}},
			Spec: corev1.PersistentVolumeSpec{
				PersistentVolumeReclaimPolicy: reclaim,
				ClaimRef:                      &corev1.ObjectReference{Namespace: "app", Name: "data"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: driver, VolumeHandle: "handle-" + name}},
			},
			Status: corev1.PersistentVolumeStatus{Phase: phase},
		}
	}
	s.api.volumes["pvc-gone"] = pv("pvc-gone", testDriver, corev1.PersistentVolumeReclaimDelete, corev1.VolumeReleased)
	s.api.volumes["pvc-kept"] = pv("pvc-kept", testDriver, corev1.PersistentVolumeReclaimRetain, corev1.VolumeReleased)
	s.api.volumes["pvc-bound"] = pv("pvc-bound", testDriver, corev1.PersistentVolumeReclaimDelete, corev1.VolumeBound)
	s.api.volumes["pvc-foreign"] = pv("pvc-foreign", "other.csi.example.com", corev1.PersistentVolumeReclaimDelete, corev1.VolumeReleased)
	s.api.secrets["kube-system/prov"] = secret("kube-system", "prov", map[string]string{"accountkey": "k1"})

	s.round(t)

	if len(s.csi.deletes) != 1 {
		t.Fatalf("DeleteVolume calls: %d, want 1", len(s.csi.deletes))
	}
	if d := s.csi.deletes[0]; d.GetVolumeId() != "handle-pvc-gone" || !maps.Equal(d.GetSecrets(), map[string]string{"accountkey": "k1"}) {
		t.Errorf("DeleteVolume %v", d)
	}
	if !slices.Equal(s.api.deleted, []string{"pvc-gone"}) {
		t.Errorf("PVs deleted: %v", s.api.deleted)
	}
	if l := s.logs.String(); !strings.Contains(l, "msg=deleted role=csi-provisioner pvc=app/data pv=pvc-gone volume_id=handle-pvc-gone") {
		t.Errorf("no deleted line in the log:\n%s", l)
	}
}

func TestKubeAPIRereadsToken(t *testing.T) {
	a, k := startAPI(t)
	ctx := context.Background()
	var l corev1.PersistentVolumeList
	if err := k.get(ctx, "/api/v1/persistentvolumes", &l); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.token = "token-2"
	a.mu.Unlock()
	err := k.get(ctx, "/api/v1/persistentvolumes", &l)
	if !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("stale token: %v, want 401", err)
	}
	if err := os.WriteFile(k.TokenFile, []byte("token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := k.get(ctx, "/api/v1/persistentvolumes", &l); err != nil {
		t.Fatalf("rotated token: %v", err)
	}
}

func TestLivenessProbe(t *testing.T) {
	f, sock, stop := startCSI(t)
	h := healthHandler(csipb.NewIdentityClient(dialTest(t, sock)), time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	setReady := func(r *wrapperspb.BoolValue) {
		f.mu.Lock()
		f.ready = r
		f.mu.Unlock()
	}

	if code, body := get(); code != http.StatusOK || body != "ok" {
		t.Errorf("Ready unset: %d %q, want 200 ok", code, body)
	}
	setReady(wrapperspb.Bool(true))
	if code, body := get(); code != http.StatusOK || body != "ok" {
		t.Errorf("Ready true: %d %q, want 200 ok", code, body)
	}
	setReady(wrapperspb.Bool(false))
	if code, body := get(); code != http.StatusInternalServerError || !strings.Contains(body, "not ready") {
		t.Errorf("Ready false: %d %q, want 500", code, body)
	}
	stop()
	if code, body := get(); code != http.StatusInternalServerError || !strings.Contains(body, "Probe") {
		t.Errorf("socket gone: %d %q, want 500", code, body)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"kubelet"},
		{"livenessprobe", "--bogus"},
		{"livenessprobe", "--health-port=9808", "extra"},
		{"csi-provisioner", "--leader-election"},
		{"csi-provisioner", "--kubeconfig=/x"},
	} {
		var out bytes.Buffer
		if code := run(args, &out); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
		if out.Len() == 0 {
			t.Errorf("run(%q) says nothing", args)
		}
	}

	// What deploy/controller.yaml passes, less leader election.
	pf, err := parseProvisionerFlags([]string{"--csi-address=/csi/csi.sock", "--v=2", "--timeout=120s", "--extra-create-metadata=true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if pf != (provisionerFlags{csiAddress: "/csi/csi.sock", timeout: 120 * time.Second, verbosity: 2, extraMetadata: true}) {
		t.Errorf("provisioner flags %+v", pf)
	}
	lf, err := parseProbeFlags([]string{"--csi-address=/csi/csi.sock", "--health-port=9809"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if lf.addr() != ":9809" || lf.probeTimeout != time.Second {
		t.Errorf("probe address %q timeout %s", lf.addr(), lf.probeTimeout)
	}
	lf, err = parseProbeFlags([]string{"--http-endpoint=127.0.0.1:9000", "--probe-timeout=3s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if lf.addr() != "127.0.0.1:9000" || lf.probeTimeout != 3*time.Second {
		t.Errorf("probe address %q timeout %s", lf.addr(), lf.probeTimeout)
	}
	if csiTarget("/csi/csi.sock") != "unix:///csi/csi.sock" || csiTarget("unix:///a") != "unix:///a" {
		t.Errorf("csiTarget")
	}
}
