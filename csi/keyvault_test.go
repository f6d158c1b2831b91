package csi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/security/keyvault/azsecrets"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeKeyVault answers SecretValue from a map keyed "URL#NAME#VERSION".
type fakeKeyVault map[string]string

func (f fakeKeyVault) SecretValue(_ context.Context, vaultURL, name, version string) (string, error) {
	if v, ok := f[vaultURL+"#"+name+"#"+version]; ok {
		return v, nil
	}
	return "", &azcore.ResponseError{StatusCode: http.StatusNotFound, ErrorCode: "SecretNotFound"}
}

// staticToken is a credential that always has the same token.
type staticToken string

func (s staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: string(s), ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// keyVaultStandIn speaks the part of Key Vault's REST API that reading a
// secret uses: an unauthenticated request gets the bearer challenge, then
// GET /secrets/NAME[/VERSION] with the token gets the secret's value.
func keyVaultStandIn(t *testing.T, token string, secrets map[string]string) *httptest.Server {
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("WWW-Authenticate", `Bearer authorization="https://login.microsoftonline.com/tenant", resource="https://vault.azure.net"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet || r.URL.Query().Get("api-version") == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		ref := strings.TrimPrefix(r.URL.Path, "/secrets/")
		name, version, _ := strings.Cut(ref, "/")
		v, ok := secrets[name+"#"+version]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "SecretNotFound", "message": "A secret with (name/id) " + name + " was not found in this key vault."}})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"value": v, "id": "https://" + r.Host + "/secrets/" + name + "/0123456789abcdef0123456789abcdef"})
	}))
	t.Cleanup(ts.Close)
	return ts
}

// TestAzureKeyVaultReadsSecrets: the driver's Key Vault client, through
// the azsecrets SDK, gets a secret's current value and a given version's,
// answers the bearer challenge with the driver's token, and maps a secret
// that does not exist to FailedPrecondition and a refused token to
// PermissionDenied.
func TestAzureKeyVaultReadsSecrets(t *testing.T) {
	const version = "0123456789abcdef0123456789abcdef"
	ts := keyVaultStandIn(t, "driver-token", map[string]string{"key#": "current-key", "key#" + version: "older-key"})
	kv := &azureKeyVault{
		opts: &azsecrets.ClientOptions{
			ClientOptions: azcore.ClientOptions{Transport: ts.Client()},
			// The stand-in's host is not a vault's domain.
			DisableChallengeResourceVerification: true,
		},
		newCred: func() (azcore.TokenCredential, error) { return staticToken("driver-token"), nil },
	}
	d := &Driver{keyVault: kv}
	ctx := context.Background()
	c, err := d.keyVaultCreds(ctx, ts.URL, "key", "")
	if err != nil || c.Key != "current-key" {
		t.Fatalf("current version: %+v %v, want the key current-key", c, err)
	}
	if c, err := d.keyVaultCreds(ctx, ts.URL, "key", version); err != nil || c.Key != "older-key" {
		t.Fatalf("version %s: %+v %v, want older-key", version, c, err)
	}
	_, err = d.keyVaultCreds(ctx, ts.URL, "missing", "")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing secret: %v, want FailedPrecondition naming it", err)
	}
	refused := &azureKeyVault{opts: kv.opts, newCred: func() (azcore.TokenCredential, error) { return staticToken("someone-else"), nil }}
	_, err = (&Driver{keyVault: refused}).keyVaultCreds(ctx, ts.URL, "key", "")
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refused token: %v, want PermissionDenied", err)
	}
	if strings.Contains(err.Error(), "someone-else") {
		t.Fatalf("the token is in the error: %v", err)
	}
}

// TestKeyVaultSASToken: a secret that holds a SAS token is used as one.
func TestKeyVaultSASToken(t *testing.T) {
	d := &Driver{keyVault: fakeKeyVault{"https://kv.vault.azure.net/#sas#": "?sv=2025-01-05&sr=c&sp=rl&sig=ZmFrZQ%3D%3D"}}
	c, err := d.keyVaultCreds(context.Background(), "https://kv.vault.azure.net/", "sas", "")
	if err != nil || c.SASToken != "sv=2025-01-05&sr=c&sp=rl&sig=ZmFrZQ%3D%3D" || c.Key != "" {
		t.Fatalf("%+v %v, want the SAS token without its ?", c, err)
	}
}

// TestCheckKeyVault: the parameters' rules, with the error each breaks.
func TestCheckKeyVault(t *testing.T) {
	for _, c := range []struct {
		url, name, version string
		want               string // "" valid, else a piece of the error
	}{
		{"", "", "", ""},
		{"https://kv.vault.azure.net/", "key", "", ""},
		{"https://kv.vault.azure.net", "key", "0123456789abcdef0123456789ABCDEF", ""},
		{"https://kv.vault.azure.net/", "", "", "needs keyVaultSecretName"},
		{"", "key", "", "needs keyVaultURL"},
		{"http://kv.vault.azure.net/", "key", "", "https://NAME.vault.azure.net/"},
		{"https://kv.vault.azure.net/secrets/key", "key", "", "https://NAME.vault.azure.net/"},
		{"https://kv.vault.azure.net/?x=1", "key", "", "https://NAME.vault.azure.net/"},
		{"https://169.254.169.254/", "key", "", "instance metadata service"},
		{"https://kv.vault.azure.net/", "bad_name", "", "letters, digits and hyphens"},
		{"https://kv.vault.azure.net/", "key", "v1", "32 hexadecimal digits"},
	} {
		err := checkKeyVault(c.url, c.name, c.version)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q %q %q: %v, want valid", c.url, c.name, c.version, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q %q %q: %v, want an error with %q", c.url, c.name, c.version, err, c.want)
		}
	}
}
