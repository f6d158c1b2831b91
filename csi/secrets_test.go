package csi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeSecrets reads a Secret the way the API server serves it: data
// values base64 in JSON, the service account token as bearer token.
func TestKubeSecrets(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/api/v1/namespaces/team-a/secrets/creds":
			w.Write([]byte(`{"kind":"Secret","data":{"azurestorageaccountname":"YWNjdA==","azurestorageaccountkey":"a2V5"}}`))
		default:
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	k := &kubeSecrets{host: srv.URL, token: "tok", hc: srv.Client()}
	got, err := k.GetSecret(context.Background(), "team-a", "creds")
	if err != nil || got[secretAccountName] != "acct" || got[secretAccountKey] != "key" {
		t.Fatalf("GetSecret = %v, %v", got, err)
	}
	if _, err := k.GetSecret(context.Background(), "team-a", "nope"); !errors.Is(err, ErrSecretNotFound) {
		t.Errorf("missing secret: %v", err)
	}
	k.token = "wrong"
	if _, err := k.GetSecret(context.Background(), "team-a", "creds"); err == nil || errors.Is(err, ErrSecretNotFound) {
		t.Errorf("unauthorized: %v", err)
	}
}

// TestKubeconfigSecrets reads a Secret with a kubeconfig's client
// certificate, as a driver outside a pod does: the server's CA from a file
// named relative to the kubeconfig, the client certificate inline.
func TestKubeconfigSecrets(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 || r.TLS.PeerCertificates[0].Subject.CommonName != "system:node:n1" {
			http.Error(w, `{"kind":"Status","code":401}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/api/v1/namespaces/kube-system/secrets/azure" {
			http.Error(w, `{"kind":"Status","code":404}`, http.StatusNotFound)
			return
		}
		w.Write([]byte(`{"kind":"Secret","data":{"azurestorageaccountname":"YWNjdA=="}}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.StartTLS()
	defer srv.Close()

	dir := t.TempDir()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system:node:n1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(typ string, der []byte) string {
		return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: other
  cluster: {server: "https://127.0.0.1:1"}
- name: local
  cluster: {server: %q, certificate-authority: ca.crt}
users:
- name: node
  user: {client-certificate-data: %s, client-key-data: %s}
contexts:
- name: local
  context: {cluster: local, user: node}
current-context: local
`, srv.URL, b64("CERTIFICATE", der), b64("EC PRIVATE KEY", keyDER))
	path := filepath.Join(dir, "node.kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := KubeconfigSecrets(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.GetSecret(context.Background(), "kube-system", "azure")
	if err != nil || got[secretAccountName] != "acct" {
		t.Fatalf("GetSecret = %v, %v; want the account name from the Secret", got, err)
	}
	if _, err := k.GetSecret(context.Background(), "kube-system", "nope"); !errors.Is(err, ErrSecretNotFound) {
		t.Errorf("missing secret: err = %v, want ErrSecretNotFound", err)
	}
	if err := os.WriteFile(path, []byte("current-context: nowhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := KubeconfigSecrets(path); err == nil || !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("kubeconfig without the current context: err = %v, want one naming it", err)
	}
}
