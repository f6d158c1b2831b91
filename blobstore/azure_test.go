package blobstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// A syntactically valid account key that is not Azurite's.
var otherKey = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("k"), 64))

func TestAzureConfigFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want blobstore.AzureConfig
	}{
		{"empty", nil, blobstore.AzureConfig{}},
		{"cli style", map[string]string{
			"AZURE_STORAGE_ACCOUNT":       "acct",
			"AZURE_STORAGE_KEY":           "a2V5",
			"AZURE_STORAGE_CONTAINER":     "data",
			"AZURE_STORAGE_AUTH_TYPE":     "key",
			"AZURE_STORAGE_SAS_TOKEN":     "?sv=1&sig=x",
			"AZURE_CLIENT_ID":             "not-read",
			"AZURE_STORAGE_BLOB_ENDPOINT": " https://acct.example/ ",
		}, blobstore.AzureConfig{
			Account: "acct", Key: "a2V5", Container: "data", Auth: "key",
			SASToken: "?sv=1&sig=x", Endpoint: "https://acct.example/",
		}},
		{"blobfuse2 style", map[string]string{
			"AZURE_STORAGE_ACCESS_KEY":         "a2V5",
			"AZURE_STORAGE_ACCOUNT_CONTAINER":  "first",
			"AZURE_STORAGE_CONTAINER":          "second",
			"AZURE_STORAGE_IDENTITY_CLIENT_ID": "11111111-2222-3333-4444-555555555555",
		}, blobstore.AzureConfig{
			Key: "a2V5", Container: "first", ClientID: "11111111-2222-3333-4444-555555555555",
		}},
		{"key preferred over access key", map[string]string{
			"AZURE_STORAGE_KEY": "b25l", "AZURE_STORAGE_ACCESS_KEY": "dHdv",
		}, blobstore.AzureConfig{Key: "b25l"}},
		{"connection string", map[string]string{
			"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true",
		}, blobstore.AzureConfig{ConnectionString: "UseDevelopmentStorage=true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := blobstore.AzureConfigFromEnv(func(k string) string { return tt.env[k] })
			if got != tt.want {
				t.Errorf("AzureConfigFromEnv = %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func TestAzureConfigValidate(t *testing.T) {
	const key = blobstore.AzuriteAccountKey
	valid := []struct {
		name string
		cfg  blobstore.AzureConfig
		want string // String(), which shows endpoint and mode
	}{
		{"key, default endpoint",
			blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth key)`},
		{"key, Azurite endpoint names the account",
			blobstore.AzureConfig{Container: "data", Key: key, Endpoint: "http://127.0.0.1:10000/devstoreaccount1"},
			`azure container "data" at http://127.0.0.1:10000/devstoreaccount1/ (auth key)`},
		{"sas with leading ?",
			blobstore.AzureConfig{Account: "acct1", Container: "data", SASToken: "?sv=2022-11-02&sp=rl&sig=abc"},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth sas)`},
		{"connection string, Azure",
			blobstore.AzureConfig{Container: "data", ConnectionString: "DefaultEndpointsProtocol=https;AccountName=acct2;AccountKey=" + key + ";EndpointSuffix=core.chinacloudapi.cn"},
			`azure container "data" at https://acct2.blob.core.chinacloudapi.cn/ (auth connstr)`},
		{"connection string, Azurite BlobEndpoint",
			blobstore.AzureConfig{Container: "data", ConnectionString: "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=" + key + ";BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"},
			`azure container "data" at http://127.0.0.1:10000/devstoreaccount1/ (auth connstr)`},
		{"connection string, SAS only",
			blobstore.AzureConfig{Container: "data", ConnectionString: "BlobEndpoint=https://acct3.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&sig=abc"},
			`azure container "data" at https://acct3.blob.core.windows.net/ (auth connstr)`},
		{"UseDevelopmentStorage",
			blobstore.AzureConfig{Container: "data", ConnectionString: "UseDevelopmentStorage=true"},
			`azure container "data" at http://127.0.0.1:10000/devstoreaccount1/ (auth connstr)`},
		{"anonymous",
			blobstore.AzureConfig{Account: "acct1", Container: "public", Anonymous: true},
			`azure container "public" at https://acct1.blob.core.windows.net/ (auth anonymous)`},
		{"azure ad by default",
			blobstore.AzureConfig{Account: "acct1", Container: "data"},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth azuread)`},
		{"managed identity",
			blobstore.AzureConfig{Account: "acct1", Container: "data", ClientID: "abc"},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth azuread)`},
		{"explicit auth picks among several credentials",
			blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, SASToken: "sv=1&sig=x", Auth: "SAS"},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth sas)`},
		{"msi alias",
			blobstore.AzureConfig{Account: "acct1", Container: "data", Auth: "msi"},
			`azure container "data" at https://acct1.blob.core.windows.net/ (auth azuread)`},
	}
	for _, tt := range valid {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := tt.cfg.String(); got != tt.want {
				t.Errorf("String() = %s\nwant       %s", got, tt.want)
			}
			if _, err := blobstore.NewAzure(tt.cfg); err != nil {
				t.Errorf("NewAzure: %v", err)
			}
		})
	}

	invalid := []struct {
		name string
		cfg  blobstore.AzureConfig
		want string // in the error message
	}{
		{"no container", blobstore.AzureConfig{Account: "acct1", Key: key}, "missing container"},
		{"bad container", blobstore.AzureConfig{Account: "acct1", Container: "My_Data", Key: key}, `container name "My_Data" is invalid`},
		{"missing account", blobstore.AzureConfig{Container: "data", Key: key}, "missing account"},
		{"bad account", blobstore.AzureConfig{Account: "My-Account", Container: "data", Key: key}, `account name "My-Account" is invalid`},
		{"bad URL", blobstore.AzureConfig{Container: "data", Key: key, Endpoint: "http://[::1"}, "is not a URL"},
		{"no scheme", blobstore.AzureConfig{Container: "data", Key: key, Endpoint: "acct1.blob.core.windows.net"}, "must start with https://"},
		{"endpoint with /../", blobstore.AzureConfig{Container: "data", Key: key, Account: "devstoreaccount1", Endpoint: "http://127.0.0.1:10000/x/../devstoreaccount1"}, `path segment ".."`},
		{"endpoint ending in /..", blobstore.AzureConfig{Container: "data", Key: key, Account: "devstoreaccount1", Endpoint: "http://127.0.0.1:10000/devstoreaccount1/.."}, `path segment ".."`},
		{"endpoint with /./", blobstore.AzureConfig{Container: "data", Key: key, Account: "devstoreaccount1", Endpoint: "http://127.0.0.1:10000/./devstoreaccount1/"}, `path segment "."`},
		{"endpoint with %2e%2e", blobstore.AzureConfig{Container: "data", Key: key, Account: "devstoreaccount1", Endpoint: "http://127.0.0.1:10000/x/%2E%2e/devstoreaccount1"}, `path segment ".."`},
		{"endpoint with //", blobstore.AzureConfig{Container: "data", Key: key, Account: "devstoreaccount1", Endpoint: "http://127.0.0.1:10000//devstoreaccount1"}, `path segment ""`},
		{"endpoint with SAS", blobstore.AzureConfig{Container: "data", Endpoint: "https://acct1.blob.core.windows.net/?sv=1&sig=SECRET"}, "must not carry a query"},
		{"key and SAS", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, SASToken: "sv=1&sig=x"}, "conflicting credentials: an account key (AZURE_STORAGE_KEY) and a SAS token (AZURE_STORAGE_SAS_TOKEN); choose one with --auth-type"},
		{"key and anonymous", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, Anonymous: true}, "conflicting credentials"},
		{"anonymous but auth key", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, Anonymous: true, Auth: "key"}, "anonymous access is asked for but the auth type is key"},
		{"client id with key", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, ClientID: "x", Auth: "key"}, "client id (--identity-client-id, AZURE_STORAGE_IDENTITY_CLIENT_ID) is set but the auth type is key"},
		{"auth key without key", blobstore.AzureConfig{Account: "acct1", Container: "data", Auth: "key"}, "auth mode key needs an account key"},
		{"unknown auth", blobstore.AzureConfig{Account: "acct1", Container: "data", Auth: "kerberos"}, `unknown auth mode "kerberos"`},
		{"key not base64", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: "not base64!"}, "not valid base64"},
		{"SAS without signature", blobstore.AzureConfig{Account: "acct1", Container: "data", SASToken: "sv=2022-11-02"}, "SAS token is malformed"},
		{"azure ad over http", blobstore.AzureConfig{Container: "data", Endpoint: "http://127.0.0.1:10000/devstoreaccount1"}, "needs an https endpoint"},
		{"connstr garbage", blobstore.AzureConfig{Container: "data", ConnectionString: "SECRETSTUFF"}, "malformed connection string"},
		{"connstr no key", blobstore.AzureConfig{Container: "data", ConnectionString: "AccountName=acct1"}, "needs AccountKey or SharedAccessSignature"},
		{"connstr other account", blobstore.AzureConfig{Account: "acct9", Container: "data", ConnectionString: "AccountName=acct1;AccountKey=" + key}, "conflicting account"},
		{"negative timeout", blobstore.AzureConfig{Account: "acct1", Container: "data", Key: key, TryTimeout: -time.Second}, "negative"},
	}
	for _, tt := range invalid {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatalf("Validate accepted %s", tt.cfg)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate: %v\nwant it to say %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), key) {
				t.Errorf("the error shows a secret: %v", err)
			}
			if _, err := blobstore.NewAzure(tt.cfg); err == nil {
				t.Errorf("NewAzure accepted an invalid config")
			}
		})
	}
}

// TestAzureConfigStringHidesSecrets guards against logging a config with
// %v or %+v.
func TestAzureConfigStringHidesSecrets(t *testing.T) {
	cfg := blobstore.AzureConfig{Account: "acct1", Container: "data", Key: otherKey, SASToken: "sig=SECRET", Auth: "key"}
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
		if strings.Contains(s, otherKey) || strings.Contains(s, "SECRET") {
			t.Errorf("formatted config shows a secret: %s", s)
		}
	}
}

// fakeService answers every request with one canned blob-service error.
func fakeService(t *testing.T, status int, code string) blobstore.Store {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ms-error-code", code)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		if r.Method != http.MethodHead {
			fmt.Fprintf(w, `<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>canned %s
RequestId:00000000-0000-0000-0000-000000000000
Time:2026-01-01T00:00:00.0000000Z</Message></Error>`, code, code)
		}
	}))
	t.Cleanup(srv.Close)
	az, err := blobstore.NewAzure(blobstore.AzureConfig{
		Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey,
	})
	if err != nil {
		t.Fatal(err)
	}
	return az
}

func TestAzureErrorMapping(t *testing.T) {
	tests := []struct {
		status int
		code   string
		want   error // nil: no sentinel
	}{
		{404, "BlobNotFound", blobstore.ErrNotFound},
		{404, "ContainerNotFound", blobstore.ErrNotFound},
		{404, "ResourceNotFound", blobstore.ErrNotFound},
		{412, "ConditionNotMet", blobstore.ErrPreconditionFailed},
		{409, "BlobAlreadyExists", blobstore.ErrAlreadyExists},
		{409, "ContainerBeingDeleted", blobstore.ErrTransient},
		{409, "LeaseIdMissing", nil},
		{429, "TooManyRequests", blobstore.ErrThrottled},
		{503, "ServerBusy", blobstore.ErrThrottled},
		{401, "NoAuthenticationInformation", blobstore.ErrUnauthorized},
		{403, "AuthenticationFailed", blobstore.ErrUnauthorized},
		{403, "AuthorizationPermissionMismatch", blobstore.ErrUnauthorized},
		{500, "InternalError", blobstore.ErrTransient},
		{500, "OperationTimedOut", blobstore.ErrTransient},
		{502, "", blobstore.ErrTransient},
		{400, "InvalidHeaderValue", nil},
	}
	sentinels := []error{blobstore.ErrNotFound, blobstore.ErrPreconditionFailed, blobstore.ErrAlreadyExists,
		blobstore.ErrThrottled, blobstore.ErrUnauthorized, blobstore.ErrTransient, blobstore.ErrInvalidName}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d_%s", tt.status, tt.code), func(t *testing.T) {
			az := fakeService(t, tt.status, tt.code)
			calls := map[string]func() error{
				"Stat": func() error { _, err := az.Stat(t.Context(), "a/b"); return err },
				"Put":  func() error { _, err := az.Put(t.Context(), "a/b", []byte("x"), blobstore.PutOptions{}); return err },
				"List": func() error { _, err := az.List(t.Context(), blobstore.ListOptions{Prefix: "a/"}); return err },
			}
			for op, call := range calls {
				err := call()
				if err == nil {
					t.Fatalf("%s: no error from a %d answer", op, tt.status)
				}
				for _, s := range sentinels {
					if got := errors.Is(err, s); got != (s == tt.want) {
						t.Errorf("%s: errors.Is(%v, %v) = %v", op, err, s, got)
					}
				}
				msg := err.Error()
				if !strings.Contains(msg, fmt.Sprint(tt.status)) || !strings.Contains(msg, tt.code) {
					t.Errorf("%s: message %q lacks the status and code", op, msg)
				}
				if strings.Contains(msg, "\n") {
					t.Errorf("%s: message is not one line: %q", op, msg)
				}
				if op != "Stat" && tt.code != "" && !strings.Contains(msg, "canned "+tt.code) {
					t.Errorf("%s: message %q lacks the service's message", op, msg)
				}
			}
		})
	}
}

// TestAzureIfNoneMatchAnswered412 checks that a 412 to If-None-Match:* (the
// HTTP answer; Azure itself sends 409) still reads as ErrAlreadyExists.
func TestAzureIfNoneMatchAnswered412(t *testing.T) {
	az := fakeService(t, 412, "ConditionNotMet")
	_, err := az.Put(t.Context(), "a", []byte("x"), blobstore.PutOptions{Conditions: blobstore.Conditions{IfNoneMatch: true}})
	if !errors.Is(err, blobstore.ErrAlreadyExists) {
		t.Errorf("Put If-None-Match: %v, want ErrAlreadyExists", err)
	}
}

func TestAzureTransportErrors(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		az, err := blobstore.NewAzure(blobstore.AzureConfig{Endpoint: "http://" + addr + "/acct", Container: "data", Key: otherKey})
		if err != nil {
			t.Fatal(err)
		}
		_, err = az.Stat(t.Context(), "x")
		if !errors.Is(err, blobstore.ErrTransient) || !blobstore.Retryable(err) {
			t.Errorf("Stat against a closed port: %v, want ErrTransient", err)
		}
	})
	t.Run("per-try timeout", func(t *testing.T) {
		var hits atomic.Int32
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			<-release
		}))
		defer srv.Close()
		defer close(release)
		az, err := blobstore.NewAzure(blobstore.AzureConfig{
			Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey, TryTimeout: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = az.Stat(t.Context(), "x")
		if !errors.Is(err, blobstore.ErrTransient) {
			t.Errorf("Stat of a hanging server: %v, want ErrTransient", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Stat took %v despite a 100ms try timeout", d)
		}
		if n := hits.Load(); n != 1 {
			t.Errorf("server saw %d requests; the SDK must not retry on its own", n)
		}
		if want := "no complete answer within 100ms (the per-request timeout)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Stat of a hanging server: %v; want it to say %q", err, want)
		}
	})
	t.Run("per-try timeout in the body", func(t *testing.T) {
		// The answer starts, then its body stalls (a proxy that hangs
		// mid-body): the timeout covers the body too, and says so.
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "10")
			w.WriteHeader(http.StatusPartialContent)
			w.Write([]byte("abc"))
			w.(http.Flusher).Flush()
			<-release
		}))
		defer srv.Close()
		defer close(release)
		az, err := blobstore.NewAzure(blobstore.AzureConfig{
			Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey, TryTimeout: 100 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = az.ReadAt(t.Context(), "x", make([]byte, 10), 0, "")
		if !errors.Is(err, blobstore.ErrTransient) {
			t.Errorf("ReadAt of a stalled body: %v, want ErrTransient", err)
		}
		if want := "no complete answer within 100ms (the per-request timeout)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadAt of a stalled body: %v; want it to say %q", err, want)
		}
	})
	t.Run("no SDK retries on 503", func(t *testing.T) {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.Header().Set("x-ms-error-code", "ServerBusy")
			w.WriteHeader(503)
		}))
		defer srv.Close()
		az, err := blobstore.NewAzure(blobstore.AzureConfig{Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := az.Stat(t.Context(), "x"); !errors.Is(err, blobstore.ErrThrottled) {
			t.Errorf("Stat: %v, want ErrThrottled", err)
		}
		if n := hits.Load(); n != 1 {
			t.Errorf("server saw %d requests, want 1", n)
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}))
		defer srv.Close()
		az, err := blobstore.NewAzure(blobstore.AzureConfig{Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err = az.Stat(ctx, "x")
		if !errors.Is(err, context.DeadlineExceeded) || blobstore.Retryable(err) {
			t.Errorf("Stat with an expired context: %v, want context.DeadlineExceeded and not retryable", err)
		}
	})
}

// openAzure opens a store on cfg or fails the test.
func openAzure(t *testing.T, cfg blobstore.AzureConfig) *blobstore.Azure {
	t.Helper()
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatalf("NewAzure(%s): %v", cfg, err)
	}
	return az
}

// containerClient returns an SDK client on cfg's container, to look at
// blobs without going through the store under test.
func containerClient(t *testing.T, cfg blobstore.AzureConfig) *container.Client {
	t.Helper()
	cred, err := container.NewSharedKeyCredential(cfg.Account, cfg.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := container.NewClientWithSharedKeyCredential(strings.TrimSuffix(cfg.Endpoint, "/")+"/"+cfg.Container, cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// containerSAS signs a container SAS with cfg's key.
func containerSAS(t *testing.T, cfg blobstore.AzureConfig, perms sas.ContainerPermissions, expiry time.Time) string {
	t.Helper()
	cred, err := container.NewSharedKeyCredential(cfg.Account, cfg.Key)
	if err != nil {
		t.Fatal(err)
	}
	q, err := sas.BlobSignatureValues{
		Protocol:      sas.ProtocolHTTPSandHTTP,
		StartTime:     time.Now().Add(-time.Hour),
		ExpiryTime:    expiry,
		Permissions:   perms.String(),
		ContainerName: cfg.Container,
	}.SignWithSharedKey(cred)
	if err != nil {
		t.Fatal(err)
	}
	return q.Encode()
}

func mustPut(t *testing.T, s blobstore.Store, name, data string, md map[string]string) blobstore.Attrs {
	t.Helper()
	a, err := s.Put(t.Context(), name, []byte(data), blobstore.PutOptions{Metadata: md})
	if err != nil {
		t.Fatalf("Put %q: %v", name, err)
	}
	return a
}

func mustRead(t *testing.T, s blobstore.Store, name string) string {
	t.Helper()
	p := make([]byte, 1<<16)
	n, err := s.ReadAt(t.Context(), name, p, 0, "")
	if err != nil && err != io.EOF {
		t.Fatalf("ReadAt %q: %v", name, err)
	}
	return string(p[:n])
}

// TestAzuriteAuthModes opens one container with every credential kind
// Azurite supports and checks that each can do what it should.
func TestAzuriteAuthModes(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	keyStore := openAzure(t, cfg)
	mustPut(t, keyStore, "dir/hello.txt", "hello", map[string]string{"owner": "key"})

	rw := sas.ContainerPermissions{Read: true, Add: true, Create: true, Write: true, Delete: true, List: true}
	sasToken := containerSAS(t, cfg, rw, time.Now().Add(time.Hour))
	modes := map[string]blobstore.AzureConfig{
		"key": cfg,
		"sas": {Endpoint: cfg.Endpoint, Container: cfg.Container, SASToken: "?" + sasToken},
		"connstr key": {Container: cfg.Container, ConnectionString: fmt.Sprintf(
			"DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;", cfg.Account, cfg.Key, cfg.Endpoint)},
		"connstr sas": {Container: cfg.Container, ConnectionString: fmt.Sprintf(
			"BlobEndpoint=%s;SharedAccessSignature=%s", cfg.Endpoint, sasToken)},
	}
	for name, mcfg := range modes {
		t.Run(name, func(t *testing.T) {
			s := openAzure(t, mcfg)
			if err := s.Check(t.Context()); err != nil {
				t.Fatalf("Check: %v", err)
			}
			if got := mustRead(t, s, "dir/hello.txt"); got != "hello" {
				t.Errorf("read %q, want hello", got)
			}
			blobName := "by-" + strings.ReplaceAll(name, " ", "-")
			mustPut(t, s, blobName, name, nil)
			// Server-side copy: with a SAS the source URL must carry it.
			if _, err := s.Copy(t.Context(), blobName+".copy", blobName); err != nil {
				t.Fatalf("Copy: %v", err)
			}
			if got := mustRead(t, keyStore, blobName+".copy"); got != name {
				t.Errorf("copy holds %q, want %q", got, name)
			}
			if err := s.Delete(t.Context(), blobName+".copy", blobstore.Conditions{}); err != nil {
				t.Errorf("Delete: %v", err)
			}
		})
	}

	t.Run("read-only sas", func(t *testing.T) {
		ro := containerSAS(t, cfg, sas.ContainerPermissions{Read: true, List: true}, time.Now().Add(time.Hour))
		s := openAzure(t, blobstore.AzureConfig{Endpoint: cfg.Endpoint, Container: cfg.Container, SASToken: ro})
		if err := s.Check(t.Context()); err != nil {
			t.Fatalf("Check: %v", err)
		}
		_, err := s.Put(t.Context(), "forbidden", []byte("x"), blobstore.PutOptions{})
		if !errors.Is(err, blobstore.ErrUnauthorized) {
			t.Errorf("Put with a read-only SAS: %v, want ErrUnauthorized", err)
		}
	})
	t.Run("expired sas", func(t *testing.T) {
		old := containerSAS(t, cfg, rw, time.Now().Add(-time.Minute))
		oldCfg := blobstore.AzureConfig{Endpoint: cfg.Endpoint, Container: cfg.Container, SASToken: old}
		s := openAzure(t, oldCfg)
		err := s.Check(t.Context())
		if !errors.Is(err, blobstore.ErrUnauthorized) {
			t.Fatalf("Check with an expired SAS: %v, want ErrUnauthorized", err)
		}
		exp, _ := oldCfg.SASExpiry()
		for _, want := range []string{"renew the SAS token", "the SAS token expired at " + exp.Format(time.RFC3339)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Check with an expired SAS: %v; want it to say %q", err, want)
			}
		}
		if _, err := s.Stat(t.Context(), "dir/hello.txt"); !errors.Is(err, blobstore.ErrUnauthorized) || !strings.Contains(err.Error(), "the SAS token expired at") {
			t.Errorf("Stat with an expired SAS: %v; want ErrUnauthorized saying the SAS token expired", err)
		}
	})
}

func TestAzuriteAnonymous(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	keyStore := openAzure(t, cfg)
	mustPut(t, keyStore, "pub/file", "public data", map[string]string{"k": "v"})
	anon := blobstore.AzureConfig{Endpoint: cfg.Endpoint, Container: cfg.Container, Anonymous: true}

	// Private container: anonymous access must fail, with a sentence.
	err := openAzure(t, anon).Check(t.Context())
	if err == nil {
		t.Fatal("anonymous Check of a private container succeeded")
	}
	if !strings.Contains(err.Error(), "not public") {
		t.Errorf("anonymous Check of a private container: %v; want it to say the container is not public", err)
	}

	// Make it public (container level: blobs and listing).
	cc := containerClient(t, cfg)
	if _, err := cc.SetAccessPolicy(t.Context(), &container.SetAccessPolicyOptions{Access: to.Ptr(container.PublicAccessTypeContainer)}); err != nil {
		t.Fatalf("SetAccessPolicy: %v", err)
	}
	s := openAzure(t, anon)
	if err := s.Check(t.Context()); err != nil {
		t.Fatalf("anonymous Check of a public container: %v", err)
	}
	if got := mustRead(t, s, "pub/file"); got != "public data" {
		t.Errorf("anonymous read %q", got)
	}
	a, err := s.Stat(t.Context(), "pub/file")
	if err != nil || a.Size != int64(len("public data")) || a.Metadata["k"] != "v" {
		t.Errorf("anonymous Stat = %+v, %v", a, err)
	}
	page, err := s.List(t.Context(), blobstore.ListOptions{Delimiter: "/"})
	if err != nil || len(page.Prefixes) != 1 || page.Prefixes[0] != "pub/" {
		t.Errorf("anonymous List = %+v, %v", page, err)
	}
	if _, err := s.Put(t.Context(), "pub/new", []byte("x"), blobstore.PutOptions{}); err == nil {
		t.Errorf("anonymous Put succeeded")
	} else {
		t.Logf("anonymous Put: %v", err)
	}
}

func TestAzuriteCheckErrors(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)

	t.Run("wrong key", func(t *testing.T) {
		bad := cfg
		bad.Key = otherKey
		err := openAzure(t, bad).Check(t.Context())
		if !errors.Is(err, blobstore.ErrUnauthorized) {
			t.Fatalf("Check with a wrong key: %v, want ErrUnauthorized", err)
		}
		if !strings.Contains(err.Error(), "account key is wrong") {
			t.Errorf("Check with a wrong key: %v; want it to say the key is wrong", err)
		}
		if strings.Contains(err.Error(), otherKey) {
			t.Errorf("the error shows the key")
		}
	})
	t.Run("missing container", func(t *testing.T) {
		missing := cfg
		missing.Container = "no-such-container-here"
		err := openAzure(t, missing).Check(t.Context())
		if !errors.Is(err, blobstore.ErrNotFound) {
			t.Fatalf("Check of a missing container: %v, want ErrNotFound", err)
		}
		if !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), missing.Container) {
			t.Errorf("Check of a missing container: %v; want it to name the container and say it does not exist", err)
		}
	})
	t.Run("unreachable endpoint", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		gone := cfg
		gone.Endpoint = "http://" + addr + "/" + cfg.Account
		start := time.Now()
		err = openAzure(t, gone).Check(t.Context())
		if !errors.Is(err, blobstore.ErrTransient) || !strings.Contains(err.Error(), "cannot reach the blob endpoint") {
			t.Errorf("Check of a closed port: %v; want ErrTransient saying it cannot reach the endpoint", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Check of a closed port took %v", d)
		}
	})
	t.Run("unknown host", func(t *testing.T) {
		gone := cfg
		gone.Endpoint = "http://blobfs-no-such-host.invalid/" + cfg.Account
		err := openAzure(t, gone).Check(t.Context())
		if err == nil || !strings.Contains(err.Error(), "cannot resolve host") {
			t.Errorf("Check of an unknown host: %v; want it to say the host cannot be resolved", err)
		}
	})
}

func TestAzuriteContainerHelpers(t *testing.T) {
	cfg := storetest.AzuriteConfig(t) // exists now; deleted at the end
	ctx := t.Context()
	if err := blobstore.CreateContainer(ctx, cfg, map[string]string{"owner": "test"}); err != nil {
		t.Errorf("CreateContainer of an existing container: %v, want success", err)
	}

	fresh := cfg
	fresh.Container = cfg.Container + "-x"
	if err := blobstore.CreateContainer(ctx, fresh, map[string]string{"owner": "test"}); err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	props, err := containerClient(t, fresh).GetProperties(ctx, nil)
	if err != nil {
		t.Fatalf("new container: %v", err)
	}
	if v := props.Metadata["owner"]; v == nil || *v != "test" {
		if v = props.Metadata["Owner"]; v == nil || *v != "test" {
			t.Errorf("container metadata = %v, want owner=test", props.Metadata)
		}
	}
	if err := openAzure(t, fresh).Check(ctx); err != nil {
		t.Errorf("Check of the new container: %v", err)
	}
	if err := blobstore.DeleteContainer(ctx, fresh); err != nil {
		t.Fatalf("DeleteContainer: %v", err)
	}
	if err := blobstore.DeleteContainer(ctx, fresh); err != nil {
		t.Errorf("DeleteContainer of a deleted container: %v, want success", err)
	}
	if err := openAzure(t, fresh).Check(ctx); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Check after DeleteContainer: %v, want ErrNotFound", err)
	}

	bad := cfg
	bad.Key = otherKey
	if err := blobstore.CreateContainer(ctx, bad, nil); !errors.Is(err, blobstore.ErrUnauthorized) {
		t.Errorf("CreateContainer with a wrong key: %v, want ErrUnauthorized", err)
	}
}

// TestAzuriteLayout checks, through the SDK, that what the store writes is
// what other Azure tools (blobfuse2) expect, and that what they write reads
// back right.
func TestAzuriteLayout(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	s := openAzure(t, cfg)
	cc := containerClient(t, cfg)
	ctx := t.Context()

	mustPut(t, s, "dir", "", map[string]string{blobstore.MetaIsFolder: "true"})
	props, err := cc.NewBlobClient("dir").GetProperties(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if *props.ContentLength != 0 || props.BlobType == nil || *props.BlobType != blob.BlobTypeBlockBlob {
		t.Errorf("marker blob: length %d type %v, want an empty block blob", *props.ContentLength, props.BlobType)
	}
	found := false
	for k, v := range props.Metadata {
		if strings.EqualFold(k, blobstore.MetaIsFolder) && v != nil && *v == "true" {
			found = true
		}
	}
	if !found {
		t.Errorf("marker blob metadata = %v, want hdi_isfolder=true", props.Metadata)
	}

	// Written by another tool with mixed-case metadata keys: reported in
	// lower case, by Stat and List alike.
	if _, err := cc.NewBlockBlobClient("other").UploadBuffer(ctx, []byte("abc"), &blockblob.UploadBufferOptions{
		Metadata: map[string]*string{"Hdi_IsFolder": to.Ptr("false"), "Is_Symlink": to.Ptr("false")},
	}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	if st.Metadata[blobstore.MetaIsFolder] != "false" || st.Metadata[blobstore.MetaIsSymlink] != "false" {
		t.Errorf("Stat metadata = %v, want lower-case keys", st.Metadata)
	}
	page, err := s.List(ctx, blobstore.ListOptions{Prefix: "other"})
	if err != nil || len(page.Blobs) != 1 {
		t.Fatalf("List = %+v, %v", page, err)
	}
	lb := page.Blobs[0]
	if lb.Metadata[blobstore.MetaIsFolder] != "false" {
		t.Errorf("List metadata = %v, want lower-case keys", lb.Metadata)
	}
	// Listing and Stat must agree on the ETag's form: the filesystem
	// compares them and sends them back as If-Match.
	if lb.ETag != st.ETag || lb.Size != 3 || !lb.ModTime.Equal(st.ModTime) {
		t.Errorf("List says %+v, Stat says %+v", lb, st)
	}
	if _, err := s.ReadAt(ctx, "other", make([]byte, 3), 0, lb.ETag); err != nil {
		t.Errorf("ReadAt with the listed ETag: %v", err)
	}

	// A blob with a snapshot can still be deleted.
	if _, err := cc.NewBlobClient("other").CreateSnapshot(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "other", blobstore.Conditions{}); err != nil {
		t.Errorf("Delete of a blob with a snapshot: %v", err)
	}
	if _, err := s.Stat(ctx, "other"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Stat after Delete: %v, want ErrNotFound", err)
	}
}

// TestAzuriteWriteResults checks the attributes returned by the writes
// whose service answer lacks the size.
func TestAzuriteWriteResults(t *testing.T) {
	s := storetest.Azurite(t)
	ctx := t.Context()
	ids := []string{
		base64.StdEncoding.EncodeToString([]byte("block-0000")),
		base64.StdEncoding.EncodeToString([]byte("block-0001")),
	}
	for i, id := range ids {
		if err := s.StageBlock(ctx, "big", id, bytes.Repeat([]byte{byte('a' + i)}, 1000)); err != nil {
			t.Fatalf("StageBlock: %v", err)
		}
	}
	committed, err := s.CommitBlocks(ctx, "big", ids, blobstore.PutOptions{Metadata: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stat(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if committed.Size != 2000 || committed.ETag != st.ETag || st.Size != 2000 || committed.Metadata["a"] != "1" {
		t.Errorf("CommitBlocks = %+v; Stat = %+v", committed, st)
	}

	set, err := s.SetMetadata(ctx, "big", map[string]string{"b": "2"}, blobstore.Conditions{IfMatch: st.ETag})
	if err != nil {
		t.Fatal(err)
	}
	st2, err := s.Stat(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if set.Size != 2000 || set.ETag != st2.ETag || set.Metadata["b"] != "2" || len(set.Metadata) != 1 {
		t.Errorf("SetMetadata = %+v; Stat = %+v", set, st2)
	}
	if _, err := s.SetMetadata(ctx, "big", nil, blobstore.Conditions{IfMatch: st.ETag}); !errors.Is(err, blobstore.ErrPreconditionFailed) {
		t.Errorf("SetMetadata with a stale ETag: %v, want ErrPreconditionFailed", err)
	}

	// Reads at and past the end.
	p := make([]byte, 100)
	if n, err := s.ReadAt(ctx, "big", p, 1950, ""); n != 50 || err != io.EOF || p[49] != 'b' {
		t.Errorf("ReadAt across the end = %d, %v", n, err)
	}
	if n, err := s.ReadAt(ctx, "big", p, 2000, ""); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end = %d, %v", n, err)
	}
	if n, err := s.ReadAt(ctx, "big", p, 5000, st2.ETag); n != 0 || err != io.EOF {
		t.Errorf("ReadAt past the end = %d, %v", n, err)
	}
	if _, err := s.ReadAt(ctx, "big", p, 0, st.ETag); !errors.Is(err, blobstore.ErrPreconditionFailed) {
		t.Errorf("ReadAt with a stale ETag: %v, want ErrPreconditionFailed", err)
	}
	mustPut(t, s, "empty", "", nil)
	if n, err := s.ReadAt(ctx, "empty", p, 0, ""); n != 0 || err != io.EOF {
		t.Errorf("ReadAt of an empty blob = %d, %v", n, err)
	}

	cp, err := s.Copy(ctx, "big.copy", "big")
	if err != nil {
		t.Fatal(err)
	}
	if cp.Size != 2000 || cp.Metadata["b"] != "2" || cp.Name != "big.copy" {
		t.Errorf("Copy = %+v", cp)
	}
	if _, err := s.Copy(ctx, "x", "no-such-blob"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Copy of a missing blob: %v, want ErrNotFound", err)
	}
}

// TestAzuriteStoretestHelper checks that the helper's cleanup tolerates a
// container the test deleted itself (it would fail the test otherwise).
func TestAzuriteStoretestHelper(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	if err := blobstore.DeleteContainer(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
}

// TestAzureRetryAfter checks that a throttling answer tells NewRetrying how
// long the service asked to wait.
func TestAzureRetryAfter(t *testing.T) {
	tests := []struct {
		header, value string
		want          time.Duration
	}{
		{"Retry-After", "2", 2 * time.Second},
		{"x-ms-retry-after-ms", "250", 250 * time.Millisecond},
		{"Retry-After", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.header+"="+tt.value, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.value != "" {
					w.Header().Set(tt.header, tt.value)
				}
				w.Header().Set("x-ms-error-code", "ServerBusy")
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			defer srv.Close()
			az := openAzure(t, blobstore.AzureConfig{Endpoint: srv.URL + "/acct", Container: "data", Key: otherKey})
			_, err := az.Stat(t.Context(), "x")
			var ra blobstore.RetryAfterer
			if !errors.As(err, &ra) {
				t.Fatalf("Stat: %v does not carry a RetryAfter", err)
			}
			if got := ra.RetryAfter(); got != tt.want {
				t.Errorf("RetryAfter() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestAzureADNoToken checks that a missing Azure AD identity is reported as
// ErrUnauthorized with advice, not as a network error to retry. The
// credential chain is narrowed to the Azure CLI, which is not on PATH here.
func TestAzureADNoToken(t *testing.T) {
	for _, k := range []string{"AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_USERNAME"} {
		t.Setenv(k, "")
	}
	t.Setenv("AZURE_TOKEN_CREDENTIALS", "AzureCLICredential")
	t.Setenv("PATH", t.TempDir())
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	az := openAzure(t, blobstore.AzureConfig{Endpoint: srv.URL + "/acct", Container: "data", Auth: "azuread"})
	err := az.Check(t.Context())
	if !errors.Is(err, blobstore.ErrUnauthorized) || blobstore.Retryable(err) {
		t.Fatalf("Check without an identity: %v, want ErrUnauthorized, not retryable", err)
	}
	if !strings.Contains(err.Error(), "could not get an Azure AD token") {
		t.Errorf("Check without an identity: %v; want it to say no token could be had", err)
	}
	t.Logf("no identity: %v", err)
	if n := hits.Load(); n != 0 {
		t.Errorf("the blob endpoint saw %d requests without a token", n)
	}
}

// A mount's start-up: configuration from the environment, validated before
// any request, then a Check whose error says what to fix.
func ExampleNewAzure() {
	cfg := blobstore.AzureConfigFromEnv(os.Getenv)
	if err := cfg.Validate(); err != nil {
		log.Fatal(err) // e.g. "azure: missing account: set Account (AZURE_STORAGE_ACCOUNT) ..."
	}
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := az.Check(ctx); err != nil {
		log.Fatal(err) // e.g. `azure: container "data" at https://acct.blob.core.windows.net/: the container does not exist in this account: ...`
	}
	// Production stacks wrap the store in the retry layer.
	store := blobstore.NewRetrying(az, blobstore.RetryPolicy{})
	_ = store
}

// TestAzureExpiredSAS: a request refused (403 AuthenticationFailed, as
// Azure answers an expired SAS) with a SAS token past its expiry says the
// token expired, and when; the same answer to a SAS still valid does not
// blame its expiry. Neither shows the token.
func TestAzureExpiredSAS(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ms-error-code", "AuthenticationFailed")
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		se          string
		wantExpired string
	}{
		{"2020-01-02T03:04:05Z", "the SAS token expired at 2020-01-02T03:04:05Z"},
		{"2020-01-02", "the SAS token expired at 2020-01-02T00:00:00Z"},
		{time.Now().Add(time.Hour).UTC().Format(time.RFC3339), ""},
	} {
		token := "sv=2022-11-02&sr=c&sp=rl&se=" + url.QueryEscape(tc.se) + "&sig=CANARYsasSignature0123456789"
		az, err := blobstore.NewAzure(blobstore.AzureConfig{Endpoint: srv.URL + "/acct", Container: "data", SASToken: token})
		if err != nil {
			t.Fatal(err)
		}
		_, err = az.Stat(t.Context(), "a/b")
		if !errors.Is(err, blobstore.ErrUnauthorized) {
			t.Fatalf("se=%s: Stat: %v, want ErrUnauthorized", tc.se, err)
		}
		msg := err.Error()
		if tc.wantExpired != "" && !strings.Contains(msg, tc.wantExpired) {
			t.Errorf("se=%s: %q does not say %q", tc.se, msg, tc.wantExpired)
		}
		if tc.wantExpired == "" && strings.Contains(msg, "expired") {
			t.Errorf("se=%s (in an hour): %q blames the expiry", tc.se, msg)
		}
		if strings.Contains(msg, "CANARY") {
			t.Errorf("the error shows the SAS: %q", msg)
		}
	}
}

// TestWarnSASExpiry: a mount warns of a SAS token that has expired or
// expires within a day, with its expiry and not the token; of none else.
func TestWarnSASExpiry(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	cfgWith := func(se string) blobstore.AzureConfig {
		return blobstore.AzureConfig{Account: "acct", Container: "data", SASToken: "?sv=2022-11-02&sp=rl&se=" + url.QueryEscape(se) + "&sig=CANARYsig"}
	}
	for _, tc := range []struct {
		name string
		cfg  blobstore.AzureConfig
		want string // "" : no warning
	}{
		{"expired", cfgWith("2026-12-07T11:00:00Z"), `msg="the SAS token has expired: every request will be refused (HTTP 403) until it is replaced" expired=2026-12-07T11:00:00Z`},
		{"expires in 3h", cfgWith("2026-12-07T15:00:00Z"), `msg="the SAS token expires soon: from then on every request will be refused (HTTP 403) until it is replaced" expires=2026-12-07T15:00:00Z in=3h0m0s`},
		{"expires in a week", cfgWith("2026-12-14T12:00:00Z"), ""},
		{"connection string SAS", blobstore.AzureConfig{Container: "data", ConnectionString: "BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=2022-11-02&se=2026-12-07T13%3A00%3A00Z&sig=CANARYsig"}, "expires=2026-12-07T13:00:00Z in=1h0m0s"},
		{"account key", blobstore.AzureConfig{Account: "acct", Container: "data", Key: otherKey}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			blobstore.WarnSASExpiry(slog.New(slog.NewTextHandler(&out, nil)), tc.cfg, now)
			got := out.String()
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("logged %q, want %q", got, tc.want)
			}
			if strings.Contains(got, "CANARY") {
				t.Errorf("the warning shows the SAS: %q", got)
			}
		})
	}
}
