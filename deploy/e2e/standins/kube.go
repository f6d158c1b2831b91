package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The in-cluster service account files, as client-go's rest.InClusterConfig
// reads them.
const (
	serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	serviceAccountCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// kubeAPI is the little of an API server client the provisioner needs
// (client-go is not a dependency of this module). Its fields are set by
// inClusterAPI in a pod and by the tests otherwise.
type kubeAPI struct {
	// Base is the API server's URL, e.g. https://10.96.0.1:443.
	Base string
	// TokenFile holds the bearer token; it is read for every request
	// because projected service account tokens are rotated in place.
	// Empty: no Authorization header.
	TokenFile string
	// Client talks to Base; it trusts the cluster's CA.
	Client *http.Client
}

// inClusterAPI configures the client the way a pod finds its API server.
func inClusterAPI() (*kubeAPI, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (not running in a pod?)")
	}
	return newKubeAPI("https://"+net.JoinHostPort(host, port), serviceAccountToken, serviceAccountCA)
}

// newKubeAPI makes a client for base whose server certificate must chain
// to the PEM certificates in caFile.
func newKubeAPI(base, tokenFile, caFile string) (*kubeAPI, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificates", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	// The timeout bounds a hung API server; a round's requests are small.
	return &kubeAPI{Base: strings.TrimSuffix(base, "/"), TokenFile: tokenFile,
		Client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}, nil
}

// apiError is a failed request: the HTTP status and what the API server's
// Status object says. It never holds the token.
type apiError struct {
	Method, Path string
	Code         int
	Reason       metav1.StatusReason
	Message      string
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Code, http.StatusText(e.Code))
	if e.Reason != "" {
		s += " (" + string(e.Reason) + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// isStatus tells whether err is an API answer with this HTTP status.
func isStatus(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Code == code
}

// do sends a request with an optional JSON body and decodes a JSON
// answer into out (when non-nil).
func (k *kubeAPI) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.Base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if k.TokenFile != "" {
		tok, err := os.ReadFile(k.TokenFile)
		if err != nil {
			// The error names the file, not its content.
			return fmt.Errorf("service account token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := k.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Lists of a test cluster are small; the limit guards against a
	// runaway answer rather than a legitimate one.
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &apiError{Method: method, Path: path, Code: resp.StatusCode}
		var st metav1.Status
		if json.Unmarshal(data, &st) == nil && st.Kind == "Status" {
			e.Reason, e.Message = st.Reason, st.Message
		} else {
			e.Message = strings.TrimSpace(string(data[:min(len(data), 200)]))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
		}
	}
	return nil
}

func (k *kubeAPI) get(ctx context.Context, path string, out any) error {
	return k.do(ctx, http.MethodGet, path, nil, out)
}

func (k *kubeAPI) create(ctx context.Context, path string, obj any) error {
	return k.do(ctx, http.MethodPost, path, obj, nil)
}

func (k *kubeAPI) delete(ctx context.Context, path string) error {
	return k.do(ctx, http.MethodDelete, path, nil, nil)
}
