package blobstore

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestRefusedAddr: the addresses blob requests never go to, and some they
// may (Azurite on loopback, private endpoints).
func TestRefusedAddr(t *testing.T) {
	for _, c := range []struct {
		addr    string
		refused bool
	}{
		{"169.254.169.254", true},
		{"::ffff:169.254.169.254", true},
		{"169.254.1.1", true},
		{"168.63.129.16", true},
		{"fe80::1", true},
		{"0.0.0.0", true},
		{"::", true},
		{"224.0.0.1", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"10.1.2.3", false},
		{"192.168.0.10", false},
		{"20.60.1.1", false},
	} {
		if got := refusedAddr(netip.MustParseAddr(c.addr)) != ""; got != c.refused {
			t.Errorf("%s: refused %v, want %v", c.addr, got, c.refused)
		}
	}
}

// TestEndpointAtRefusedAddress: an endpoint whose host is such an address
// is refused when it is checked, with a message that says why.
func TestEndpointAtRefusedAddress(t *testing.T) {
	for _, ep := range []string{
		"http://169.254.169.254/metadata",
		"http://169.254.169.254:80/",
		"https://[fe80::1]/acct/",
		"http://168.63.129.16/",
		"http://[::ffff:169.254.169.254]/",
	} {
		err := CheckEndpoint(ep)
		if err == nil || !strings.Contains(err.Error(), "blobfs does not send blob requests to") {
			t.Errorf("CheckEndpoint(%q) = %v, want a refusal", ep, err)
		}
	}
	for _, ep := range []string{"http://127.0.0.1:10000/devstoreaccount1", "https://acct.blob.core.windows.net/", "http://10.0.0.4/"} {
		if err := CheckEndpoint(ep); err != nil {
			t.Errorf("CheckEndpoint(%q) = %v, want it allowed", ep, err)
		}
	}
}

// TestRefusedAfterResolution: a connection to a refused address fails
// before it is made (guardDial runs after name resolution, so a host name
// that resolves there fails the same way), and the store's error for it is
// not one to retry.
func TestRefusedAfterResolution(t *testing.T) {
	tr := newHTTPClient(true).Transport.(*http.Transport)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := tr.DialContext(ctx, "tcp", "169.254.169.254:80")
	if err == nil {
		c.Close()
		t.Fatal("connected to the metadata service's address")
	}
	var refused *refusedEndpointError
	if !errors.As(err, &refused) {
		t.Fatalf("dial: %v, want a refusal", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the refusal took %v: it must come before any connection attempt", d)
	}
	mapped := mapAzureError(context.Background(), OpStat, "x", Conditions{}, err)
	if Retryable(mapped) {
		t.Errorf("%v is retryable: a refused endpoint is configuration", mapped)
	}
	if !strings.Contains(mapped.Error(), "instance metadata service") {
		t.Errorf("%v does not say why", mapped)
	}
}
