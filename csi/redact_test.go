package csi

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// lockedBuffer is a log sink shared by the driver's goroutines: storetest.LogBuffer.
type lockedBuffer = storetest.LogBuffer

// secretFragments lists the fragments of secret that must not appear
// anywhere: every run of 10 characters, and its URL-encoded form.
func secretFragments(secret string) []string {
	var out []string
	for i := 0; i+10 <= len(secret); i++ {
		out = append(out, secret[i:i+10])
	}
	if q := url.QueryEscape(secret); q != secret {
		out = append(out, q)
	}
	return out
}

// TestNoSecretInCSIOutput sends the CSI calls that carry secrets, with
// every kind of credential, against stores that refuse, hang or answer
// 403 while quoting the request back, and searches everything the driver
// says (gRPC statuses, which kubelet turns into pod events; its log at
// debug level; its metrics) for any fragment of the secrets. The log here
// is a plain text handler: the driver must not rely on the binary's
// redacting handler.
func TestNoSecretInCSIOutput(t *testing.T) {
	needFUSE(t)
	var logs lockedBuffer
	metricsAddr := freeAddr(t)
	d := startDriver(t, driverOptions{
		metrics: metricsAddr,
		logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})

	const account = "canaryacct"
	key := base64.StdEncoding.EncodeToString([]byte("CANARY-csi-account-key-9e4d2b"))
	sig := "CANARYcsiSig9e4d2b7c1a3f5e"
	sas := "sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00:00:00Z&sig=" + url.QueryEscape(sig+"+/=")

	refused := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return "http://" + l.Addr().String() + "/" + account
	}()
	hung := storetest.HungAddr(t)
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ms-error-code", "AuthenticationFailed")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `<?xml version="1.0"?><Error><Code>AuthenticationFailed</Code><Message>refused %s</Message></Error>`, r.URL.String())
	}))
	t.Cleanup(echo.Close)

	var said strings.Builder
	record := func(what string, err error) {
		if err == nil {
			t.Errorf("%s succeeded against a failing store", what)
			return
		}
		fmt.Fprintf(&said, "%s: %v | %s\n", what, err, status.Convert(err).Message())
	}
	for _, ep := range []struct{ name, url string }{
		{"refused", refused},
		{"hung", "http://" + hung + "/" + account},
		{"403", echo.URL + "/" + account},
	} {
		for _, cred := range []struct {
			name    string
			secrets map[string]string
		}{
			{"key", map[string]string{secretAccountName: account, secretAccountKey: key}},
			{"sas", map[string]string{secretAccountName: account, secretSASToken: "?" + sas}},
			{"connstr key", map[string]string{secretConnString: "DefaultEndpointsProtocol=http;AccountName=" + account + ";AccountKey=" + key + ";BlobEndpoint=" + ep.url}},
			{"connstr sas", map[string]string{secretConnString: "BlobEndpoint=" + ep.url + ";SharedAccessSignature=" + sas}},
		} {
			what := ep.name + "/" + cred.name
			timeout := 20 * time.Second
			if ep.name == "hung" {
				timeout = 3 * time.Second // what kubelet's deadline does
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			vol := volumeID{Account: account, Container: "data", Endpoint: ep.url}.String()
			staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io", strings.NewReplacer("/", "-", " ", "-").Replace(what), "globalmount")
			_, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
				VolumeId: vol, StagingTargetPath: staging, VolumeCapability: mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
				Secrets: cred.secrets,
			})
			record(what+" NodeStageVolume", err)
			if ep.name != "hung" {
				_, err = d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
					Name: "canary-" + strings.NewReplacer("/", "-", " ", "-").Replace(what), Parameters: map[string]string{"storageAccount": account, "server": ep.url},
					Secrets: cred.secrets, VolumeCapabilities: []*csipb.VolumeCapability{mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
				})
				record(what+" CreateVolume", err)
				_, err = d.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol, Secrets: cred.secrets})
				record(what+" DeleteVolume", err)
			}
			cancel()
		}
	}

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	for name, out := range map[string]string{"gRPC statuses": said.String(), "log": logs.String(), "metrics": string(metrics)} {
		for _, secret := range []string{key, sig} {
			for _, frag := range secretFragments(secret) {
				if strings.Contains(out, frag) {
					t.Errorf("%s carry a fragment of a secret (%q):\n%s", name, frag, out)
					break
				}
			}
		}
	}
	if !strings.Contains(said.String(), "sig=REDACTED") {
		t.Errorf("expected the redacted SAS in some status (the test would not notice a leak otherwise):\n%s", said.String())
	}
}

// TestRequestLogRedactsVolumeAttributes sends, through the driver's gRPC
// server as kubelet and the provisioner do, requests that carry
// credentials outside the secrets fields (issue 38): in volume_context,
// parameters and publish_context, as blob-csi-driver accepts them, and in
// mount flags. protosanitizer strips only the secrets fields; the request
// log at INFO must still carry no canary, and still name the volume.
func TestRequestLogRedactsVolumeAttributes(t *testing.T) {
	var logs lockedBuffer
	d := startDriver(t, driverOptions{logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const (
		keyCanary  = "CANARYvolCtxKey0a1b2c3d4e5f+/=="
		sasCanary  = "CANARYvolCtxSas0a1b2c3d4e5f"
		flagCanary = "CANARYmountFlag0a1b2c3d4e5f"
		pubCanary  = "CANARYpubCtxConn0a1b2c3d4e5f"
		parCanary  = "CANARYparamsMsi0a1b2c3d4e5f"
	)
	canaries := []string{keyCanary, sasCanary, flagCanary, pubCanary, parCanary}
	vol := volumeID{Account: "canaryacct", Container: "data"}.String()
	staging := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io/canary/globalmount")
	target := filepath.Join(d.kubelet, "pods/0b1c/volumes/kubernetes.io~csi/pv-canary/mount")
	ctx := t.Context()

	var said strings.Builder
	_, err := d.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging,
		VolumeCapability: mountCap(rwx, "-o allow_other,azurestorageaccountsastoken=sv=2022-11-02&sp=rl&sig="+flagCanary),
		VolumeContext:    map[string]string{"azurestorageaccountkey": keyCanary, "containerName": "data"},
	})
	fmt.Fprintf(&said, "NodeStageVolume: %v\n", err)
	_, err = d.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
		VolumeId: vol, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap(rwx),
		VolumeContext:  map[string]string{"azurestorageaccountsastoken": "sv=2022-11-02&ss=b&sp=rl&se=2099-01-01T00:00:00Z&sig=" + sasCanary},
		PublishContext: map[string]string{"azurestorageconnectionstring": "DefaultEndpointsProtocol=https;AccountName=canaryacct;AccountKey=" + pubCanary},
	})
	fmt.Fprintf(&said, "NodePublishVolume: %v\n", err)
	_, err = d.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: "pvc-canary", VolumeCapabilities: []*csipb.VolumeCapability{mountCap(rwx)},
		Parameters: map[string]string{"storageAccount": "canaryacct", "msisecret": parCanary},
	})
	fmt.Fprintf(&said, "CreateVolume: %v\n", err)

	out := logs.String()
	for name, text := range map[string]string{"log": out, "gRPC statuses": said.String()} {
		var leaked []string
		for _, c := range canaries {
			if strings.Contains(text, c) {
				leaked = append(leaked, c)
			}
		}
		if len(leaked) > 0 {
			t.Errorf("%s carries canaries %q:\n%s", name, leaked, text)
		}
	}
	// The requests were logged, with what identifies them.
	for _, want := range []string{"method=NodeStageVolume", "method=NodePublishVolume", "method=CreateVolume", vol, "pv-canary", "containerName", "pvc-canary"} {
		if !strings.Contains(out, want) {
			t.Errorf("request log lacks %q:\n%s", want, out)
		}
	}
}

// TestVolumeEventRedacted: a Warning event on a PersistentVolume, which
// anyone who may describe the PV reads, carries no secret whatever the
// message it is given quotes.
func TestVolumeEventRedacted(t *testing.T) {
	var (
		mu     sync.Mutex
		posted []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/persistentvolumes":
			w.Write([]byte(`{"items":[{"metadata":{"name":"pv-data","uid":"u1"},"spec":{"csi":{"driver":"blob.csi.blobfs.io","volumeHandle":"acct#data"}}}]}`))
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/default/events":
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			posted = append(posted, string(b))
			mu.Unlock()
			w.WriteHeader(http.StatusCreated)
		default:
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	k := &kubeSecrets{host: srv.URL, token: "tok", hc: srv.Client()}
	const sigCanary, keyCanary = "CANARYeventSig0a1b2c3d4e", "CANARYeventKey0a1b2c3d4e"
	msg := `mount lost and not mounted again: azure: Get "https://acct.blob.core.windows.net/data?restype=container&sv=2022-11-02&sig=` + sigCanary +
		`": EOF; volume_context {"azurestorageaccountkey":"` + keyCanary + `"}`
	if err := k.WarnVolume(t.Context(), PVQuery{Driver: "blob.csi.blobfs.io", VolumeHandle: "acct#data"}, "node-1", "VolumeMountLost", msg); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(posted) != 1 {
		t.Fatalf("%d events posted, want 1", len(posted))
	}
	for _, c := range []string{sigCanary, keyCanary} {
		if strings.Contains(posted[0], c) {
			t.Errorf("event carries canary %s: %s", c, posted[0])
		}
	}
	if !strings.Contains(posted[0], "mount lost and not mounted again") || !strings.Contains(posted[0], "VolumeMountLost") {
		t.Errorf("event lost its message: %s", posted[0])
	}
}
