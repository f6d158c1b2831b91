package fusefs

import (
	"testing"
	"time"
)

// TestListCacheRefreshAhead: a listing in the last quarter of its life is
// claimed for a background refresh once; a fresh one is not.
func TestListCacheRefreshAhead(t *testing.T) {
	c := newListCache(200*time.Millisecond, 1000)
	c.put("d", map[string]dirEntry{"a": {kind: kindFile}})
	if c.claimRefresh("d") {
		t.Fatal("a listing just taken was claimed for refresh")
	}
	time.Sleep(170 * time.Millisecond)
	if !c.claimRefresh("d") {
		t.Fatal("a listing near its end was not claimed for refresh")
	}
	if c.claimRefresh("d") {
		t.Fatal("claimed for refresh twice")
	}
	c.put("d", map[string]dirEntry{"a": {kind: kindFile}})
	if c.claimRefresh("d") {
		t.Fatal("the refreshed listing was claimed at once")
	}
	if c.claimRefresh("other") {
		t.Fatal("a directory with no listing was claimed")
	}
	// A directory this mount is changing is not refreshed: a listing
	// fetched meanwhile would not be cached.
	c.put("w", map[string]dirEntry{})
	c.set("w", "new", dirEntry{kind: kindFile})
	time.Sleep(170 * time.Millisecond)
	if c.claimRefresh("w") {
		t.Fatal("a directory being changed here was claimed for refresh")
	}
}

// A listing whose refresh is on its way answers past its expiry, for
// twice as long as fetching it took (up to half the timeout), so that a
// refresh slower than the quarter of the timeout it starts ahead does not
// leave lookups without a listing. One not being refreshed expires on time.
func TestListCacheGraceWhileRefreshing(t *testing.T) {
	const ttl = 400 * time.Millisecond
	for _, tt := range []struct {
		took, grace time.Duration
	}{
		{0, 0},
		{50 * time.Millisecond, 100 * time.Millisecond},  // twice the fetch
		{150 * time.Millisecond, 200 * time.Millisecond}, // capped at half
	} {
		if got := refreshGrace(ttl, tt.took); got != tt.grace {
			t.Errorf("refreshGrace(%v, %v) = %v, want %v", ttl, tt.took, got, tt.grace)
		}
	}
	c := newListCache(ttl, 1000)
	start := time.Now()
	for _, d := range []string{"refreshed", "idle"} {
		fetch := c.beginFetch(d)
		fetch.start = fetch.start.Add(-100 * time.Millisecond) // a fetch of 100 ms
		if !c.putIfUnchanged(d, map[string]dirEntry{"a": {kind: kindFile}}, fetch) {
			t.Fatal("listing not stored")
		}
	}
	time.Sleep(320*time.Millisecond - time.Since(start))
	if !c.claimRefresh("refreshed") {
		t.Fatal("a listing near its end was not claimed for refresh")
	}
	time.Sleep(450*time.Millisecond - time.Since(start)) // past expiry, within the 200 ms grace
	if _, found, ok := c.lookup("refreshed", "a"); !ok || !found {
		t.Fatalf("a listing being refreshed did not answer just past its expiry: found %v ok %v", found, ok)
	}
	if _, _, ok := c.lookup("idle", "a"); ok {
		t.Fatal("a listing not being refreshed answered past its expiry")
	}
	time.Sleep(650*time.Millisecond - time.Since(start)) // past the grace: the refresh failed
	if _, _, ok := c.lookup("refreshed", "a"); ok {
		t.Fatal("a listing answered past its grace")
	}
}

// TestListCacheStaleListingNotCached: a listing fetched while this mount
// changed its directory may lack the change, and is not cached.
func TestListCacheStaleListingNotCached(t *testing.T) {
	c := newListCache(time.Minute, 1000)
	for _, change := range []struct {
		name string
		do   func()
	}{
		{"create", func() { c.set("d", "new", dirEntry{kind: kindFile}) }},
		{"unlink", func() { c.remove("d", "old") }},
		{"rename of a parent", func() { c.invalidateTree("") }},
		{"invalidate", func() { c.invalidate("d") }},
	} {
		fetch := c.beginFetch("d")
		change.do()
		if c.putIfUnchanged("d", map[string]dirEntry{"old": {kind: kindFile}}, fetch) {
			t.Errorf("%s: a listing taken before the change was cached", change.name)
		}
		if _, _, ok := c.lookup("d", "old"); ok {
			t.Errorf("%s: the stale listing answers lookups", change.name)
		}
	}
	fetch := c.beginFetch("d")
	c.set("elsewhere/x", "y", dirEntry{}) // another directory (unless it shares a bucket)
	if genBucket("elsewhere/x") != genBucket("d") && !c.putIfUnchanged("d", map[string]dirEntry{}, fetch) {
		t.Error("a change elsewhere kept the listing out")
	}
}

// TestListCacheSecondMiss: the first lookup that misses in a directory is
// probed; another within the listing timeout lists the directory.
func TestListCacheSecondMiss(t *testing.T) {
	c := newListCache(100*time.Millisecond, 1000)
	if c.secondMiss("d") {
		t.Fatal("first miss in d asked for a listing")
	}
	if c.secondMiss("e") {
		t.Fatal("first miss in e asked for a listing")
	}
	if !c.secondMiss("d") {
		t.Fatal("second miss in d did not ask for a listing")
	}
	if c.secondMiss("d") {
		t.Fatal("the miss after a listing was asked for asked again")
	}
	time.Sleep(150 * time.Millisecond)
	if c.secondMiss("e") {
		t.Fatal("a miss after the listing timeout counted as a second one")
	}
}
