package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The restart tests' applications: the test binary run again with
// BLOBFS_TEST_APP set, so that the process with files open on the mount is
// never the one that starts the driver (see fusefs's package doc).
//
// churn works in its own part of a mount (BLOBFS_TEST_APP_DIR, names
// prefixed by BLOBFS_TEST_APP_ID) until the file BLOBFS_TEST_APP_STOP
// exists: it creates files in several writes and reads them back, appends
// to a file it holds open the whole time and reads each record back,
// renames, makes directories and unlinks, checking every result. Every
// operation slower than 20 ms is printed ("op START_UNIX_NANO DURATION_NS")
// so the test can tell the pause each restart caused. At the end it closes
// its open file and writes the manifest (BLOBFS_TEST_APP_OUT): the sha256
// of every file it left, by name relative to the mount. Any error ends it
// at once with exit status 1 and no manifest.
//
// signalled (BLOBFS_TEST_APP=signalled) makes, renames and removes
// directories and files in BLOBFS_TEST_APP_DIR, BLOBFS_TEST_APP_N times,
// while a goroutine sends the thread making them SIGURG every 100 µs (as
// the Go runtime does to preempt, only more often), so that most of its
// requests are interrupted on their way; any error ends it.
//
// stream (BLOBFS_TEST_APP=stream) reads BLOBFS_TEST_APP_FILE from start to
// end over and over, comparing with its sha256 (BLOBFS_TEST_APP_SHA256).
const appEnv = "BLOBFS_TEST_APP"

func runTestApp() int {
	var err error
	switch os.Getenv(appEnv) {
	case "churn":
		err = churn()
	case "stream":
		err = stream()
	case "signalled":
		err = signalled()
	default:
		err = fmt.Errorf("unknown app %q", os.Getenv(appEnv))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "app error:", err)
		return 1
	}
	return 0
}

func stopRequested() bool {
	_, err := os.Stat(os.Getenv("BLOBFS_TEST_APP_STOP"))
	return err == nil
}

// timed runs one operation and reports it if it was slow.
func timed(what string, f func() error) error {
	start := time.Now()
	err := f()
	if d := time.Since(start); d > 20*time.Millisecond {
		fmt.Printf("op %d %d\n", start.UnixNano(), d.Nanoseconds())
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func churn() error {
	dir, id := os.Getenv("BLOBFS_TEST_APP_DIR"), os.Getenv("BLOBFS_TEST_APP_ID")
	seed, _ := strconv.ParseUint(os.Getenv("BLOBFS_TEST_APP_SEED"), 10, 64)
	rng := rand.New(rand.NewPCG(seed, 42))
	manifest := map[string]string{} // name -> sha256
	rel := func(p string) string { r, _ := filepath.Rel(os.Getenv("BLOBFS_TEST_APP_ROOT"), p); return r }
	payload := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}

	streamPath := filepath.Join(dir, id+"-stream.log")
	var streamed []byte
	var stream *os.File
	if err := timed("open stream", func() (err error) {
		stream, err = os.OpenFile(streamPath, os.O_CREATE|os.O_EXCL|os.O_RDWR|os.O_APPEND, 0o644)
		return err
	}); err != nil {
		return err
	}
	var created, renamed []string
	for i := 0; !stopRequested(); i++ {
		var err error
		switch i % 6 {
		case 0, 3: // create in several writes, read back
			p := filepath.Join(dir, fmt.Sprintf("%s-f%d.dat", id, i))
			data := payload(64<<10 + rng.IntN(512<<10))
			err = timed("create "+p, func() error {
				f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if err != nil {
					return err
				}
				for off := 0; off < len(data); off += 100 << 10 {
					end := min(off+100<<10, len(data))
					if _, err := f.Write(data[off:end]); err != nil {
						f.Close()
						return err
					}
				}
				return f.Close()
			})
			if err == nil {
				err = timed("read back "+p, func() error { return checkFile(p, data) })
			}
			manifest[rel(p)] = sum(data)
			created = append(created, p)
		case 1: // append to the held file and read the record back
			rec := payload(4<<10 + rng.IntN(28<<10))
			err = timed("append", func() error {
				if _, err := stream.Write(rec); err != nil {
					return err
				}
				got := make([]byte, len(rec))
				if _, err := stream.ReadAt(got, int64(len(streamed))); err != nil {
					return fmt.Errorf("read the record back: %w", err)
				}
				if string(got) != string(rec) {
					return errors.New("record read back differs")
				}
				return nil
			})
			streamed = append(streamed, rec...)
		case 2: // rename a created file
			if len(created) == 0 {
				continue
			}
			src := created[0]
			created = created[1:]
			dst := src[:len(src)-len(".dat")] + ".renamed"
			err = timed("rename "+src, func() error {
				if err := os.Rename(src, dst); err != nil {
					return err
				}
				if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("old name still there after rename: %v", err)
				}
				_, err := os.Stat(dst)
				return err
			})
			manifest[rel(dst)] = manifest[rel(src)]
			delete(manifest, rel(src))
			renamed = append(renamed, dst)
		case 4: // a directory with a file in it
			d := filepath.Join(dir, fmt.Sprintf("%s-d%d", id, i))
			data := payload(1 << 10)
			err = timed("mkdir "+d, func() error {
				if err := os.Mkdir(d, 0o755); err != nil {
					return err
				}
				return os.WriteFile(filepath.Join(d, "small"), data, 0o644)
			})
			manifest[rel(filepath.Join(d, "small"))] = sum(data)
		case 5: // unlink a renamed file
			if len(renamed) < 2 {
				continue
			}
			p := renamed[0]
			renamed = renamed[1:]
			err = timed("unlink "+p, func() error {
				if err := os.Remove(p); err != nil {
					return err
				}
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("still there after unlink: %v", err)
				}
				return nil
			})
			delete(manifest, rel(p))
		}
		if err != nil {
			return err
		}
	}
	if err := timed("close stream", stream.Close); err != nil {
		return err
	}
	if err := timed("check stream", func() error { return checkFile(streamPath, streamed) }); err != nil {
		return err
	}
	manifest[rel(streamPath)] = sum(streamed)
	b, _ := json.Marshal(manifest)
	return os.WriteFile(os.Getenv("BLOBFS_TEST_APP_OUT"), b, 0o644)
}

func checkFile(p string, want []byte) error {
	got, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if len(got) != len(want) || sum(got) != sum(want) {
		return fmt.Errorf("%s: read %d bytes (sha256 %.12s), want %d (%.12s)", p, len(got), sum(got), len(want), sum(want))
	}
	return nil
}

// stream reads a file end to end until told to stop, through one open
// file, in 128 KiB reads.
func stream() error {
	p, want := os.Getenv("BLOBFS_TEST_APP_FILE"), os.Getenv("BLOBFS_TEST_APP_SHA256")
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 128<<10)
	for rounds := 0; rounds == 0 || !stopRequested(); rounds++ {
		h := sha256.New()
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		for {
			var n int
			err := timed("read", func() (err error) {
				n, err = f.Read(buf)
				if errors.Is(err, io.EOF) {
					err = nil
				}
				return err
			})
			if err != nil {
				return err
			}
			if n == 0 {
				break
			}
			h.Write(buf[:n])
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fmt.Errorf("round %d: read sha256 %s, want %s", rounds, got, want)
		}
		// Drop the kernel's page cache of the file so that every round
		// reads through the server.
		unixFadviseDontNeed(f)
	}
	return nil
}

func unixFadviseDontNeed(f *os.File) {
	const fadvDontNeed = 4
	syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0)
}

func signalled() error {
	dir := os.Getenv("BLOBFS_TEST_APP_DIR")
	n, _ := strconv.Atoi(os.Getenv("BLOBFS_TEST_APP_N"))
	// The changes run on one locked thread, which the ticker signals:
	// a signal sent to the process would mostly go to another thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
			}
		}
	}()
	for i := range n {
		d, r := filepath.Join(dir, fmt.Sprintf("d%d", i)), filepath.Join(dir, fmt.Sprintf("r%d", i))
		f, g := filepath.Join(dir, fmt.Sprintf("f%d", i)), filepath.Join(dir, fmt.Sprintf("g%d", i))
		for _, step := range []func() error{
			func() error { return os.Mkdir(d, 0o755) },
			func() error { return os.Rename(d, r) },
			func() error { return os.WriteFile(f, []byte("content"), 0o644) },
			func() error { return os.Rename(f, g) },
			func() error { return os.Remove(g) },
			func() error { return os.Remove(r) },
		} {
			if err := step(); err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
		}
	}
	return nil
}
