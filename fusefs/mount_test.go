package fusefs

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/kernel"
)

// Test loggers: quiet unless -v, and one that keeps what it logged.
var (
	testLogger      = storetest.Logger
	capturingLogger = storetest.CapturingLogger
)

type lockedBuffer = storetest.LogBuffer

// Test data and blobs (storetest).
var (
	pattern = storetest.Pattern
	putBlob = storetest.PutBlob
)

// mountStore mounts a fresh blobfs over store in a temporary directory and
// unmounts it when the test ends.
func mountStore(t testing.TB, store blobstore.Store, opts Options) (string, *FS) {
	t.Helper()
	if os.Geteuid() != 0 {
		if _, err := os.Stat("/dev/fuse"); err != nil {
			t.Skip("no /dev/fuse")
		}
	}
	if opts.CacheDir == "" {
		opts.CacheDir = t.TempDir()
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	fsys, err := New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	sess, err := kernel.Mount(mnt, fsys, kernel.MountOptions{Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cf := context.WithTimeout(context.Background(), time.Minute)
		defer cf()
		if err := fsys.Sync(ctx); err != nil {
			t.Errorf("sync before unmount: %v", err)
		}
		if err := sess.Unmount(true); err != nil {
			t.Errorf("unmount: %v", err)
		}
		fsys.Close()
	})
	return mnt, fsys
}

// writeAndClose opens path with flag (mode 0644 if it creates), writes
// data and closes it, returning the first error: close's too, which is
// where a commit's failure shows.
func writeAndClose(path string, flag int, data []byte) error {
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// blobContent reads a blob straight from the store.
func blobContent(t testing.TB, s blobstore.Store, name string) []byte {
	t.Helper()
	ctx := context.Background()
	a, err := s.Stat(ctx, name)
	if err != nil {
		t.Fatalf("stat blob %q: %v", name, err)
	}
	buf := make([]byte, a.Size)
	n, err := s.ReadAt(ctx, name, buf, 0, "")
	if err != nil && err != io.EOF {
		t.Fatalf("read blob %q: %v", name, err)
	}
	return buf[:n]
}

func mustWrite(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantBlob(t testing.TB, s blobstore.Store, name string, want []byte) {
	t.Helper()
	if got := blobContent(t, s, name); !bytes.Equal(got, want) {
		t.Fatalf("blob %q: got %d bytes %q..., want %d bytes %q...", name, len(got), head(got), len(want), head(want))
	}
}

func wantNoBlob(t testing.TB, s blobstore.Store, name string) {
	t.Helper()
	if _, err := s.Stat(context.Background(), name); err == nil {
		t.Fatalf("blob %q still exists", name)
	}
}

func head(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

func join(parts ...string) string { return filepath.Join(parts...) }
