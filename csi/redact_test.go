package csi

import (
	"bytes"
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

// lockedBuffer is a log sink shared by the driver's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

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
