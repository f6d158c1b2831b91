package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// Environment variables that select the Azurite backend in tests.
const (
	// EnvAzurite enables tests against Azurite. Its value is the blob
	// endpoint including the account, path style:
	// http://127.0.0.1:10000/devstoreaccount1 (what .ci/azurite.sh start
	// serves).
	EnvAzurite = "BLOBFS_TEST_AZURITE"
	// EnvAzuriteKey overrides the account key, for an Azurite started with
	// its own AZURITE_ACCOUNTS. Unset means Azurite's well-known key
	// (blobstore.AzuriteAccountKey).
	EnvAzuriteKey = "BLOBFS_TEST_AZURITE_KEY"
)

// cleanupTimeout bounds one attempt to create a test's container, and its
// deletion at the end of the test.
const cleanupTimeout = 30 * time.Second

// Azurite returns a Store over a fresh, empty container in the Azurite
// named by $BLOBFS_TEST_AZURITE, deleted again when the test ends: a
// *blobstore.Azure behind blobstore.NewRetrying with the default policy.
// Without that variable the test is skipped; with it, any failure to reach
// Azurite is a test failure, never a skip, so that CI cannot go green by
// accident.
//
// Each call makes its own container. A test that also needs the
// configuration (to look at blobs through the SDK, or to open the store with
// other credentials) calls AzuriteConfig and opens the store itself with
// blobstore.NewAzure.
func Azurite(t testing.TB) blobstore.Store {
	t.Helper()
	cfg := AzuriteConfig(t)
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatalf("storetest: open Azurite store: %v", err)
	}
	// As in production: the SDK makes one try per call and NewRetrying
	// absorbs the emulator's occasional hiccups.
	return blobstore.NewRetrying(az, blobstore.RetryPolicy{})
}

// AzuriteConfig creates a fresh, uniquely named container in the Azurite
// named by $BLOBFS_TEST_AZURITE, registers its deletion with t.Cleanup, and
// returns a shared-key configuration for it. It skips the test when the
// variable is unset and fails it on any other problem.
func AzuriteConfig(t testing.TB) blobstore.AzureConfig {
	t.Helper()
	endpoint := os.Getenv(EnvAzurite)
	if endpoint == "" {
		t.Skipf("Azurite tests disabled: set %s=http://127.0.0.1:10000/devstoreaccount1 after `.ci/azurite.sh install && .ci/azurite.sh start`", EnvAzurite)
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		t.Fatalf("storetest: %s=%q is not a blob endpoint URL like http://127.0.0.1:10000/devstoreaccount1", EnvAzurite, endpoint)
	}
	// Azurite is addressed path style: the account is the first path
	// segment.
	account, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if account == "" {
		t.Fatalf("storetest: %s=%q names no account; expected http://HOST:PORT/ACCOUNT", EnvAzurite, endpoint)
	}
	key := os.Getenv(EnvAzuriteKey)
	if key == "" {
		key = blobstore.AzuriteAccountKey
	}
	cfg := blobstore.AzureConfig{
		Account:   account,
		Container: containerName(t),
		Endpoint:  endpoint,
		Key:       key,
		Auth:      blobstore.AzureAuthKey,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("storetest: Azurite config: %v", err)
	}

	if err := createContainer(cfg); err != nil {
		t.Fatalf("storetest: create container %q in Azurite at %s (is it running? `.ci/azurite.sh start`): %v", cfg.Container, endpoint, err)
	}
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := blobstore.DeleteContainer(ctx, cfg); err != nil {
			t.Errorf("storetest: delete container %q: %v", cfg.Container, err)
		}
	})
	return cfg
}

// createContainer creates cfg's container, trying again while Azurite is
// slow or refuses for a moment: the single-threaded emulator stalls while
// its blob GC runs (for minutes on a store a test run filled; .ci/azurite.sh
// now runs it once a day, but an Azurite started otherwise does not), and a
// test that never got its container proves nothing about blobfs. Each attempt has cleanupTimeout; attempts that
// time out go on for createPatience. Other transient errors (a connection
// refused) get three attempts, so that an Azurite that is not running
// fails within a second or two, with the message that says to start it;
// any other error fails at once.
func createContainer(cfg blobstore.AzureConfig) error {
	start := time.Now()
	var err error
	for i := 0; ; i++ {
		if i > 0 {
			time.Sleep(min(time.Duration(i)*500*time.Millisecond, 5*time.Second))
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		err = blobstore.CreateContainer(ctx, cfg, nil)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || !(timedOut || blobstore.Retryable(err)) {
			return err
		}
		if !timedOut && i >= 2 || time.Since(start) > createPatience {
			return fmt.Errorf("%w (%d attempts in %v)", err, i+1, time.Since(start).Round(time.Second))
		}
	}
}

// createPatience is how long createContainer keeps trying.
const createPatience = 3 * time.Minute

// containerName makes a valid container name (3-63 characters of [a-z0-9-],
// no leading, trailing or doubled hyphen) from the test's name plus a random
// suffix, so that tests in parallel and reruns never share a container and a
// leftover one says which test made it.
func containerName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("t-")
	dash := true
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 40 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	if !dash {
		b.WriteByte('-')
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		t.Fatalf("storetest: random container suffix: %v", err)
	}
	b.WriteString(hex.EncodeToString(suffix[:]))
	return b.String()
}
