package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/sas"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// TestNoSecretFromARunningMount is the end-to-end canary of issue 14: a
// mount authenticated with a real SAS runs into failures that quote request
// URLs (uploads whose connections are reset, then an outage), and nothing
// it writes anywhere (the debug log, the command's output, the
// supervisor's and the worker's output, the cache directory) carries any
// part of the SAS signature. The unit-level canaries check each place
// where an error is made; this one checks that no path from a failing
// request to a log line or a terminal was missed between them.
func TestNoSecretFromARunningMount(t *testing.T) {
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	token, sig := containerSAS(t, cfg)
	proxy := newFaultProxy(t, cfg.Endpoint)
	keyStore, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, fg := range []bool{false, true} {
		name := map[bool]string{false: "background", true: "foreground"}[fg]
		t.Run(name, func(t *testing.T) {
			proxy.set(passAll)
			m := startSASMount(t, bin, proxy.endpoint, cfg.Container, token, fg)
			// Names unique to this run: the container is shared by both.
			small := filepath.Join(m.mp, name+"-small")
			big := filepath.Join(m.mp, name+"-big")
			alive := filepath.Join(m.mp, name+"-alive")

			// Uploads fail: every PUT (Put Blob, Put Block, Put Block
			// List) has its connection reset, so the HTTP client's error
			// quotes the request URL, SAS and all.
			proxy.set(resetPuts)
			if werr, cerr := writeAndClose(small, []byte("lost")); werr != nil || !errors.Is(cerr, syscall.EIO) {
				t.Errorf("%s while uploads fail: write %v, close %v; want the close to fail with EIO", small, werr, cerr)
			}
			// Larger than one --upload-block-mb: blocks are staged while
			// writing (Put Block), and the whole file is tried again at
			// close; writes land in the spill file either way.
			if werr, cerr := writeAndClose(big, bytes.Repeat([]byte("b"), 3<<20)); werr != nil || !errors.Is(cerr, syscall.EIO) {
				t.Errorf("%s (staged blocks) while uploads fail: write %v, close %v; want the close to fail with EIO", big, werr, cerr)
			}

			// An outage: every request is reset, so a name or a listing
			// that is not cached cannot be had. The errno is the
			// transport's (ECONNRESET: fusefs passes on a syscall.Errno
			// it finds in the chain); what matters here is that the
			// failure is not taken for "no such file".
			proxy.set(resetAll)
			if _, err := os.Stat(filepath.Join(m.mp, name+"-never-seen")); err == nil || errors.Is(err, os.ErrNotExist) {
				t.Errorf("stat of an uncached name during an outage: %v, want an error other than ENOENT", err)
			}
			if ents, err := os.ReadDir(m.mp); err == nil || errors.Is(err, os.ErrNotExist) {
				t.Errorf("readdir during an outage: %d entries, %v; want an error other than ENOENT", len(ents), err)
			}

			// Back to normal: the mount is still alive and writes through.
			proxy.set(passAll)
			want := []byte("written after the outage by " + name)
			if werr, cerr := writeAndClose(alive, want); werr != nil || cerr != nil {
				t.Fatalf("writing after the outage: write %v, close %v", werr, cerr)
			}
			if got, err := os.ReadFile(alive); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("reading back after the outage: %q, %v; want %q", got, err, want)
			}
			if got := readBlob(t, keyStore, name+"-alive"); !bytes.Equal(got, want) {
				t.Fatalf("the store holds %q for the file written after the outage, want %q", got, want)
			}

			captured := m.stop(t)
			for what, text := range captured {
				if frag := signatureFragment(text, sig); frag != "" {
					i := strings.Index(text, frag)
					t.Errorf("%s carries the SAS signature (fragment %q): ...%s...", what, frag, text[max(0, i-200):min(len(text), i+200)])
				}
			}
			// The failing requests were logged, with their URLs: the
			// test proves nothing if the log says nothing.
			log := captured[m.logName]
			if !strings.Contains(log, "sig="+blobstore.Redacted) {
				t.Errorf("%s does not show the failing requests' URLs (no sig=%s)", m.logName, blobstore.Redacted)
			}
			if !strings.Contains(log, "commit failed") || !strings.Contains(log, "list failed") {
				t.Errorf("%s lacks the failed commit or the failed listing", m.logName)
			}
		})
	}
}

// containerSAS signs a read-write container SAS with cfg's key and returns
// it as a query string, and its signature: the canary.
func containerSAS(t *testing.T, cfg blobstore.AzureConfig) (token, sig string) {
	t.Helper()
	cred, err := container.NewSharedKeyCredential(cfg.Account, cfg.Key)
	if err != nil {
		t.Fatal(err)
	}
	perms := sas.ContainerPermissions{Read: true, Add: true, Create: true, Write: true, Delete: true, List: true}
	q, err := sas.BlobSignatureValues{
		Protocol:      sas.ProtocolHTTPSandHTTP,
		StartTime:     time.Now().Add(-time.Hour),
		ExpiryTime:    time.Now().Add(time.Hour),
		Permissions:   perms.String(),
		ContainerName: cfg.Container,
	}.SignWithSharedKey(cred)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Signature()) < 20 {
		t.Fatalf("SAS signature %q is too short to serve as a canary", q.Signature())
	}
	return q.Encode(), q.Signature()
}

// signatureFragment returns a 10-character piece of sig, as it is or as it
// stands URL-encoded in a query, that text contains; "" when there is none.
// Ten characters of a base64 HMAC do not turn up by chance.
func signatureFragment(text, sig string) string {
	for _, form := range []string{sig, url.QueryEscape(sig)} {
		for i := 0; i+10 <= len(form); i++ {
			if strings.Contains(text, form[i:i+10]) {
				return form[i : i+10]
			}
		}
	}
	return ""
}

// Modes of a faultProxy.
const (
	passAll   = iota // forward every request
	resetPuts        // reset the connection of every PUT
	resetAll         // reset every connection: an outage
)

// faultProxy is a reverse proxy in front of Azurite that fails requests by
// resetting their connections, as a broken network does: the client gets
// a transport error, not an HTTP answer, and Go's HTTP client quotes the
// whole request URL in it.
type faultProxy struct {
	endpoint string // the blob endpoint through the proxy
	mode     atomic.Int32
}

func newFaultProxy(t *testing.T, endpoint string) *faultProxy {
	t.Helper()
	target, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p.mode.Load() {
		case resetAll:
			resetConn(t, w)
			return
		case resetPuts:
			if r.Method == http.MethodPut {
				resetConn(t, w)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.endpoint = srv.URL + target.Path
	return p
}

func (p *faultProxy) set(mode int32) { p.mode.Store(mode) }

// resetConn drops the request's connection with a TCP reset.
func resetConn(t *testing.T, w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Errorf("proxy: hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) // close sends RST
	}
	conn.Close()
}

// sasMount is a running `blobfs mount` with a SAS, and where its output
// goes.
type sasMount struct {
	mp       string
	cacheDir string
	logName  string // key of the log in stop's result
	logFile  string // background: the --log-file
	out      []byte // background: output of `blobfs mount`
	fgCmd    *exec.Cmd
	fgOut    *bytes.Buffer // foreground: stdout and stderr, the log included
}

// startSASMount mounts container through endpoint with the SAS in the
// environment, logging at debug level: in the background with a log file,
// or in the foreground logging to stderr.
func startSASMount(t *testing.T, bin, endpoint, container, token string, fg bool) *sasMount {
	t.Helper()
	m := &sasMount{mp: t.TempDir(), cacheDir: t.TempDir()}
	args := []string{"mount", "--endpoint", endpoint, "--container", container,
		"--log-level", "debug", "--retry-attempts", "2", "--retry-max-delay", "10ms",
		"--cache-dir", m.cacheDir, "--upload-block-mb", "1",
		// Listings are not cached, so that the outage reaches the store
		// for a lookup and a readdir however recently the test listed.
		"--list-timeout", "0"}
	env := append(cleanEnv(), "AZURE_STORAGE_SAS_TOKEN="+token)
	if fg {
		m.logName = "foreground stderr"
		m.fgOut = &bytes.Buffer{}
		m.fgCmd = exec.Command(bin, append(args, "--foreground", m.mp)...)
		m.fgCmd.Env = env
		m.fgCmd.Stdout, m.fgCmd.Stderr = m.fgOut, m.fgOut
		if err := m.fgCmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			m.fgCmd.Process.Kill()
			syscall.Unmount(m.mp, syscall.MNT_DETACH)
		})
		waitMounted(t, m.mp, true)
		return m
	}
	m.logFile = filepath.Join(t.TempDir(), "blobfs.log")
	m.logName = "log file"
	cmd := exec.Command(bin, append(args, "--log-file", m.logFile, m.mp)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("blobfs mount: %v\n%s", err, out)
	}
	m.out = out
	t.Cleanup(func() {
		if w, _ := findWorker(m.mp); w != nil {
			syscall.Kill(w.ppid, syscall.SIGKILL)
			syscall.Kill(w.pid, syscall.SIGKILL)
		}
		syscall.Unmount(m.mp, syscall.MNT_DETACH)
	})
	if !mounted(t, m.mp) {
		t.Fatal("not mounted after blobfs mount returned")
	}
	return m
}

// stop unmounts with `blobfs unmount`, waits until every process of the
// mount has exited, and returns all they wrote, by source.
func (m *sasMount) stop(t *testing.T) map[string]string {
	t.Helper()
	w, _ := findWorker(m.mp)
	out, err := exec.Command(blobfsBin(t), "unmount", m.mp).CombinedOutput()
	if err != nil {
		t.Fatalf("blobfs unmount: %v\n%s", err, out)
	}
	captured := map[string]string{"blobfs unmount output": string(out)}
	if m.fgCmd != nil {
		if err := waitExit(m.fgCmd, 30*time.Second); err != nil {
			t.Errorf("foreground blobfs after unmount: %v", err)
		}
		captured[m.logName] = m.fgOut.String()
	} else {
		if w == nil {
			t.Fatal("no worker process served the background mount")
		}
		waitExited(t, w.ppid, "supervisor")
		waitExited(t, w.pid, "worker")
		captured["blobfs mount output"] = string(m.out)
		// The supervisor's and the worker's own output (a panic, say)
		// go to the log file too.
		b, err := os.ReadFile(m.logFile)
		if err != nil {
			t.Fatal(err)
		}
		captured[m.logName] = string(b)
	}
	filepath.WalkDir(m.cacheDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			captured["cache file "+p] = string(b)
		}
		return nil
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s:\n%s", m.logName, captured[m.logName])
		}
	})
	return captured
}

// writeAndClose writes data to a new file and closes it, and returns the
// errors of both: close is where a failed upload shows.
func writeAndClose(path string, data []byte) (writeErr, closeErr error) {
	f, err := os.Create(path)
	if err != nil {
		return err, nil
	}
	_, writeErr = f.Write(data)
	return writeErr, f.Close()
}

// readBlob reads a whole blob from s.
func readBlob(t *testing.T, s blobstore.Store, name string) []byte {
	t.Helper()
	p := make([]byte, 1<<16)
	n, err := s.ReadAt(t.Context(), name, p, 0, "")
	if err != nil && err != io.EOF {
		t.Fatalf("read blob %q: %v", name, err)
	}
	return p[:n]
}

// TestErrorLineRedacted: the last line blobfs prints before it exits, the
// error main writes to stderr, carries no credential, even one the error
// took from the command line (a token pasted into the wrong flag, a key
// among mount(8)'s -o options) rather than from a store request.
func TestErrorLineRedacted(t *testing.T) {
	bin := blobfsBin(t)
	for _, tc := range []struct {
		name   string
		args   []string
		canary string
	}{
		{"SAS in --log-level", []string{bin, "csi", "--log-level", "sig=CANARYlogLevelSig0a1b2c3d%3D&se=2099-01-01"}, "CANARYlogLevelSig0a1b2c3d"},
		{"JSON in --log-format", []string{bin, "mount", "--log-format", `{"azurestorageaccountkey":"CANARYlogFormatKey0a1b2c"}`, "/nonexistent"}, "CANARYlogFormatKey0a1b2c"},
		{"key among -o options", []string{filepath.Join(filepath.Dir(bin), "mount.blobfs"), "azure:data", "/nonexistent", "-o", "ro,azurestorageaccountkey=CANARYfstabKey0a1b2c3d\x01"}, "CANARYfstabKey0a1b2c3d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.args[0], tc.args[1:]...)
			cmd.Env = cleanEnv()
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			err := cmd.Run()
			if err == nil {
				t.Fatalf("%q succeeded", tc.args)
			}
			out := stderr.String()
			if !strings.HasPrefix(out, "blobfs: ") {
				t.Fatalf("no error line from main: %q", out)
			}
			if strings.Contains(out, tc.canary) {
				t.Errorf("stderr carries the canary: %s", out)
			}
		})
	}
}
