package csi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
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
