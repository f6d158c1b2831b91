package fusefs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/fusefs/meta"
)

// loneServeEnv makes the test binary mount and serve by itself, with no
// keeper and no launcher holding the mount (serveAlone): killing it loses
// the session, as when the CSI driver and its keeper both die.
const loneServeEnv = "BLOBFS_TEST_SERVE_ALONE"

func serveAlone() error {
	local, err := blobstore.NewLocal(os.Getenv("BLOBFS_TEST_STORE"))
	if err != nil {
		return err
	}
	fsys, err := New(local, Options{CacheDir: os.Getenv("BLOBFS_TEST_CACHE"), Logger: childLogger()})
	if err != nil {
		return err
	}
	crashFromEnv(fsys)
	sess, err := kernel.Mount(os.Getenv(loneServeEnv), fsys, kernel.MountOptions{Logger: childLogger()})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return sess.Wait()
}

// startLoneServer starts a process that mounts mp over the local store in
// storeDir, with cache as its cache directory, and serves it alone
// (serveAlone), with extra environment variables; it returns once the
// mount serves. Killing it loses the session.
func startLoneServer(t *testing.T, mp, storeDir, cache string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), loneServeEnv+"="+mp, "BLOBFS_TEST_STORE="+storeDir, "BLOBFS_TEST_CACHE="+cache)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); kernel.Unmount(mp, true) })
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		t.Fatalf("serving process: %q", line)
	}
	return cmd
}

// TestLostSessionSpillFilesRecovered: a mount's only serving process is
// killed while files are open for writing, so the mount dies with their
// data only in the cache directory. The next filesystem on the same store
// and cache directory uploads what blobs nobody changed meanwhile, keeps in
// lost+found (with a warning) what another writer overtook, does not bring
// back a file deleted while open, and leaves no spill file behind.
func TestLostSessionSpillFilesRecovered(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	storeDir, cache, mp := t.TempDir(), t.TempDir(), t.TempDir()
	local, err := blobstore.NewLocal(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	type file struct {
		name  string
		seed  []byte // blob before the session; nil: none
		flags int
		write func(f *os.File) []byte // writes, returns the file's content after
		// after runs once the session is lost, before the next mount.
		after func(t *testing.T)
		want  []byte // blob after recovery; nil: no blob
		lost  bool   // the session's content is in lost+found
	}
	big := pattern(12<<20, 3) // more than one upload block: staged while written
	old := pattern(100<<10, 5)
	files := []*file{
		{name: "created.bin", flags: os.O_WRONLY | os.O_CREATE | os.O_EXCL,
			write: func(f *os.File) []byte { mustWriteAt(t, f, big, 0); return big }},
		{name: "dir/created-plain.txt", flags: os.O_WRONLY | os.O_CREATE,
			write: func(f *os.File) []byte { mustWriteAt(t, f, []byte("new file"), 0); return []byte("new file") }},
		{name: "edited.bin", seed: old, flags: os.O_WRONLY,
			write: func(f *os.File) []byte {
				mustWriteAt(t, f, []byte("EDIT"), 1000)
				b := bytes.Clone(old)
				copy(b[1000:], "EDIT")
				return b
			}},
		{name: "truncated.txt", seed: []byte("old content, longer than the new"), flags: os.O_WRONLY | os.O_TRUNC,
			write: func(f *os.File) []byte { mustWriteAt(t, f, []byte("rewritten"), 0); return []byte("rewritten") }},
		{name: "overtaken.txt", seed: []byte("before"), flags: os.O_WRONLY,
			write: func(f *os.File) []byte { mustWriteAt(t, f, []byte("SESSION"), 0); return []byte("SESSION") },
			after: func(t *testing.T) { putBlob(t, local, "overtaken.txt", []byte("another writer"), nil) },
			lost:  true},
		{name: "deleted.txt", flags: os.O_WRONLY | os.O_CREATE,
			write: func(f *os.File) []byte {
				mustWriteAt(t, f, []byte("doomed"), 0)
				if err := os.Remove(join(mp, "deleted.txt")); err != nil {
					t.Fatal(err)
				}
				return nil
			}},
	}
	for _, f := range files {
		if f.seed != nil {
			putBlob(t, local, f.name, f.seed, nil)
		}
	}

	cmd := startLoneServer(t, mp, storeDir, cache)

	if err := os.Mkdir(join(mp, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	var open []*os.File
	for _, f := range files {
		h, err := os.OpenFile(join(mp, f.name), f.flags, 0o644)
		if err != nil {
			t.Fatalf("open %s: %v", f.name, err)
		}
		open = append(open, h)
		written := f.write(h)
		if f.lost {
			f.want = []byte("another writer")
			f.seed = written // what lost+found must hold
		} else {
			f.want = written
		}
	}
	// The session dies with every file open, and its mount with it.
	cmd.Process.Kill()
	cmd.Wait()
	for _, h := range open {
		h.Close() // ENOTCONN: nobody serves
	}
	if err := kernel.Unmount(mp, true); err != nil {
		t.Fatal(err)
	}
	if n := len(spillFiles(t, cache)); n == 0 {
		t.Fatal("the killed session left no spill file: the test kills it too late")
	}
	for _, f := range files {
		if f.after != nil {
			f.after(t)
		}
	}

	// The next mount of the same volume.
	log, logged := capturingLogger(t)
	fsys, err := New(local, Options{CacheDir: cache, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	waitRecovered(t, fsys)

	lostFound := join(cache, "lost+found")
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			if f.want == nil {
				if _, err := local.Stat(ctx, f.name); !errors.Is(err, blobstore.ErrNotFound) {
					t.Errorf("a file deleted while open is in the store after recovery (%v)", err)
				}
				return
			}
			wantBlob(t, local, f.name, f.want)
			if f.lost {
				kept, _ := filepath.Glob(join(lostFound, "*-"+filepath.Base(f.name)))
				if len(kept) != 1 {
					t.Fatalf("lost+found holds %v for %s, want one file", kept, f.name)
				}
				if got := mustRead(t, kept[0]); !bytes.Equal(got, f.seed) {
					t.Errorf("lost+found %s holds %q, want the session's %q", kept[0], head(got), head(f.seed))
				}
				if !logLine(logged.String(), "WARN", f.name) {
					t.Errorf("no warning names %s:\n%s", f.name, logged)
				}
			} else if !logLine(logged.String(), "INFO", f.name) {
				t.Errorf("no log line says %s was uploaded:\n%s", f.name, logged)
			}
		})
	}
	if left := spillFiles(t, cache); len(left) != 0 {
		t.Errorf("spill files left after recovery: %v", left)
	}
	// One line sums the recovery up, so that an operator reading the
	// repair of a volume sees what became of its open files.
	if !strings.Contains(logged.String(), "recovery ended") || !strings.Contains(logged.String(), "uploaded=4 kept_in_lost_found=1 ") ||
		!strings.Contains(logged.String(), "left_in_place=0") {
		t.Errorf("no summary line counts 4 files uploaded, 1 kept, none left:\n%s", logged)
	}
	if kept, _ := os.ReadDir(lostFound); len(kept) != 1 {
		t.Errorf("lost+found holds %d files, want only the overtaken one", len(kept))
	}
}

// TestSpillFileOfAnotherStoreIsKept: a cache directory used by a mount of
// one store and then by a mount of another never uploads the first one's
// orphans into the second: they go to lost+found, with a warning.
func TestSpillFileOfAnotherStoreIsKept(t *testing.T) {
	cache := t.TempDir()
	writeOrphan(t, join(cache, "spill"), "orphan", []byte("data of store A"),
		spillRecord{Store: "azure:https://a.example/one", Blob: "f.txt", Dirty: true, IfNoneMatch: true})
	store := blobstore.NewMemory()
	log, logged := capturingLogger(t)
	fsys, err := New(store, Options{CacheDir: cache, StoreID: "azure:https://b.example/two", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	waitRecovered(t, fsys)
	if _, err := store.Stat(context.Background(), "f.txt"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Fatalf("another store's spill file was uploaded here (%v)", err)
	}
	kept, _ := filepath.Glob(join(cache, "lost+found", "*-f.txt"))
	if len(kept) != 1 || string(mustRead(t, kept[0])) != "data of store A" {
		t.Fatalf("lost+found holds %v, want the orphan's data", kept)
	}
	if !logLine(logged.String(), "WARN", "f.txt") || !strings.Contains(logged.String(), "another store") {
		t.Errorf("no warning says why:\n%s", logged)
	}
}

// logLine tells whether the log has a line at level naming path.
func logLine(log, level, path string) bool {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level="+level) && strings.Contains(l, "path="+path) {
			return true
		}
	}
	return false
}

func mustWriteAt(t *testing.T, f *os.File, b []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatalf("write %s: %v", f.Name(), err)
	}
}

// spillFiles lists what the cache directory's spill directory holds.
func spillFiles(t *testing.T, cache string) []string {
	t.Helper()
	entries, err := os.ReadDir(join(cache, "spill"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// waitRecovered waits until fsys has dealt with the orphans it found.
func waitRecovered(t *testing.T, fsys *FS) {
	t.Helper()
	select {
	case <-fsys.orphansDone:
	case <-time.After(30 * time.Second):
		t.Fatal("orphan recovery did not end within 30 s")
	}
}

// writeOrphan leaves in dir a spill file with content data and record rec,
// as a process killed with the file open does.
func writeOrphan(t *testing.T, dir, name string, data []byte, rec spillRecord) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := join(dir, spillPrefix+name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if err := unix.Setxattr(path, spillRecordXattr, b, 0); err != nil {
		t.Skipf("the temporary directory keeps no extended attributes: %v", err)
	}
	return path
}

// TestOrphanRecoveryWaitsForTheStore: a store that cannot be reached when
// the mount starts (a node's network not up yet) neither holds up the
// mount nor sends a lost session's data to lost+found: the file stays in
// the cache directory and is uploaded once the store answers.
func TestOrphanRecoveryWaitsForTheStore(t *testing.T) {
	cache := t.TempDir()
	orphan := writeOrphan(t, join(cache, "spill"), "orphan", []byte("unsaved"), spillRecord{Blob: "f.txt", Dirty: true, IfNoneMatch: true})
	faulty := blobstore.NewFaulty(blobstore.NewMemory(), blobstore.FaultOptions{})
	faulty.FailNext(blobstore.OpPut, 1_000_000, fmt.Errorf("injected: %w", blobstore.ErrTransient))
	log, logged := capturingLogger(t)
	start := time.Now()
	fsys, err := New(faulty, Options{CacheDir: cache, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("New took %v with the store unreachable", d)
	}
	waitFor(t, "a warning that the upload waits for the store", func() bool {
		return strings.Contains(logged.String(), "cannot be reached")
	})
	if _, err := os.Stat(orphan); err != nil {
		t.Fatalf("the orphan left its place while the store was unreachable: %v", err)
	}
	if kept, _ := filepath.Glob(join(cache, "lost+found", "*")); len(kept) > 0 {
		t.Fatalf("lost+found holds %v: a transient failure is not a conflict", kept)
	}
	faulty.ClearFaults()
	waitRecovered(t, fsys)
	wantBlob(t, faulty, "f.txt", []byte("unsaved"))
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the orphan is still there after its upload (%v)", err)
	}
}

// TestSpillDirSharedByTwoMounts: a cache directory used by two mounts at
// once is locked by both, so that a third one, started after the first
// ended, takes the second's spill files for nobody's and leaves them alone.
func TestSpillDirSharedByTwoMounts(t *testing.T) {
	cache := t.TempDir()
	store := blobstore.NewMemory()
	newFS := func() *FS {
		fsys, err := New(store, Options{CacheDir: cache, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		waitRecovered(t, fsys)
		return fsys
	}
	first := newFS()
	second := newFS()
	defer second.Close()
	first.Close()
	// One of the second's open files, as its spill file looks.
	live := writeOrphan(t, join(cache, "spill"), "live", []byte("in use"), spillRecord{Blob: "open.txt", Dirty: true, IfNoneMatch: true})
	third := newFS()
	defer third.Close()
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("a third mount took the second's spill file: %v", err)
	}
	if _, err := store.Stat(context.Background(), "open.txt"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("a live spill file was uploaded by another mount (%v)", err)
	}
}

// TestSpillRecordCurrentDuringCommitAfterDirRename: a file written while
// its directory is renamed (the rename commits it, and a write lands
// during that commit) has a record that names its new blob and that blob's
// ETag by the time its next commit is in flight, so that a process dying
// then leaves an orphan that recovery uploads to the right place under the
// right condition. (A commit's nonce made ahead of time skipped the
// journaling that brings the record up to date: a regression a review
// caught.)
func TestSpillRecordCurrentDuringCommitAfterDirRename(t *testing.T) {
	mem := blobstore.NewMemory()
	if _, err := mem.Put(context.Background(), "d/f", []byte("aaa"), blobstore.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// The rename's commit of d/f is held, then the fsync's of e/f.
	renamed := &lateStore{Store: mem, op: blobstore.OpPut, name: "e/f", sent: make(chan struct{}), land: make(chan struct{})}
	store := &lateStore{Store: renamed, op: blobstore.OpPut, name: "d/f", sent: make(chan struct{}), land: make(chan struct{})}
	cache := t.TempDir()
	mnt, _ := mountStore(t, store, Options{CacheDir: cache})
	f, err := os.OpenFile(join(mnt, "d", "f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWriteAt(t, f, []byte("bbb"), 3)
	done := make(chan error)
	go func() { done <- os.Rename(join(mnt, "d"), join(mnt, "e")) }()
	<-store.sent
	mustWriteAt(t, f, []byte("ccc"), 6) // during the rename's commit
	close(store.land)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { done <- f.Sync() }()
	select {
	case <-renamed.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the fsync made no commit")
	}
	var rec spillRecord
	found := false
	for _, name := range spillFiles(t, cache) {
		if f, err := os.Open(join(cache, "spill", name)); err == nil && strings.HasPrefix(name, spillPrefix) {
			rec, found = readSpillRecord(f)
			f.Close()
		}
	}
	a, _ := mem.Stat(context.Background(), "e/f")
	close(renamed.land)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !found || rec.Blob != "e/f" || rec.IfMatch != a.ETag {
		t.Fatalf("record while the commit is in flight: %+v (found %v); want blob e/f, If-Match %s", rec, found, a.ETag)
	}
}

// TestKillDuringDownloadKeepsNothing: the serving process is killed while
// it copies an existing blob into a spill file for a write (read-modify-
// write), before the write is applied. Its successor applies the resent
// write and commits it at close; the half-made spill file held only the
// store's bytes, so nothing goes to lost+found and no spill file stays.
// (Issue 38, defect 4: each such kill left a file in lost+found, with a
// warning that data could not be uploaded.)
func TestKillDuringDownloadKeepsNothing(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	s := h.localStore()
	old := pattern(9<<20, 7) // more than one download chunk
	putBlob(t, s, "big", old, nil)
	f, err := os.OpenFile(join(h.mnt, "big"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = crashAndRestart(t, h, "load/downloaded/big", func() error {
		_, err := f.WriteAt([]byte("NEW"), 5)
		return err
	})
	if err != nil {
		t.Fatalf("write across the kill: %v", err)
	}
	mustClose(t, f.Close())
	want := bytes.Clone(old)
	copy(want[5:], "NEW")
	wantBlob(t, s, "big", want)
	waitNoSpillFiles(t, h.cache)
	if kept, _ := filepath.Glob(join(h.cache, "lost+found", "*")); len(kept) > 0 {
		t.Errorf("lost+found holds %v after a kill during a download, want nothing", kept)
	}
}

// TestLostSessionRenameFinished: the only serving process dies (no keeper
// to resend the request) between a file rename's Copy and its Delete, the
// atomic-save pattern's "f.tmp -> f". The next filesystem on the same cache
// directory finishes the rename: exactly one name, with the content, and a
// line that says so. (Issue 38, defect 5: both names stayed.)
func TestLostSessionRenameFinished(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	storeDir, cache, mp := t.TempDir(), t.TempDir(), t.TempDir()
	local, err := blobstore.NewLocal(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := startLoneServer(t, mp, storeDir, cache, "BLOBFS_TEST_CRASH=rename/copied/f.tmp")
	data := []byte("saved atomically\n")
	mustWrite(t, join(mp, "f.tmp"), data)
	if err := os.Rename(join(mp, "f.tmp"), join(mp, "f")); err == nil {
		t.Fatal("the rename succeeded: the serving process did not die at its crash point")
	}
	cmd.Wait()
	if err := kernel.Unmount(mp, true); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, local, "f.tmp", data) // both names, as the dead process left them
	wantBlob(t, local, "f", data)

	log, logged := capturingLogger(t)
	fsys, err := New(local, Options{CacheDir: cache, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	waitRecovered(t, fsys)
	wantNoBlob(t, local, "f.tmp")
	wantBlob(t, local, "f", data)
	if !logLine(logged.String(), "INFO", "f.tmp") {
		t.Errorf("no line says the rename of f.tmp was finished:\n%s", logged)
	}
	if left, _ := filepath.Glob(join(cache, "spill", renamePrefix+"*")); len(left) != 0 {
		t.Errorf("rename records left after recovery: %v", left)
	}
}

// TestRenameRecordsOfLostSession: what the next filesystem does with each
// kind of rename record a lost session can leave (renamerecord.go): only a
// new name that is a copy of the old one lets the old one go, and the old
// name's directory stays, as after the rename. (The crash checker found a
// directory that only the renamed file made gone after its recovery.)
func TestRenameRecordsOfLostSession(t *testing.T) {
	copied := []byte("content")
	cases := []struct {
		name      string
		from, to  []byte // blobs before recovery; nil: none
		wantFrom  bool   // the old name is still there after
		wantLevel string // the log line's level
	}{
		{"copied", copied, copied, false, "INFO"},
		{"copy never landed", copied, nil, true, "INFO"},
		{"new name written since", copied, []byte("someone else's"), true, "WARN"},
		{"old name written since", []byte("another writer's"), copied, true, "WARN"},
		{"finished", nil, copied, false, "DEBUG"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem, cache := blobstore.NewMemory(), t.TempDir()
			// The old name's directory d has no marker: the file makes it.
			nonce := func(data []byte) map[string]string {
				if bytes.Equal(data, copied) {
					return map[string]string{blobstore.MetaCommit: "nonce"}
				}
				return map[string]string{blobstore.MetaCommit: "other"}
			}
			if c.from != nil {
				putBlob(t, mem, "d/a", c.from, nonce(c.from))
			}
			if c.to != nil {
				putBlob(t, mem, "b", c.to, nonce(c.to))
			}
			if err := os.MkdirAll(join(cache, "spill"), 0o700); err != nil {
				t.Fatal(err)
			}
			rec, _ := json.Marshal(renameRecord{From: "d/a", To: "b"})
			if err := os.WriteFile(join(cache, "spill", renamePrefix+"x"), rec, 0o600); err != nil {
				t.Fatal(err)
			}
			log, logged := capturingLogger(t)
			fsys, err := New(mem, Options{CacheDir: cache, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer fsys.Close()
			waitRecovered(t, fsys)
			if _, err := mem.Stat(context.Background(), "d/a"); (err == nil) != c.wantFrom {
				t.Errorf("old name there after recovery: %v, want %v", err == nil, c.wantFrom)
			}
			if c.from != nil && c.wantFrom {
				wantBlob(t, mem, "d/a", c.from)
			}
			if c.to != nil {
				wantBlob(t, mem, "b", c.to)
			}
			if page, err := mem.List(context.Background(), blobstore.ListOptions{Prefix: "d"}); err != nil || len(page.Blobs) == 0 {
				t.Errorf("directory d gone from the store after recovery (%v)", err)
			}
			if !logLine(logged.String(), c.wantLevel, "d/a") {
				t.Errorf("no %s line names the rename:\n%s", c.wantLevel, logged)
			}
			if left, _ := filepath.Glob(join(cache, "spill", renamePrefix+"*")); len(left) != 0 {
				t.Errorf("rename records left after recovery: %v", left)
			}
		})
	}
}

// TestLostFoundNames: a file kept in lost+found is named after its blob,
// and one whose name is no longer known gets a name that says so, not
// "<time>-.".
func TestLostFoundNames(t *testing.T) {
	fsys := &FS{opts: Options{CacheDir: t.TempDir()}}
	for blob, want := range map[string]string{"dir/f.txt": "-f.txt", "f": "-f", "": "-unnamed", "/": "-unnamed"} {
		got := filepath.Base(fsys.lostFoundPath(blob))
		if !strings.HasSuffix(got, want) || strings.Count(got, "-") != strings.Count(want, "-") {
			t.Errorf("lost+found name for %q: %s, want <time>%s", blob, got, want)
		}
	}
}

// TestUnlinkedOpenFileAcrossRestart: a file open for writing and unlinked
// through the mount lives on without a name after its serving process is
// killed and a successor adopts the mount: writes and fsync through the
// handle succeed, nothing is uploaded, nothing goes to lost+found. (Found
// by the crash checker: the successor's fsync gave ESTALE.)
func TestUnlinkedOpenFileAcrossRestart(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	f, err := os.OpenFile(join(h.mnt, "a"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWriteAt(t, f, []byte("first"), 0)
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if err := os.Remove(join(h.mnt, "a")); err != nil {
		t.Fatal(err)
	}
	h.kill()
	h.start()
	mustWriteAt(t, f, []byte("second"), 5)
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync of an unlinked file after a restart: %v", err)
	}
	mustClose(t, f.Close())
	wantNoBlob(t, h.localStore(), "a")
	waitNoSpillFiles(t, h.cache)
	wantNoLostFound(t, h.cache)
}

// TestPendingMtimeAcrossRestart: a utime of a file being written waits for
// the file's commit; a process that adopts the mount before that commit
// stores it all the same. (Found by the crash checker: the successor's
// commit stored its own time.)
func TestPendingMtimeAcrossRestart(t *testing.T) {
	h := newRestartHarness(t)
	h.start()
	s := h.localStore()
	putBlob(t, s, "f", []byte("old\n"), nil)
	f, err := os.OpenFile(join(h.mnt, "f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mustWriteHandle(t, f, []byte("new\n"))
	when := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(join(h.mnt, "f"), when, when); err != nil {
		t.Fatal(err)
	}
	h.kill()
	h.start()
	mustClose(t, f.Close())
	wantBlob(t, s, "f", []byte("old\nnew\n"))
	// The store's, not the kernel's (which the utime's reply set).
	a, err := s.Stat(context.Background(), "f")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := meta.Mtime(a.Metadata); !ok || !got.Equal(when) {
		t.Errorf("stored mtime after the successor's commit: %v (%v), want %v", got.UTC(), ok, when)
	}
}
