package blobstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		secrets  []string // must be gone
		keep     []string // must stay
	}{
		{"url error", `Get "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2030-01-01T00%3A00%3A00Z&sp=rl&sig=AbC%2Bdef%3D&skoid=0000-1111": dial tcp: connection refused`,
			[]string{"AbC%2Bdef%3D", "AbC", "0000-1111", "2030-01-01"}, []string{"https://acct.blob.core.windows.net/c/b", "connection refused", "sig=REDACTED"}},
		{"query first", "https://x/c?sig=S3cretSig&comp=list", []string{"S3cretSig"}, []string{"comp=list"}},
		{"token alone", "the SAS token sv=2022-11-02&ss=b&sig=tokSECRET is bad", []string{"tokSECRET"}, []string{"is bad"}},
		{"url-encoded url in a query", "x-ms-copy-source=https%3A%2F%2Fa%2Fb%3Fsv%3D1%26sig%3DencSECRET%26x%3D1 done", []string{"encSECRET"}, []string{"done"}},
		{"connection string key", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyS0VZ+/==;EndpointSuffix=core.windows.net",
			[]string{"Zm9vYmFyS0VZ+/=="}, []string{"AccountName=acct", "EndpointSuffix=core.windows.net"}},
		{"connection string SAS", "BlobEndpoint=https://a/;SharedAccessSignature=sv=2022-11-02&sp=rl&sig=csSECRET",
			[]string{"csSECRET"}, []string{"BlobEndpoint=https://a/"}},
		{"headers", "Authorization: SharedKey acct:hmacSECRET=\r\nx-ms-copy-source: https://a/c/b?sig=hdrSECRET\r\nx-ms-version: 2025-01-05",
			[]string{"hmacSECRET", "hdrSECRET"}, []string{"x-ms-version: 2025-01-05"}},
		{"bearer", `{"error": "Bearer eyJhbGciOi.jwtSECRET.sig rejected"}`, []string{"jwtSECRET"}, []string{"rejected"}},
		{"bare bearer", `token Bearer eyJhbGciOi.jwtSECRET2.sig rejected`, []string{"jwtSECRET2"}, []string{"rejected"}},
		{"bare bearer, upper case", `BEARER eyJhbGciOi.jwtSECRET3.sig`, []string{"jwtSECRET3"}, nil},
		{"client secret in a form", "grant_type=client_credentials&client_secret=clSECRET&scope=x", []string{"clSECRET"}, []string{"scope=x"}},
		{"nothing to redact", `azure: Stat "dir/a=b": blob not found: HTTP 404 BlobNotFound`, nil, []string{`azure: Stat "dir/a=b": blob not found: HTTP 404 BlobNotFound`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := blobstore.Redact(tc.in)
			for _, s := range tc.secrets {
				if strings.Contains(got, s) {
					t.Errorf("Redact left %q in %q", s, got)
				}
			}
			for _, s := range tc.keep {
				if !strings.Contains(got, s) {
					t.Errorf("Redact removed %q: %q", s, got)
				}
			}
		})
	}
}

func TestRedactError(t *testing.T) {
	ue := &url.Error{Op: "Get", URL: "https://a/c/b?sv=1&sig=urlSECRET", Err: errors.New("connection reset")}
	err := blobstore.RedactError(fmt.Errorf("read: %w", ue))
	if strings.Contains(err.Error(), "urlSECRET") {
		t.Errorf("message keeps the secret: %v", err)
	}
	var got *url.Error
	if !errors.As(err, &got) || strings.Contains(got.URL, "urlSECRET") {
		t.Errorf("the *url.Error inside keeps the secret: %v", got)
	}
	if !errors.Is(err, ue) {
		t.Error("errors.Is no longer reaches the cause")
	}
	if blobstore.RedactError(nil) != nil {
		t.Error("RedactError(nil) != nil")
	}
}

// canary is a credential whose every fragment is searched for in what the
// code under test prints.
type canary struct {
	name   string
	cfg    blobstore.AzureConfig
	secret string            // the value that must never appear
	env    map[string]string // for Azure AD
}

// leaks reports which fragments of secret (every run of 10 characters, and
// the whole in URL-encoded form) appear in out.
func leaks(out, secret string) []string {
	var found []string
	check := func(frag string) {
		if strings.Contains(out, frag) {
			found = append(found, frag)
		}
	}
	const n = 10
	for i := 0; i+n <= len(secret); i++ {
		check(secret[i : i+n])
	}
	if q := url.QueryEscape(secret); q != secret {
		check(q)
	}
	return found
}

// hostileAzure answers every request with status and an error body whose
// message quotes the request's URL and Authorization header, as a
// misbehaving service or proxy might: redaction must not rely on the
// service's manners.
func hostileAzure(status int, code string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "0")
		}
		w.Header().Set("x-ms-error-code", code)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="utf-8"?><Error><Code>%s</Code><Message>refused %s with Authorization: %s</Message></Error>`,
			code, r.URL.String(), r.Header.Get("Authorization"))
	})
}

// TestAzureErrorsCarryNoSecret runs every store operation, with every kind
// of credential, against every failure that can be provoked locally, and
// searches the errors and the debug log for any fragment of the secret.
func TestAzureErrorsCarryNoSecret(t *testing.T) {
	const account = "canaryacct"
	keySecret := base64.StdEncoding.EncodeToString([]byte("CANARY-account-key-7f3a9c1e5b"))
	sig := "CANARYsig7f3a9c1e5b2d4f6a8b0c"
	sasToken := "sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00:00:00Z&sig=" + url.QueryEscape(sig+"+/=")

	// Endpoints that fail each in their own way.
	refused := func() string { // a port nobody listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return "http://" + addr + "/" + account
	}()
	hung := storetest.HungAddr(t)
	endpoints := map[string]string{
		"refused": refused,
		"hung":    "http://" + hung + "/" + account,
	}
	for _, s := range []struct {
		name   string
		status int
		code   string
	}{
		{"403", http.StatusForbidden, "AuthenticationFailed"},
		{"404", http.StatusNotFound, "ContainerNotFound"},
		{"throttled", http.StatusServiceUnavailable, "ServerBusy"},
		{"500", http.StatusInternalServerError, "InternalError"},
	} {
		srv := httptest.NewServer(hostileAzure(s.status, s.code))
		t.Cleanup(srv.Close)
		endpoints[s.name] = srv.URL + "/" + account
	}

	for _, ep := range []string{"refused", "hung", "403", "404", "throttled", "500"} {
		endpoint := endpoints[ep]
		canaries := []canary{
			{name: "key", secret: keySecret, cfg: blobstore.AzureConfig{Account: account, Key: keySecret, Endpoint: endpoint}},
			{name: "sas", secret: sig, cfg: blobstore.AzureConfig{Account: account, SASToken: "?" + sasToken, Endpoint: endpoint}},
			{name: "connstr key", secret: keySecret, cfg: blobstore.AzureConfig{
				ConnectionString: "DefaultEndpointsProtocol=http;AccountName=" + account + ";AccountKey=" + keySecret + ";BlobEndpoint=" + endpoint + ";"}},
			{name: "connstr sas", secret: sig, cfg: blobstore.AzureConfig{
				ConnectionString: "BlobEndpoint=" + endpoint + ";SharedAccessSignature=" + sasToken}},
		}
		for _, c := range canaries {
			t.Run(ep+"/"+c.name, func(t *testing.T) {
				c.cfg.Container = "data"
				c.cfg.TryTimeout = 200 * time.Millisecond
				out := exerciseStore(t, c.cfg)
				if l := leaks(out, c.secret); len(l) > 0 {
					t.Fatalf("output carries the secret (%q):\n%s", l, out)
				}
			})
		}
	}

	t.Run("azuread client secret", func(t *testing.T) {
		// The token request fails (nobody listens at the authority),
		// which is the failure that quotes the identity provider's
		// request. Only EnvironmentCredential runs: no request leaves
		// this machine.
		clientSecret := "CANARY7f3a9c1e5bQzXw0dK4"
		authority, _ := strings.CutPrefix(refused, "http://")
		authority, _, _ = strings.Cut(authority, "/")
		t.Setenv("AZURE_TOKEN_CREDENTIALS", "EnvironmentCredential")
		t.Setenv("AZURE_TENANT_ID", "00000000-0000-0000-0000-000000000001")
		t.Setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-000000000002")
		t.Setenv("AZURE_CLIENT_SECRET", clientSecret)
		t.Setenv("AZURE_AUTHORITY_HOST", "https://"+authority+"/")
		tls := httptest.NewTLSServer(hostileAzure(http.StatusForbidden, "AuthenticationFailed"))
		t.Cleanup(tls.Close)
		cfg := blobstore.AzureConfig{Auth: "azuread", Endpoint: tls.URL + "/" + account, Container: "data", TryTimeout: 200 * time.Millisecond}
		out := exerciseStore(t, cfg)
		if !strings.Contains(out, "token") {
			t.Fatalf("expected token failures, got:\n%s", out)
		}
		if l := leaks(out, clientSecret); len(l) > 0 {
			t.Fatalf("output carries the client secret (%q):\n%s", l, out)
		}
	})

	t.Run("bad configuration", func(t *testing.T) {
		for _, cfg := range []blobstore.AzureConfig{
			{Container: "data", Endpoint: "https://acct.example/?sv=1&sig=" + sig},
			{Container: "data", Endpoint: "https://a b/?sig=" + sig},
			{Container: "data", Account: account, Key: keySecret, SASToken: sasToken},
			{Container: "data", ConnectionString: "AccountName=" + account + ";AccountKey=" + keySecret + ";SharedAccessSignature=" + sasToken},
			{Container: "data", ConnectionString: "AccountKey=" + keySecret},
			{Container: "data", Account: account, Key: "not base64 " + keySecret},
		} {
			_, err := blobstore.NewAzure(cfg)
			if err == nil {
				t.Fatalf("NewAzure(%v) accepted a bad configuration", cfg)
			}
			out := err.Error() + "\n" + cfg.String() + "\n" + fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg)
			if l := append(leaks(out, sig), leaks(out, keySecret)...); len(l) > 0 {
				t.Errorf("configuration error carries a secret (%q): %s", l, out)
			}
		}
	})
}

// exerciseStore calls every Store operation once, through the retry and
// logging layers as blobfs stacks them, and returns everything printed:
// each error in several formats, the *url.Error inside if any, and the
// debug log.
var blockID0 = base64.StdEncoding.EncodeToString([]byte("block-000"))

func exerciseStore(t *testing.T, cfg blobstore.AzureConfig) string {
	t.Helper()
	var out bytes.Buffer
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatalf("NewAzure: %v", err)
	}
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store := blobstore.NewRetrying(blobstore.NewLogged(az, log), blobstore.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	record := func(op string, err error) {
		if err == nil {
			t.Errorf("%s succeeded against a failing endpoint", op)
			return
		}
		fmt.Fprintf(&out, "%s: %v | %+v | %q\n", op, err, err, err.Error())
		var ue *url.Error
		if errors.As(err, &ue) {
			fmt.Fprintf(&out, "  url.Error: %s %v\n", ue.URL, ue)
		}
	}
	_, err = store.Stat(ctx, "a/b")
	record("Stat", err)
	_, err = store.ReadAt(ctx, "a/b", make([]byte, 8), 0, "")
	record("ReadAt", err)
	_, err = store.List(ctx, blobstore.ListOptions{Prefix: "a/", Delimiter: "/"})
	record("List", err)
	_, err = store.Put(ctx, "a/b", []byte("x"), blobstore.PutOptions{})
	record("Put", err)
	record("StageBlock", store.StageBlock(ctx, "a/b", blockID0, []byte("x")))
	_, err = store.CommitBlocks(ctx, "a/b", []string{blockID0}, blobstore.PutOptions{})
	record("CommitBlocks", err)
	record("Delete", store.Delete(ctx, "a/b", blobstore.Conditions{}))
	_, err = store.Copy(ctx, "a/c", "a/b")
	record("Copy", err)
	_, err = store.SetMetadata(ctx, "a/b", map[string]string{"k": "v"}, blobstore.Conditions{})
	record("SetMetadata", err)
	record("Check", az.Check(ctx))
	fmt.Fprintf(&out, "store: %v %s\n", az, cfg)
	return out.String()
}

func TestRedactingHandler(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(blobstore.NewRedactingHandler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ue := &url.Error{Op: "Put", URL: "https://a/c/b?sv=1&sig=hSECRET1", Err: errors.New("reset")}
	log.With("endpoint", "https://a/?sig=hSECRET2").
		WithGroup("req").
		Warn("lookup failed for https://a/c?sig=hSECRET3",
			"err", ue, "url", "https://a/c?sig=hSECRET4", "n", 3,
			slog.Group("hdr", "auth", "Authorization: Bearer hSECRET5"),
			"raw", []byte("AccountKey=hSECRET6;"))
	got := out.String()
	for i := 1; i <= 6; i++ {
		if s := fmt.Sprintf("hSECRET%d", i); strings.Contains(got, s) {
			t.Errorf("log line keeps %s: %s", s, got)
		}
	}
	for _, keep := range []string{"lookup failed for https://a/c?sig=REDACTED", "req.n=3", "endpoint="} {
		if !strings.Contains(got, keep) {
			t.Errorf("log line lacks %q: %s", keep, got)
		}
	}
}

// TestRedactCanaries feeds Redact each form in which a credential has
// reached, or could reach, a log line, an event or a terminal (issue 38),
// each with its own canary, and ordinary text that must come out as it
// went in: volume ids, paths, blob names, the driver's own messages.
func TestRedactCanaries(t *testing.T) {
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.CANARYjwtSig0a1b2c3d4e5f"
	for _, tc := range []struct {
		name   string
		in     string
		canary string // must be gone; "" for ordinary text, which must stay as it is
		keep   string // must stay (the shape of what was redacted)
	}{
		// How protosanitizer prints a request: JSON, & escaped as \u0026.
		{"volume_context as JSON", `{"volume_context":{"azurestorageaccountkey":"CANARYjsonKey0a1b2c3d4e","containerName":"data"},"volume_id":"acct#data"}`,
			"CANARYjsonKey0a1b2c3d4e", `"containerName":"data"`},
		{"SAS token as JSON", `{"parameters":{"azurestorageaccountsastoken":"sv=2022-11-02\u0026sp=rl\u0026sig=CANARYjsonSas0a1b2c3d"}}`,
			"CANARYjsonSas0a1b2c3d", `"azurestorageaccountsastoken":"REDACTED"`},
		{"connection string as JSON", `{"azurestorageconnectionstring":"BlobEndpoint=https://a/;SharedAccessSignature=sv=1\u0026sig=CANARYjsonConn0a1b2c"}`,
			"CANARYjsonConn0a1b2c", `"azurestorageconnectionstring":"REDACTED"`},
		{"msisecret as JSON", `{"msisecret":"CANARYmsi0a1b2c3d4e5f"}`, "CANARYmsi0a1b2c3d4e5f", `"msisecret"`},
		{"JSON quoted again", `request="{\"volume_context\":{\"azurestorageaccountkey\":\"CANARYquoted0a1b2c3d\"}}"`,
			"CANARYquoted0a1b2c3d", `\"volume_context\"`},
		{"SAS with \\u0026 and no ?", `token sv=2022-11-02\u0026ss=b\u0026srt=sco\u0026sp=rl\u0026se=2099-01-01T00:00:00Z\u0026sig=CANARYu0026Sig0a1b2c3 rejected`,
			"CANARYu0026Sig0a1b2c3", "rejected"},
		{"starts with sig=", "sig=CANARYbareSig0a1b2c3d%3D&se=2099-01-01", "CANARYbareSig0a1b2c3d", "sig=REDACTED"},
		{"quoted, starts with sig=", `--log-level "sig=CANARYquotedSig0a1b2c": use debug, info, warn or error`, "CANARYquotedSig0a1b2c", "use debug"},
		{"%+v of a struct with a Key field", fmt.Sprintf("%+v", struct{ Account, Key, Container string }{"acct", "CANARYstructKey0a1b2c3d+/==", "data"}),
			"CANARYstructKey0a1b2c3d", "Container:data"},
		{"%+v of nested credentials", fmt.Sprintf("%+v", struct {
			Name  string
			Creds struct{ Account, SASToken string }
		}{"v1", struct{ Account, SASToken string }{"acct", "sv=1&sp=r&sig=CANARYnested0a1b2c3d"}}), "CANARYnested0a1b2c3d", "Name:v1"},
		{"bare JWT", "kubelet token " + jwt + " expired", "CANARYjwtSig0a1b2c3d4e5f", "expired"},
		{"bare JWT payload", "token=" + jwt, "eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ", ""},
		{"mount option -o", "-o allow_other,azurestorageaccountkey=CANARYmountOpt0a1b2c3d,attr_timeout=1", "CANARYmountOpt0a1b2c3d", "attr_timeout=1"},
		{"mount flag --", `["--azurestorageaccountsastoken=sv=2022-11-02&sig=CANARYmountFlag0a1b2c" "ro"]`, "CANARYmountFlag0a1b2c", `"ro"`},
		{"%v of a map", fmt.Sprint(map[string]string{"msisecret": "CANARYmap0a1b2c3d4e5f", "server": "acct.blob.core.windows.net"}),
			"CANARYmap0a1b2c3d4e5f", "server:acct.blob.core.windows.net"},
		{"environment", "AZURE_STORAGE_SAS_TOKEN=CANARYenv0a1b2c3d4e5f AZURE_STORAGE_ACCOUNT=acct", "CANARYenv0a1b2c3d4e5f", "AZURE_STORAGE_ACCOUNT=acct"},

		// Ordinary text: nothing to redact, and nothing redacted.
		{"volume id", "canaryacct#data#https://canaryacct.blob.core.windows.net/", "", ""},
		{"kubelet path", "/var/lib/kubelet/pods/0b1c/volumes/kubernetes.io~csi/pv-sig-1/mount", "", ""},
		{"blob names", `Stat "photos/Key:2024/design=3/sig-file.eyJ.txt": blob not found`, "", ""},
		{"request without secrets", `{"volume_context":{"containerName":"data","csi.storage.k8s.io/pvc/name":"data-0","secretName":"acct-key","storageAccount":"acct"},"volume_id":"acct#data"}`, "", ""},
		{"the driver's own message", "secrets: give one of azurestorageaccountkey, azurestorageaccountsastoken or azurestorageconnectionstring, not several", "", ""},
		{"empty Key field", "{Account:acct Key: SASToken: Container:data}", "", ""},
		{"a sig= blob prefix inside a path", "list data/sig=1/ failed", "", ""},
		{"key words in prose", "the account key is wrong: HTTP 403 AuthenticationFailed", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := blobstore.Redact(tc.in)
			if tc.canary == "" {
				if got != tc.in {
					t.Errorf("Redact changed ordinary text:\n in: %s\nout: %s", tc.in, got)
				}
				return
			}
			if strings.Contains(got, tc.canary) {
				t.Errorf("Redact left the canary %q in %s", tc.canary, got)
			}
			if !strings.Contains(got, tc.keep) {
				t.Errorf("Redact removed %q: %s", tc.keep, got)
			}
		})
	}
}

// TestRedactingHandlerValues logs values whose secret shows only in the
// form the handler prints them in (%+v of a struct, a map, a JSON
// request), through the text and the JSON handler.
func TestRedactingHandlerValues(t *testing.T) {
	type creds struct{ Account, Key string }
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var out bytes.Buffer
			var h slog.Handler = slog.NewTextHandler(&out, nil)
			if format == "json" {
				h = slog.NewJSONHandler(&out, nil)
			}
			log := slog.New(blobstore.NewRedactingHandler(h))
			log.Info("staging", "creds", creds{"acct", "CANARYhandlerKey0a1b2c"},
				"volume_context", map[string]string{"azurestorageaccountkey": "CANARYhandlerMap0a1b2c", "containerName": "data"},
				"request", `{"volume_context":{"azurestorageaccountsastoken":"sv=1\u0026sig=CANARYhandlerJSON0a1b"}}`,
				"volume", "acct#data", "path", "/var/lib/kubelet/pods/x/mount")
			got := out.String()
			for _, c := range []string{"CANARYhandlerKey0a1b2c", "CANARYhandlerMap0a1b2c", "CANARYhandlerJSON0a1b"} {
				if strings.Contains(got, c) {
					t.Errorf("log keeps %s: %s", c, got)
				}
			}
			for _, keep := range []string{"acct#data", "/var/lib/kubelet/pods/x/mount", "containerName"} {
				if !strings.Contains(got, keep) {
					t.Errorf("log lacks %q: %s", keep, got)
				}
			}
		})
	}
}
