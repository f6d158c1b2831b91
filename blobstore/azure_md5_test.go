package blobstore_test

import (
	"bytes"
	"context"
	"crypto/md5"
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

// TestAzureBlockMD5Given: a block's MD5 handed over with WithBlockMD5 is
// the one sent (a wrong one is refused by the service, so the right one
// was not computed again), and only for the slice it was given for.
func TestAzureBlockMD5Given(t *testing.T) {
	cfg := storetest.AzuriteConfig(t)
	if err := blobstore.CreateContainer(t.Context(), cfg, nil); err != nil {
		t.Fatal(err)
	}
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !blobstore.ChecksBlockMD5(blobstore.NewRetrying(blobstore.NewObserved(az, func(context.Context, *blobstore.Call) {}), blobstore.RetryPolicy{})) {
		t.Fatal("ChecksBlockMD5 of Azure under the retry and observing layers is false")
	}
	ctx := t.Context()
	data := bytes.Repeat([]byte("hashed once, sent once\n"), 1000)
	id := base64.StdEncoding.EncodeToString([]byte("block-0000"))
	wrong := md5.Sum([]byte("something else"))

	if err := az.StageBlock(blobstore.WithBlockMD5(ctx, data, wrong), "given", id, data); !errors.Is(err, blobstore.ErrTransient) {
		t.Fatalf("StageBlock with a wrong MD5 given: %v; want the service's refusal (Md5Mismatch, transient)", err)
	}
	// The same bytes in another slice: the given MD5 is not its.
	other := bytes.Clone(data)
	if err := az.StageBlock(blobstore.WithBlockMD5(ctx, data, wrong), "given", id, other); err != nil {
		t.Fatalf("StageBlock of another slice used the MD5 given for the first: %v", err)
	}
	if err := az.StageBlock(blobstore.WithBlockMD5(ctx, data, md5.Sum(data)), "given", id, data); err != nil {
		t.Fatalf("StageBlock with the right MD5 given: %v", err)
	}
	if _, err := az.CommitBlocks(ctx, "given", []string{id}, blobstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data)+1)
	n, _ := az.ReadAt(ctx, "given", got, 0, "")
	if !bytes.Equal(got[:n], data) {
		t.Fatalf("read back %d bytes, not the %d staged", n, len(data))
	}
}

// TestChecksBlockMD5: only a store that sends block MD5s says so, through
// any wrapper.
func TestChecksBlockMD5(t *testing.T) {
	mem := blobstore.NewMemory()
	for _, s := range []blobstore.Store{mem, blobstore.NewRetrying(mem, blobstore.RetryPolicy{}), blobstore.NewFaulty(mem, blobstore.FaultOptions{})} {
		if blobstore.ChecksBlockMD5(s) {
			t.Errorf("ChecksBlockMD5(%T) is true over the memory store", s)
		}
	}
}
