package fusefs

import (
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// TestLostAnswerIsNotAnError: the store acts on a request and its answer
// is lost (a connection reset after the request was served); the retrying
// layer sends it again, and the retry meets the first one's effect: a
// conditional create finds its own blob, a conditional change finds the
// ETag it gave, a delete finds nothing. blobfs must tell its own work
// from another writer's: the application's call succeeds, and the store
// holds its result once. Before, symlink (found by TestModel's FlakyOn),
// mkdir and mkfifo answered EEXIST, and fchmod ESTALE; the other cases
// passed already.
func TestLostAnswerIsNotAnError(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   blobstore.Op // the operation whose next answer is lost
		do   func(mnt string) error
		want func(t *testing.T, mnt string, s blobstore.Store)
	}{
		{"symlink", blobstore.OpPut,
			func(mnt string) error { return os.Symlink("target", join(mnt, "l")) },
			func(t *testing.T, mnt string, s blobstore.Store) {
				if got, err := os.Readlink(join(mnt, "l")); err != nil || got != "target" {
					t.Errorf("readlink: %q, %v", got, err)
				}
			}},
		{"mkdir", blobstore.OpPut,
			func(mnt string) error { return os.Mkdir(join(mnt, "d"), 0o750) },
			func(t *testing.T, mnt string, s blobstore.Store) {
				if st, err := os.Stat(join(mnt, "d")); err != nil || !st.IsDir() {
					t.Errorf("stat: %v, %v", st, err)
				}
			}},
		{"mkfifo", blobstore.OpPut,
			func(mnt string) error { return syscall.Mkfifo(join(mnt, "p"), 0o640) },
			func(t *testing.T, mnt string, s blobstore.Store) {
				if st, err := os.Lstat(join(mnt, "p")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
					t.Errorf("lstat: %v, %v", st, err)
				}
			}},
		{"create", blobstore.OpPut,
			func(mnt string) error {
				return writeAndClose(join(mnt, "new"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, []byte("new"))
			},
			func(t *testing.T, mnt string, s blobstore.Store) { wantBlob(t, s, "new", []byte("new")) }},
		{"overwrite", blobstore.OpPut,
			func(mnt string) error { return writeAndClose(join(mnt, "f"), os.O_WRONLY|os.O_TRUNC, []byte("second")) },
			func(t *testing.T, mnt string, s blobstore.Store) { wantBlob(t, s, "f", []byte("second")) }},
		// By descriptor: chmod(2) by path would hide an ESTALE, the VFS
		// retrying the call once with a fresh lookup.
		{"fchmod", blobstore.OpSetMetadata,
			func(mnt string) error {
				f, err := os.Open(join(mnt, "f"))
				if err != nil {
					return err
				}
				defer f.Close()
				return f.Chmod(0o600)
			},
			func(t *testing.T, mnt string, s blobstore.Store) {
				if st, err := os.Stat(join(mnt, "f")); err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("stat: %v, %v", st, err)
				}
			}},
		{"unlink", blobstore.OpDelete,
			func(mnt string) error { return os.Remove(join(mnt, "f")) },
			func(t *testing.T, mnt string, s blobstore.Store) { wantNoBlob(t, s, "f") }},
		{"rename", blobstore.OpCopy,
			func(mnt string) error { return os.Rename(join(mnt, "f"), join(mnt, "g")) },
			func(t *testing.T, mnt string, s blobstore.Store) {
				wantNoBlob(t, s, "f")
				wantBlob(t, s, "g", []byte("first"))
			}},
		{"rename-delete", blobstore.OpDelete,
			func(mnt string) error { return os.Rename(join(mnt, "f"), join(mnt, "g")) },
			func(t *testing.T, mnt string, s blobstore.Store) {
				wantNoBlob(t, s, "f")
				wantBlob(t, s, "g", []byte("first"))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := blobstore.NewMemory()
			faulty := blobstore.NewFaulty(mem, blobstore.FaultOptions{})
			mnt, _ := mountStore(t, blobstore.NewRetrying(faulty, modelRetries), conflictMountOptions)
			mustWrite(t, join(mnt, "f"), []byte("first"))
			faulty.FailNextAfter(tc.op, 1, nil)
			if err := tc.do(mnt); err != nil {
				t.Fatalf("%s with its first answer lost: %v", tc.name, err)
			}
			tc.want(t, mnt, mem)
		})
	}
}

// loseNthPut loses the answer of the nth Put (1-based) after the store
// made it: what a connection reset after the request was served does.
type loseNthPut struct {
	blobstore.Store
	mu   sync.Mutex
	puts int
	nth  int
}

func (l *loseNthPut) Put(ctx context.Context, name string, data []byte, opts blobstore.PutOptions) (blobstore.Attrs, error) {
	a, err := l.Store.Put(ctx, name, data, opts)
	l.mu.Lock()
	l.puts++
	lose := l.puts == l.nth
	l.mu.Unlock()
	if lose && err == nil {
		return blobstore.Attrs{}, fmt.Errorf("answer lost: %w", blobstore.ErrTransient)
	}
	return a, err
}

// TestLostAnswerAfterOtherMetadataChange: a file is written while another
// client changes only the blob's metadata, so that the commit's first Put
// fails its condition and blobfs commits over the same content again
// (docs/semantics.md); that second Put's answer is lost and its retry
// fails the condition the Put itself moved. The file is committed: close
// succeeds, nothing goes to lost+found. Before, close gave ESTALE (found
// by TestModel's FlakyOn after 243 sequences).
func TestLostAnswerAfterOtherMetadataChange(t *testing.T) {
	mem := blobstore.NewMemory()
	putBlob(t, mem, "f", []byte("old"), nil)
	lose := &loseNthPut{Store: mem, nth: 2}
	opts := conflictMountOptions
	opts.CacheDir = t.TempDir()
	mnt, _ := mountStore(t, blobstore.NewRetrying(lose, modelRetries), opts)
	f := mustOpen(t, join(mnt, "f"), os.O_WRONLY|os.O_TRUNC)
	if _, err := mem.SetMetadata(t.Context(), "f", map[string]string{"other": "client"}, blobstore.Conditions{}); err != nil {
		t.Fatal(err)
	}
	mustWriteHandle(t, f, []byte("new"))
	mustClose(t, f.Close())
	wantBlob(t, mem, "f", []byte("new"))
	wantNoLostFound(t, opts.CacheDir)
}
