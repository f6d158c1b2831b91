package fusefs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/blobfs/blobfs/blobstore"
)

// answerLostStore holds the next change (Put, Delete or Copy) once armed,
// until release is closed; the change then reaches the store whatever
// happened meanwhile, but a caller whose context ended meanwhile gets its
// error instead of the answer, as over a network.
type answerLostStore struct {
	blobstore.Store
	armed   bool
	held    chan struct{} // closed when a change is being held
	release chan struct{}
}

func (s *answerLostStore) arm() {
	s.armed, s.held, s.release = true, make(chan struct{}), make(chan struct{})
}

func (s *answerLostStore) hold(ctx context.Context) error {
	if !s.armed {
		return nil
	}
	s.armed = false
	close(s.held)
	<-s.release
	// The interrupt reaches the context through a goroutine: give it
	// time to (with the fix, it never comes).
	select {
	case <-ctx.Done():
	case <-time.After(200 * time.Millisecond):
	}
	return ctx.Err()
}

func (s *answerLostStore) Put(ctx context.Context, name string, data []byte, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	lost := s.hold(ctx)
	a, err := s.Store.Put(context.Background(), name, data, opts)
	if lost != nil {
		return blobstore.Attrs{}, lost
	}
	return a, err
}

func (s *answerLostStore) Delete(ctx context.Context, name string, cond blobstore.Conditions) error {
	lost := s.hold(ctx)
	if err := s.Store.Delete(context.Background(), name, cond); err != nil {
		return err
	}
	return lost
}

func (s *answerLostStore) Copy(ctx context.Context, dst, src string) (blobstore.Attrs, error) {
	lost := s.hold(ctx)
	a, err := s.Store.Copy(context.Background(), dst, src)
	if lost != nil {
		return blobstore.Attrs{}, lost
	}
	return a, err
}

// TestChangesIgnoreInterrupt: a FUSE_INTERRUPT that arrives while a change
// is on its way to the store does not make the change answer EINTR. The
// change may land all the same, and the caller's retry (Go's os.Mkdir,
// os.Remove and os.Rename retry EINTR at once) would then fail: EEXIST for
// mkdir, ENOENT for the others.
func TestChangesIgnoreInterrupt(t *testing.T) {
	root := &fuse.InHeader{NodeId: 1}
	for _, c := range []struct {
		name   string
		before func(t *testing.T, s blobstore.Store)
		change func(fs *FS, cancel chan struct{}) fuse.Status
		after  func(t *testing.T, s blobstore.Store)
	}{
		{"mkdir", nil, func(fs *FS, cancel chan struct{}) fuse.Status {
			return fs.Mkdir(cancel, &fuse.MkdirIn{InHeader: *root, Mode: 0o755}, "d", &fuse.EntryOut{})
		}, func(t *testing.T, s blobstore.Store) { blobContent(t, s, "d") }},
		{"symlink", nil, func(fs *FS, cancel chan struct{}) fuse.Status {
			return fs.Symlink(cancel, root, "target", "l", &fuse.EntryOut{})
		}, func(t *testing.T, s blobstore.Store) { blobContent(t, s, "l") }},
		{"unlink", func(t *testing.T, s blobstore.Store) { putBlob(t, s, "f", []byte("content"), nil) }, func(fs *FS, cancel chan struct{}) fuse.Status {
			return fs.Unlink(cancel, root, "f")
		}, func(t *testing.T, s blobstore.Store) { wantNoBlob(t, s, "f") }},
		{"rename", func(t *testing.T, s blobstore.Store) { putBlob(t, s, "f", []byte("content"), nil) }, func(fs *FS, cancel chan struct{}) fuse.Status {
			return fs.Rename(cancel, &fuse.RenameIn{InHeader: *root, Newdir: 1}, "f", "g")
		}, func(t *testing.T, s blobstore.Store) {
			wantNoBlob(t, s, "f")
			blobContent(t, s, "g")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &answerLostStore{Store: blobstore.NewMemory()}
			if c.before != nil {
				c.before(t, store.Store)
			}
			fs, err := New(store, Options{CacheDir: t.TempDir(), Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()
			store.arm()
			cancel := make(chan struct{})
			done := make(chan fuse.Status, 1)
			go func() { done <- c.change(fs, cancel) }()
			<-store.held
			close(cancel) // FUSE_INTERRUPT
			close(store.release)
			if st := <-done; !st.Ok() {
				t.Fatalf("%s interrupted on its way to the store: %v, want OK", c.name, st)
			}
			c.after(t, store.Store)
		})
	}
}

// TestExistsAfterAllIsSeen: a name this mount's cached listing lacks, made
// by another client meanwhile, fails mkdir with EEXIST, and from then on
// lookups find it instead of answering ENOENT from that listing.
func TestExistsAfterAllIsSeen(t *testing.T) {
	store := blobstore.NewMemory()
	mnt, _ := mountStore(t, store, Options{})
	if _, err := os.ReadDir(mnt); err != nil { // the root's listing is cached
		t.Fatal(err)
	}
	putBlob(t, store, "made-elsewhere", nil, folderMeta)
	err := os.Mkdir(join(mnt, "made-elsewhere"), 0o755)
	if !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("mkdir of a directory made by another client: %v, want EEXIST", err)
	}
	if st, err := os.Stat(join(mnt, "made-elsewhere")); err != nil || !st.IsDir() {
		t.Fatalf("stat after EEXIST: %v, %v; want the directory", st, err)
	}
}

// listGate, once armed, holds every List until release is closed, and
// says when one is held.
type listGate struct {
	blobstore.Store
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *listGate) List(ctx context.Context, opts blobstore.ListOptions) (blobstore.ListPage, error) {
	if s.armed.Load() {
		s.once.Do(func() { close(s.held) })
		select {
		case <-s.release:
		case <-ctx.Done():
			return blobstore.ListPage{}, ctx.Err()
		}
	}
	return s.Store.List(ctx, opts)
}

// TestKilledReaderLeavesAtOnce: a process killed while a lookup or a
// readdir of its waits for the store (saturated, or down) leaves at once:
// blobfs answers the read-only request of a caller that has SIGKILL
// pending. (Issue 38: a killed `ls` stayed in the kernel for more than
// 75 s.) The listing is held until the test ends, so only the answer to
// the killed caller can let it go.
func TestKilledReaderLeavesAtOnce(t *testing.T) {
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls")
	}
	for _, c := range []struct {
		name string
		// opts: readdir keeps the name in the kernel (the test looks
		// it up first) and no listing, so that ls's getdents lists.
		opts        Options
		lookUpFirst bool
	}{
		{"lookup", Options{AttrTimeout: -1, EntryTimeout: -1, NegativeTimeout: -1, ListTimeout: -1}, false},
		{"readdir", Options{AttrTimeout: time.Hour, EntryTimeout: time.Hour, ListTimeout: -1}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &listGate{Store: blobstore.NewMemory(), held: make(chan struct{}), release: make(chan struct{})}
			defer close(store.release)
			putBlob(t, store.Store, "dir/a", []byte("a"), nil)
			putBlob(t, store.Store, "dir/b", []byte("b"), nil)
			log, logged := capturingLogger(t)
			c.opts.Logger = log
			mnt, _ := mountStore(t, store, c.opts)
			if c.lookUpFirst {
				if _, err := os.Stat(join(mnt, "dir")); err != nil {
					t.Fatal(err)
				}
			}
			store.armed.Store(true)
			cmd := exec.Command(ls, join(mnt, "dir"))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case <-store.held:
			case err := <-exited:
				t.Fatalf("ls ended before it waited for the store: %v", err)
			}
			cmd.Process.Kill()
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				t.Fatal("a process killed while its request waited for the store is still there after 20 s")
			}
			for _, l := range strings.Split(logged.String(), "\n") {
				if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
					t.Errorf("logged for a killed caller: %s", l)
				}
			}
		})
	}
}
