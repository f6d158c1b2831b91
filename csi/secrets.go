package csi

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
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/blobfs/blobfs/blobstore"
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
	what := "secret " + namespace + "/" + name
	body, err := k.get(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/secrets/"+url.PathEscape(name), what)
	if err != nil {
		return nil, err
	}
	// data values are base64 in JSON; []byte decodes them.
	var s struct {
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

// get GETs path from the API server. Not found is errNotFoundOnServer
// (ErrSecretNotFound for a Secret); another answer than 200 an error with
// the server's message (a Status object, without secret data).
func (k *kubeSecrets) get(ctx context.Context, path, what string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.host+path, nil)
	if err != nil {
		return nil, err
	}
	if err := k.authorize(req); err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", what, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", what, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return body, nil
	case http.StatusNotFound:
		if strings.Contains(path, "/secrets/") {
			return nil, fmt.Errorf("%s: %w", what, ErrSecretNotFound)
		}
		return nil, fmt.Errorf("%s: not found", what)
	}
	return nil, fmt.Errorf("get %s: API server says %s: %s", what, resp.Status, clip(string(body), 300))
}

// authorize sets the request's bearer token, read anew each time from a
// token file (projected tokens rotate).
func (k *kubeSecrets) authorize(req *http.Request) error {
	token := k.token
	if k.tokenFile != "" {
		b, err := os.ReadFile(k.tokenFile)
		if err != nil {
			return fmt.Errorf("service account token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return nil
}

// StageSecretRefs finds the Secret that a PersistentVolume names for
// NodeStageVolume (spec.csi.nodeStageSecretRef). kubelet gives those
// credentials only in the request, and does not stage again after the
// driver restarts: when the mount died too (the driver and its keeper
// both killed), this is how the driver gets them back by itself.
type StageSecretRefs interface {
	StageSecretRef(ctx context.Context, pv PVQuery) (namespace, name string, err error)
}

// PVQuery says which PersistentVolume is a volume's: the one of Driver
// with VolumeHandle. Names are the names it may have, read from the
// paths kubelet gave the volume; they are tried first, each with one GET.
type PVQuery struct {
	Driver, VolumeHandle string
	Names                []string
}

// ErrNoStageSecretRef: no PersistentVolume of the driver has the volume
// handle, or the one that has it names no nodeStageSecretRef.
var ErrNoStageSecretRef = errors.New("no PersistentVolume of this driver names a nodeStageSecretRef for the volume")

// pvListPage is how many PersistentVolumes one list request asks for.
const pvListPage = 500

// pvOf returns the driver's PersistentVolume with the handle, or nil. It
// GETs the PersistentVolume by each name the query gives, and lists them
// only when none is it: the handle is not a field the API server can
// select on. The list goes page by page (limit, continue), and stops at
// the page that has it. The callers run only while a volume is being
// repaired, and not at every health check (apiBackoff).
func (k *kubeSecrets) pvOf(ctx context.Context, q PVQuery) (*pvSummary, error) {
	matches := func(pv *pvSummary) bool {
		c := pv.Spec.CSI
		return c != nil && c.Driver == q.Driver && c.VolumeHandle == q.VolumeHandle
	}
	for _, name := range q.Names {
		body, err := k.get(ctx, "/api/v1/persistentvolumes/"+url.PathEscape(name), "persistentvolume "+name)
		if err != nil {
			continue // gone, or not its name: the list finds it
		}
		var pv pvSummary
		if json.Unmarshal(body, &pv) == nil && matches(&pv) {
			return &pv, nil
		}
	}
	cont := ""
	for {
		v := url.Values{"limit": {strconv.Itoa(pvListPage)}}
		if cont != "" {
			v.Set("continue", cont)
		}
		body, err := k.get(ctx, "/api/v1/persistentvolumes?"+v.Encode(), "persistentvolumes")
		if err != nil {
			return nil, err
		}
		var list struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items []pvSummary `json:"items"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			return nil, fmt.Errorf("persistentvolumes: %w", err)
		}
		for i := range list.Items {
			if matches(&list.Items[i]) {
				return &list.Items[i], nil
			}
		}
		if list.Metadata.Continue == "" {
			return nil, nil
		}
		cont = list.Metadata.Continue
	}
}

// pvSummary is the part of a PersistentVolume the driver reads.
type pvSummary struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		CSI *struct {
			Driver             string `json:"driver"`
			VolumeHandle       string `json:"volumeHandle"`
			NodeStageSecretRef *struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"nodeStageSecretRef"`
		} `json:"csi"`
	} `json:"spec"`
}

// StageSecretRef returns the nodeStageSecretRef of the driver's
// PersistentVolume with the handle.
func (k *kubeSecrets) StageSecretRef(ctx context.Context, q PVQuery) (string, string, error) {
	pv, err := k.pvOf(ctx, q)
	if err != nil {
		return "", "", err
	}
	if pv != nil {
		if r := pv.Spec.CSI.NodeStageSecretRef; r != nil && r.Name != "" {
			return r.Namespace, r.Name, nil
		}
	}
	return "", "", ErrNoStageSecretRef
}

// VolumeEvents records a Warning event on the PersistentVolume of a
// volume, where `kubectl describe pv` shows it: for a mount the driver
// lost and cannot mount again by itself.
type VolumeEvents interface {
	WarnVolume(ctx context.Context, pv PVQuery, node, reason, message string) error
}

// WarnVolume posts the event in the default namespace (that of events
// about cluster-scoped objects). A volume without a PersistentVolume (an
// inline volume) gets none. Anyone who may describe the PersistentVolume
// reads the event: its reason and message pass through blobstore.Redact
// here, whatever the caller built them from.
func (k *kubeSecrets) WarnVolume(ctx context.Context, q PVQuery, node, reason, message string) error {
	driver := q.Driver
	pv, err := k.pvOf(ctx, q)
	if err != nil || pv == nil {
		return err
	}
	reason, message = blobstore.Redact(reason), blobstore.Redact(message)
	now := time.Now().UTC().Format(time.RFC3339)
	ev := map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata":       map[string]any{"generateName": pv.Metadata.Name + ".", "namespace": "default"},
		"involvedObject": map[string]any{"apiVersion": "v1", "kind": "PersistentVolume", "name": pv.Metadata.Name, "uid": pv.Metadata.UID},
		"type":           "Warning", "reason": reason, "message": clip(message, 1000),
		"source":         map[string]any{"component": driver, "host": node},
		"firstTimestamp": now, "lastTimestamp": now, "count": 1,
		"reportingComponent": driver, "reportingInstance": node,
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return k.post(ctx, "/api/v1/namespaces/default/events", body, "event on persistentvolume "+pv.Metadata.Name)
}

// post POSTs a JSON object to the API server.
func (k *kubeSecrets) post(ctx context.Context, path string, body []byte, what string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.host+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if err := k.authorize(req); err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return fmt.Errorf("create %s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("create %s: API server says %s: %s", what, resp.Status, clip(string(msg), 300))
	}
	return nil
}

// KubeconfigSecrets returns a SecretGetter that reads Secrets with the
// current context of a kubeconfig file: for a driver that runs outside a
// pod (on the host, under systemd, in the end-to-end tests). It
// understands the fields such a node needs: the server, its CA (file or
// data), and a client certificate (file or data) or a bearer token (or
// token file).
func KubeconfigSecrets(path string) (SecretGetter, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	var kc struct {
		CurrentContext string `json:"current-context"`
		Contexts       []struct {
			Name    string `json:"name"`
			Context struct {
				Cluster string `json:"cluster"`
				User    string `json:"user"`
			} `json:"context"`
		} `json:"contexts"`
		Clusters []struct {
			Name    string `json:"name"`
			Cluster struct {
				Server                   string `json:"server"`
				CertificateAuthority     string `json:"certificate-authority"`
				CertificateAuthorityData []byte `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			Name string `json:"name"`
			User struct {
				ClientCertificate     string `json:"client-certificate"`
				ClientCertificateData []byte `json:"client-certificate-data"`
				ClientKey             string `json:"client-key"`
				ClientKeyData         []byte `json:"client-key-data"`
				Token                 string `json:"token"`
				TokenFile             string `json:"tokenFile"`
			} `json:"user"`
		} `json:"users"`
	}
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName = c.Context.Cluster, c.Context.User
		}
	}
	if clusterName == "" {
		return nil, fmt.Errorf("kubeconfig %s: current-context %q names no context with a cluster", path, kc.CurrentContext)
	}
	// Relative file names in a kubeconfig are relative to its directory.
	rel := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(filepath.Dir(path), p)
		}
		return p
	}
	pick := func(data []byte, file, what string) ([]byte, error) {
		if len(data) > 0 || file == "" {
			return data, nil
		}
		d, err := os.ReadFile(rel(file))
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %s: %w", path, what, err)
		}
		return d, nil
	}
	ks := &kubeSecrets{}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	found := false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		ks.host = strings.TrimRight(c.Cluster.Server, "/")
		ca, err := pick(c.Cluster.CertificateAuthorityData, c.Cluster.CertificateAuthority, "certificate-authority")
		if err != nil {
			return nil, err
		}
		if len(ca) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("kubeconfig %s: no certificate in the cluster's certificate authority", path)
			}
			tlsCfg.RootCAs = pool
		}
	}
	if !found || ks.host == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %q has no server", path, clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		cert, err := pick(u.User.ClientCertificateData, u.User.ClientCertificate, "client-certificate")
		if err != nil {
			return nil, err
		}
		key, err := pick(u.User.ClientKeyData, u.User.ClientKey, "client-key")
		if err != nil {
			return nil, err
		}
		if len(cert) > 0 || len(key) > 0 {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig %s: client certificate: %w", path, err)
			}
			tlsCfg.Certificates = []tls.Certificate{pair}
		}
		ks.token = u.User.Token
		if u.User.TokenFile != "" {
			ks.tokenFile = rel(u.User.TokenFile)
		}
	}
	ks.hc = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	return ks, nil
}
