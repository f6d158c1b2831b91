package handoff

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// The keeper does not care what the fds are: these tests pass memfds whose
// content names them, and check that what an adopter gets back is the same
// open file (a write through one is read through the other).

func memfd(t *testing.T, content string) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("keeper-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func fileContent(t *testing.T, f *os.File) string {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func startKeeper(t *testing.T, path string) (k *Keeper, stop func()) {
	t.Helper()
	k = NewKeeper(path, storetest.Logger(t))
	return k, startKeeperWith(t, k, path)
}

// startKeeperWith runs k and waits until it listens at path.
func startKeeperWith(t *testing.T, k *Keeper, path string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	// Listening once a client can connect.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if sc, err := dialSeq(path); err == nil {
			sc.c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("keeper did not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitHeld waits until the keeper holds n mounts.
func waitHeld(t *testing.T, k *Keeper, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(k.Mounts()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("keeper holds %v, want %d mounts", k.Mounts(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func holdTestMount(t *testing.T, c *Client, key string) (fuse, state *os.File) {
	t.Helper()
	fuse, state = memfd(t, "fuse:"+key), memfd(t, "state:"+key)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Hold(key, int(fuse.Fd()), state, []byte("record of "+key)); err != nil {
		t.Fatalf("hold %s: %v", key, err)
	}
	return fuse, state
}

func adoptAll(t *testing.T, c *Client) map[string]HeldMount {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := c.Adopt(ctx)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	m := map[string]HeldMount{}
	for _, h := range got {
		m[h.Key] = h
		t.Cleanup(func() { h.Fuse.Close(); h.State.Close() })
	}
	return m
}

func checkAdopted(t *testing.T, got map[string]HeldMount, want ...string) {
	t.Helper()
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sort.Strings(want)
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("adopted %v, want %v", keys, want)
	}
	for _, k := range want {
		h := got[k]
		if c := fileContent(t, h.Fuse); c != "fuse:"+k {
			t.Errorf("%s: fuse fd holds %q", k, c)
		}
		if c := fileContent(t, h.State); c != "state:"+k {
			t.Errorf("%s: state fd holds %q", k, c)
		}
		if string(h.Record) != "record of "+k {
			t.Errorf("%s: record %q", k, h.Record)
		}
	}
}

func TestKeeperAdoptWaitsForRelease(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	startKeeper(t, sock)

	var released atomic.Bool
	first := Dial(sock, storetest.Logger(t), func() {
		time.Sleep(100 * time.Millisecond) // draining takes a while
		released.Store(true)
	})
	defer first.Close()
	holdTestMount(t, first, "/a")
	fb, _ := holdTestMount(t, first, "/b")
	holdTestMount(t, first, "/c")
	if err := first.Drop("/c"); err != nil {
		t.Fatal(err)
	}

	second := Dial(sock, storetest.Logger(t), nil)
	defer second.Close()
	got := adoptAll(t, second)
	if !released.Load() {
		t.Fatal("the mounts were handed over before their owner released them")
	}
	if !first.Released() {
		t.Error("first server does not know it released")
	}
	checkAdopted(t, got, "/a", "/b")
	// The same open file, not a copy.
	fb.WriteAt([]byte("FUSE"), 0)
	if c := fileContent(t, got["/b"].Fuse); c != "FUSE:/b" {
		t.Errorf("adopted fd is not the held file: %q", c)
	}
}

func TestKeeperRestartReattach(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	_, stop := startKeeper(t, sock)
	owner := Dial(sock, storetest.Logger(t), func() {})
	defer owner.Close()
	holdTestMount(t, owner, "/a")
	holdTestMount(t, owner, "/b")

	// The keeper dies with everything it held; the owner still serves and
	// gives it all to the next keeper.
	stop()
	k2, _ := startKeeper(t, sock)
	waitHeld(t, k2, 2) // a fresh keeper knows only what is given back to it
	second := Dial(sock, storetest.Logger(t), nil)
	defer second.Close()
	got := adoptAll(t, second)
	checkAdopted(t, got, "/a", "/b")
	if !owner.Released() {
		t.Error("the reattached owner was not asked to release")
	}
}

func TestKeeperHandoffToNewerKeeper(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	startKeeper(t, sock)
	var released atomic.Bool
	owner := Dial(sock, storetest.Logger(t), func() { released.Store(true) })
	defer owner.Close()
	holdTestMount(t, owner, "/a")
	holdTestMount(t, owner, "/b")

	// A newer keeper on the same socket takes over; the old one idles.
	startKeeper(t, sock)
	// The owner unmounts /b while it moves to the new keeper.
	deadline := time.Now().Add(20 * time.Second)
	for owner.Drop("/b") != nil {
		if time.Now().After(deadline) {
			t.Fatal("owner did not reconnect to the new keeper")
		}
		time.Sleep(20 * time.Millisecond)
	}
	second := Dial(sock, storetest.Logger(t), nil)
	defer second.Close()
	got := adoptAll(t, second)
	if !released.Load() {
		t.Fatal("adopted from the new keeper before the owner released")
	}
	checkAdopted(t, got, "/a")
}

func TestKeeperAdopterWaitsForOwnerAfterHandoff(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	startKeeper(t, sock)
	var released atomic.Bool
	owner := Dial(sock, storetest.Logger(t), func() { released.Store(true) })
	defer owner.Close()
	holdTestMount(t, owner, "/a")

	startKeeper(t, sock)
	// Adopt at once: the owner may not have reconnected yet, and must
	// still release before the adopter gets the mount.
	second := Dial(sock, storetest.Logger(t), nil)
	defer second.Close()
	got := adoptAll(t, second)
	if !released.Load() {
		t.Fatal("adopted before the previous owner released")
	}
	checkAdopted(t, got, "/a")
}

func TestKeeperBadRequests(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "keeper.sock")
	startKeeper(t, sock)
	sc, err := dialSeq(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.c.Close()
	for _, m := range []keeperMsg{{Op: "hold", Key: "/x"}, {Op: "frobnicate"}} {
		if err := sc.send(m); err != nil {
			t.Fatal(err)
		}
		r, _, err := sc.recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Op != "error" || r.Error == "" {
			t.Errorf("%s: answer %+v, want an error", m.Op, r)
		}
	}
	// Garbage is not JSON: the keeper drops the connection, and serves on.
	sc.c.Write([]byte("not json"))
	c := Dial(sock, storetest.Logger(t), nil)
	defer c.Close()
	holdTestMount(t, c, "/ok")
}
