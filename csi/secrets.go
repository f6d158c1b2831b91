package csi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// SecretGetter reads a Kubernetes Secret's data: how the secretName and
// secretNamespace parameters are served.
type SecretGetter interface {
	GetSecret(ctx context.Context, namespace, name string) (map[string]string, error)
}

// ErrSecretNotFound: the Secret does not exist.
var ErrSecretNotFound = errors.New("secret not found")

// kubeSecrets reads Secrets from the API server with the pod's service
// account (in-cluster configuration): one GET, no client library.
type kubeSecrets struct {
	host      string // https://HOST:PORT
	token     string // re-read from tokenFile when it rotates
	tokenFile string
	hc        *http.Client
}

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// InClusterSecrets returns a SecretGetter for the cluster this process runs
// in, or nil when it does not run in a pod.
func InClusterSecrets() (SecretGetter, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, nil
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("in-cluster API access: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("in-cluster API access: no certificate in ca.crt")
	}
	return &kubeSecrets{
		host:      "https://" + net.JoinHostPort(host, port),
		tokenFile: serviceAccountDir + "/token",
		hc: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		}},
	}, nil
}

func (k *kubeSecrets) GetSecret(ctx context.Context, namespace, name string) (map[string]string, error) {
	token := k.token
	if k.tokenFile != "" {
		b, err := os.ReadFile(k.tokenFile) // projected tokens rotate
		if err != nil {
			return nil, fmt.Errorf("service account token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	u := k.host + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/secrets/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", namespace, name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("get secret %s/%s: %w", namespace, name, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, fmt.Errorf("secret %s/%s: %w", namespace, name, ErrSecretNotFound)
	default:
		// The body is a Status object without secret data.
		return nil, fmt.Errorf("get secret %s/%s: API server says %s: %s", namespace, name, resp.Status, clip(string(body), 300))
	}
	// data values are base64 in JSON; []byte decodes them.
	var s struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", namespace, name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}
