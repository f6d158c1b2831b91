package blobstore_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// corruptingProxy forwards to Azurite and flips one byte of the body of
// the next `corrupt` uploads (Put Blob and Put Block), as a faulty
// network card or middlebox would.
func corruptingProxy(t *testing.T, endpoint string, corrupt *atomic.Int32) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	target := &url.URL{Scheme: u.Scheme, Host: u.Host}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.ContentLength > 0 && r.URL.Query().Get("comp") != "blocklist" && corrupt.Load() > 0 {
			corrupt.Add(-1)
			body, _ := io.ReadAll(r.Body)
			body[len(body)/2] ^= 0x20
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + u.Path
}

// TestAzureContentMD5: every upload carries its Content-MD5, so a body
// changed on the way is refused by the service, never stored; the refusal
// is transient, so the retry layer sends it again and the blob is right.
func TestAzureContentMD5(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	if err := blobstore.CreateContainer(t.Context(), cfg, nil); err != nil {
		t.Fatal(err)
	}
	var corrupt atomic.Int32
	cfg.Endpoint = corruptingProxy(t, cfg.Endpoint, &corrupt)
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	data := bytes.Repeat([]byte("blobfs checks what it sends\n"), 1000)

	// Every attempt corrupted: an error, and no blob.
	corrupt.Store(1)
	_, err = az.Put(ctx, "put", data, blobstore.PutOptions{})
	if !errors.Is(err, blobstore.ErrTransient) {
		t.Fatalf("Put with a corrupted body: %v; want a transient error (Md5Mismatch)", err)
	}
	if _, err := az.Stat(ctx, "put"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Fatalf("a corrupted Put left a blob (%v)", err)
	}
	corrupt.Store(1)
	id := base64.StdEncoding.EncodeToString([]byte("block-0000"))
	if err := az.StageBlock(ctx, "staged", id, data); !errors.Is(err, blobstore.ErrTransient) {
		t.Fatalf("StageBlock with a corrupted body: %v; want a transient error (Md5Mismatch)", err)
	}

	// One corrupted attempt under the retry layer: the retry stores the
	// right bytes.
	retrying := blobstore.NewRetrying(az, blobstore.RetryPolicy{MaxAttempts: 3})
	for _, name := range []string{"put", "staged"} {
		corrupt.Store(1)
		if name == "put" {
			if _, err := retrying.Put(ctx, name, data, blobstore.PutOptions{}); err != nil {
				t.Fatalf("Put, corrupted once: %v", err)
			}
		} else {
			if err := retrying.StageBlock(ctx, name, id, data); err != nil {
				t.Fatalf("StageBlock, corrupted once: %v", err)
			}
			if _, err := retrying.CommitBlocks(ctx, name, []string{id}, blobstore.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if corrupt.Load() != 0 {
			t.Fatalf("%s: the proxy did not see the upload", name)
		}
		got := make([]byte, len(data)+1)
		n, err := az.ReadAt(ctx, name, got, 0, "")
		if (err != nil && err != io.EOF) || !bytes.Equal(got[:n], data) {
			t.Errorf("%s: stored %d bytes (%v), differing from what was sent", name, n, err)
		}
	}
}
