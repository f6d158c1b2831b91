package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

func TestHelperFlags(t *testing.T) {
	for _, tc := range []struct {
		source string
		opts   []string
		want   []string
		err    bool
	}{
		{"mycontainer", []string{"defaults", "_netdev", "nofail"}, []string{"--container=mycontainer"}, false},
		{"azure:c", []string{"ro", "allow_other", "block-cache-mb=512"}, []string{"--container=c", "--read-only", "--allow-other", "--block-cache-mb=512"}, false},
		{"local:/srv/data", []string{"x-systemd.automount", "cache_dir=/var/cache/b"}, []string{"--local-dir=/srv/data", "--cache-dir=/var/cache/b"}, false},
		{"c", []string{"foreground"}, nil, true},
		// What mount(8) shows as the source of a mount.
		{"blobfs:shared", nil, []string{"--container=shared"}, false},
		{"blobfs:local", []string{"ro"}, []string{"--read-only"}, false},
		// Aliases of the option table; underscores in names only.
		{"c", []string{"ro=false", "validate_md5=false", "log_file=/var/log/my_app.log"}, []string{"--container=c", "--read-only=false", "--verify-md5=false", "--log-file=/var/log/my_app.log"}, false},
	} {
		got, err := helperFlags(tc.source, tc.opts)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("helperFlags(%q, %q) = %q, %v; want %q (error %v)", tc.source, tc.opts, got, err, tc.want, tc.err)
		}
	}
}

var binDir string

// blobfsBin builds the binary once per test run.
func blobfsBin(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mount tests need root")
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "blobfs-bin-")
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "blobfs"), ".").CombinedOutput()
		if err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		if err := os.Symlink("blobfs", filepath.Join(dir, "mount.blobfs")); err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	return filepath.Join(binDir, "blobfs")
}

func TestMain(m *testing.M) {
	if os.Getenv(appEnv) != "" {
		os.Exit(runTestApp())
	}
	if dir := os.Getenv(supervisedAppEnv); dir != "" {
		// The test binary doubles as an application using a mount.
		os.Exit(streamApp(dir))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func mounted(t *testing.T, mp string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// The kernel escapes a space in a path as \040.
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == strings.ReplaceAll(mp, " ", `\040`) {
			return true
		}
	}
	return false
}

func waitMounted(t *testing.T, mp string, want bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for mounted(t, mp) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s mounted=%v, want %v", mp, !want, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestForegroundMountSurvivesUntilSIGTERM: a foreground mount serves, and on
// SIGTERM uploads what is open and unmounts.
func TestForegroundMountSIGTERM(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	cmd := exec.Command(bin, "mount", "--foreground", "--shutdown-grace", "1s", "--local-dir", store, "--cache-dir", t.TempDir(), mp)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); syscall.Unmount(mp, syscall.MNT_DETACH) })
	waitMounted(t, mp, true)

	// A file still open for writing when the signal comes is uploaded.
	f, err := os.Create(filepath.Join(mp, "open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("written before SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("blobfs exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("blobfs did not exit after SIGTERM")
	}
	f.Close()
	if mounted(t, mp) {
		t.Fatal("still mounted after SIGTERM")
	}
	got, err := os.ReadFile(filepath.Join(store, "open.txt"))
	if err != nil || string(got) != "written before SIGTERM" {
		t.Fatalf("store has %q, %v", got, err)
	}
}

// TestBackgroundMountAndHelper: blobfs mount detaches once mounted; the
// mount.blobfs helper takes fstab-style options.
func TestBackgroundMountAndHelper(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	out, err := exec.Command(bin, "mount", "--local-dir", store, "--log-file", filepath.Join(t.TempDir(), "log"), mp).CombinedOutput()
	if err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "mounted local directory "+store+" at "+mp) {
		t.Fatalf("mount did not say where: %q", out)
	}
	if !mounted(t, mp) {
		t.Fatal("not mounted after blobfs mount returned")
	}
	if err := os.WriteFile(filepath.Join(mp, "f"), []byte("bg"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	waitMounted(t, mp, false)
	if got, _ := os.ReadFile(filepath.Join(store, "f")); string(got) != "bg" {
		t.Fatalf("store has %q", got)
	}

	helper := filepath.Join(filepath.Dir(bin), "mount.blobfs")
	out, err = exec.Command(helper, "local:"+store, mp, "-o", "ro,defaults,_netdev,block-cache-mb=64,log-file="+filepath.Join(t.TempDir(), "log")).CombinedOutput()
	if err != nil {
		t.Fatalf("mount.blobfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if got, err := os.ReadFile(filepath.Join(mp, "f")); err != nil || string(got) != "bg" {
		t.Fatalf("read through helper mount: %q %v", got, err)
	}
	err = os.WriteFile(filepath.Join(mp, "g"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write on a read-only mount: %v", err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
}

// TestPreMountValidation: bad input ends with one clear line, exit status 1,
// and nothing mounted.
// TestPreMountValidation runs `blobfs mount` with what cannot work: each
// case must exit with its status and one clear line, print no secret, and
// leave nothing mounted or running.
func TestPreMountValidation(t *testing.T) {
	bin := blobfsBin(t)
	sig := "CANARYmountSig4c8e1a7d3b9f"
	sas := "AZURE_STORAGE_SAS_TOKEN=?sv=2022-11-02&ss=b&srt=sco&sp=rwdl&se=2099-01-01T00:00:00Z&sig=" + sig
	hung := "http://" + storetest.HungAddr(t) + "/devstoreaccount1"
	type testCase struct {
		name  string
		args  []string
		env   []string
		code  int                         // exit status
		want  string                      // in the one line printed, lower case
		setup func(t *testing.T) []string // extra args, after the test's mountpoint is made
	}
	cases := []testCase{
		{"missing local dir", []string{"--local-dir", "/nonexistent/blobfs"}, nil, 1, "not an existing directory", nil},
		{"bad endpoint URL", []string{"--container", "cont1", "--account", "a", "--endpoint", "ht!tp://x y", "--auth-type", "anonymous"}, nil, 1, "endpoint", nil},
		{"unreachable endpoint", []string{"--container", "cont1", "--endpoint", "http://127.0.0.1:1/devstoreaccount1", "--auth-type", "anonymous", "--retry-attempts", "1"}, nil, 1, "reach", nil},
		{"unreachable endpoint with SAS", []string{"--container", "cont1", "--endpoint", "http://127.0.0.1:1/devstoreaccount1", "--retry-attempts", "1"}, []string{sas}, 1, "reach", nil},
		{"unreachable endpoint with SAS, debug log", []string{"--container", "cont1", "--endpoint", "http://127.0.0.1:1/devstoreaccount1", "--retry-attempts", "1", "--log-level", "debug", "--foreground"}, []string{sas}, 1, "reach", nil},
		{"hung endpoint", []string{"--container", "cont1", "--endpoint", hung, "--check-timeout", "2s"}, []string{sas}, 1, "no answer within 2s (--check-timeout)", nil},
		{"bad container name", []string{"--container", "Not_Valid", "--account", "a", "--auth-type", "anonymous"}, nil, 1, "container name", nil},
		{"local dir and container", []string{"--local-dir", "/tmp", "--container", "cont1"}, nil, 2, "--local-dir and --container name two different stores", nil},
		{"local dir and endpoint", []string{"--local-dir", "/tmp", "--endpoint", "http://127.0.0.1:1/a"}, nil, 2, "--local-dir and --endpoint", nil},
		{"unknown flag", []string{"--no-such-flag"}, nil, 2, "see blobfs mount --help", nil},
		{"upload block 0", []string{"--upload-block-mb", "0"}, nil, 2, "--upload-block-mb 0: must be between 1 and 4000 (mib", nil},
		{"list cache 0", []string{"--list-cache-mb", "0"}, nil, 2, "--list-cache-mb 0: must be between 1 and 1048576 (mib", nil},
		{"walk ahead negative", []string{"--walk-ahead", "-1"}, nil, 2, "--walk-ahead -1: must be between 0 (disabled)", nil},
		{"cache below two blocks", []string{"--block-cache-mb", "4"}, nil, 2, "--block-cache-mb 4: must hold at least two read blocks of --read-block-mb 8, so 16 mib", nil},
		{"umask not octal", []string{"--umask", "9"}, nil, 2, "not an octal number", nil},
		{"negative timeout", []string{"--attr-timeout", "-1s"}, nil, 2, "--attr-timeout -1s: must not be negative", nil},
		{"conflicting credentials", []string{"--container", "cont1", "--account", "acct"}, []string{"AZURE_STORAGE_KEY=" + base64.StdEncoding.EncodeToString([]byte("k")), sas}, 1,
			"conflicting credentials: an account key (azure_storage_key) and a sas token (azure_storage_sas_token); choose one with --auth-type", nil},
		{"mountpoint missing", nil, nil, 1, "does not exist", func(t *testing.T) []string { return []string{"/nonexistent/mountpoint"} }},
		{"mountpoint not empty", nil, nil, 1, "is not empty", func(t *testing.T) []string {
			mp := t.TempDir()
			os.WriteFile(filepath.Join(mp, "keep"), []byte("x"), 0o644)
			return []string{mp}
		}},
		{"mountpoint already mounted", nil, nil, 1, "already a mount point", func(t *testing.T) []string {
			mp := t.TempDir()
			if err := syscall.Mount("tmpfs", mp, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
			return []string{mp}
		}},
	}
	if os.Getenv(storetest.EnvAzurite) != "" {
		cfg := storetest.AzuriteConfig(t)
		u, _ := url.Parse(cfg.Endpoint)
		cases = append(cases,
			testCase{"wrong key", []string{"--container", cfg.Container, "--endpoint", cfg.Endpoint, "--auth-type", "key"},
				[]string{"AZURE_STORAGE_ACCOUNT=" + blobstore.AzuriteAccount, "AZURE_STORAGE_KEY=" + strings.Repeat("A", 86) + "=="}, 1, "key", nil},
			testCase{"missing container", []string{"--container", "no-such-container", "--endpoint", cfg.Endpoint, "--auth-type", "key"},
				[]string{"AZURE_STORAGE_ACCOUNT=" + blobstore.AzuriteAccount, "AZURE_STORAGE_KEY=" + cfg.Key}, 1, "the container does not exist", nil},
			testCase{"unknown account", []string{"--container", cfg.Container, "--endpoint", u.Scheme + "://" + u.Host + "/nosuchaccount", "--account", "nosuchaccount", "--auth-type", "key"},
				[]string{"AZURE_STORAGE_KEY=" + cfg.Key}, 1, "no such account at this endpoint", nil},
			testCase{"endpoint without account path", []string{"--container", cfg.Container, "--endpoint", u.Scheme + "://" + u.Host + "/", "--account", blobstore.AzuriteAccount, "--auth-type", "key"},
				[]string{"AZURE_STORAGE_KEY=" + cfg.Key}, 1, "the endpoint has no account in its path", nil},
		)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mp := t.TempDir()
			args := append([]string{"mount"}, tc.args...)
			if tc.setup != nil {
				args = append(args, tc.setup(t)...)
			} else {
				args = append(args, mp)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Env = append(cleanEnv(), tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != tc.code {
				t.Fatalf("exit: %v (want status %d), output %q", err, tc.code, out)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			last := lines[len(lines)-1] // a debug log may come first
			if !slices.Contains(tc.args, "debug") && len(lines) != 1 || !strings.Contains(strings.ToLower(last), tc.want) {
				t.Fatalf("want one line mentioning %q, got %q", tc.want, out)
			}
			for i := 0; i+10 <= len(sig); i++ {
				if strings.Contains(string(out), sig[i:i+10]) {
					t.Fatalf("output carries the SAS signature: %q", out)
				}
			}
			if mounted(t, mp) {
				t.Fatal("something got mounted")
			}
			if pids := processesWith(t, mp); len(pids) > 0 {
				t.Fatalf("processes left running for %s: %v", mp, pids)
			}
			fmt.Fprintln(os.Stderr) // keep -v output readable
		})
	}
}

// processesWith lists the pids of processes whose command line names path.
func processesWith(t *testing.T, path string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && slices.Contains(strings.Split(string(b), "\x00"), path) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanEnv is the environment without Azure settings of the caller.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AZURE_") {
			env = append(env, kv)
		}
	}
	return env
}

// TestCreateContainer: --create-container makes a missing Azure container
// and mounts it.
func TestCreateContainer(t *testing.T) {
	if os.Getenv(storetest.EnvAzurite) == "" {
		t.Skip("needs Azurite (" + storetest.EnvAzurite + ")")
	}
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	cfg.Container += "-new" // does not exist yet
	t.Cleanup(func() { blobstore.DeleteContainer(context.Background(), cfg) })
	mp := t.TempDir()
	cmd := exec.Command(bin, "mount", "--create-container", "--container", cfg.Container, "--endpoint", cfg.Endpoint,
		"--auth-type", "key", "--log-file", filepath.Join(t.TempDir(), "log"), mp)
	cmd.Env = append(cleanEnv(), "AZURE_STORAGE_ACCOUNT="+blobstore.AzuriteAccount, "AZURE_STORAGE_KEY="+cfg.Key)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mp, "f"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	store, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3)
	if n, err := store.ReadAt(context.Background(), "f", buf, 0, ""); n != 3 || string(buf) != "new" {
		t.Fatalf("blob in the new container: %q %v", buf[:n], err)
	}
}

// TestChangesUnderSignals: a Go program whose requests are interrupted by
// signals all the time (SIGURG, as its runtime sends) makes, renames and
// removes directories and files on a real mount over Azurite without an
// error. Before changes ignored FUSE_INTERRUPT, an interrupted mkdir whose
// Put had landed answered EINTR, and the runtime's retry failed with
// EEXIST (39 of 500 os.Mkdir calls of a plain Go loop).
func TestChangesUnderSignals(t *testing.T) {
	if os.Getenv(storetest.EnvAzurite) == "" {
		t.Skip("needs Azurite (" + storetest.EnvAzurite + ")")
	}
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	mp := t.TempDir()
	cmd := exec.Command(bin, "mount", "--container", cfg.Container, "--endpoint", cfg.Endpoint,
		"--auth-type", "key", "--log-file", filepath.Join(t.TempDir(), "log"), mp)
	cmd.Env = append(cleanEnv(), "AZURE_STORAGE_ACCOUNT="+blobstore.AzuriteAccount, "AZURE_STORAGE_KEY="+cfg.Key)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
			t.Errorf("unmount: %v\n%s", err, out)
			syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	app := exec.Command(self)
	app.Env = append(os.Environ(), appEnv+"=signalled", "BLOBFS_TEST_APP_DIR="+mp, "BLOBFS_TEST_APP_N=100")
	if out, err := app.CombinedOutput(); err != nil {
		t.Fatalf("application: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(mp)
	if err != nil || len(entries) != 0 {
		t.Fatalf("mount after the application removed everything: %d entries (%v)", len(entries), err)
	}
}

// TestNonEmptyAndUnmountMessages: --nonempty (-o nonempty) mounts over
// files, which come back after the unmount; blobfs unmount says plainly
// what is wrong with a path that is not mounted or does not exist.
func TestNonEmptyAndUnmountMessages(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(mp, "under"), []byte("hidden"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "mount", "--nonempty", "--local-dir", store, "--log-file", filepath.Join(t.TempDir(), "log"), mp).CombinedOutput(); err != nil {
		t.Fatalf("mount --nonempty: %v: %s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if _, err := os.Stat(filepath.Join(mp, "under")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the mount does not cover the directory: %v", err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v: %s", err, out)
	}
	waitMounted(t, mp, false)
	if b, err := os.ReadFile(filepath.Join(mp, "under")); err != nil || string(b) != "hidden" {
		t.Fatalf("the covered file after unmount: %q, %v", b, err)
	}

	for _, tc := range []struct{ path, want string }{
		{mp, "unmount " + mp + ": not mounted"},
		{filepath.Join(mp, "nope"), "no such directory"},
	} {
		out, err := exec.Command(bin, "unmount", tc.path).CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), tc.want) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("blobfs unmount %s: %v, %q; want status 1 and one line with %q", tc.path, err, out, tc.want)
		}
	}
}

// TestUnmountRefusesOtherFilesystems: blobfs unmount detaches blobfs
// mounts only. A tmpfs is refused, with or without -z, in one line that
// says what is mounted there, and stays mounted with its files; a dead
// blobfs mount (its server killed: ENOTCONN), at a path with a space in
// it, is still unmounted.
func TestUnmountRefusesOtherFilesystems(t *testing.T) {
	bin := blobfsBin(t)
	tmp := t.TempDir()
	if err := syscall.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(tmp, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(tmp, "canary"), []byte("alive"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"unmount", tmp}, {"unmount", "-z", tmp}, {"umount", tmp + "/"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var exit *exec.ExitError
		want := tmp + " is a mount of type tmpfs"
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), want) || !strings.Contains(string(out), "not blobfs") || strings.Count(string(out), "\n") != 1 {
			t.Errorf("blobfs %q: %v, %q; want status 1 and one line with %q and \"not blobfs\"", args, err, out, want)
		}
		if b, err := os.ReadFile(filepath.Join(tmp, "canary")); !mounted(t, tmp) || err != nil || string(b) != "alive" {
			t.Fatalf("after blobfs %q the tmpfs is gone (mounted %v; its file: %q, %v)", args, mounted(t, tmp), b, err)
		}
	}

	store, mp := t.TempDir(), filepath.Join(t.TempDir(), "dead mount")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "mount", "--foreground", "--local-dir", store, "--cache-dir", t.TempDir(), "--log-file", filepath.Join(t.TempDir(), "log"), mp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); syscall.Unmount(mp, syscall.MNT_DETACH) })
	waitMounted(t, mp, true)
	if err := os.WriteFile(filepath.Join(mp, "f"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write to the mount before killing its server: %v", err)
	}
	// The connection, to abort should the killed server not go away.
	mi, ok := mountAt(mp)
	if !ok {
		t.Fatal("the mount is not in the mount table")
	}
	cmd.Process.Kill()
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		// Seen once under load: the killed server left a zombie whose
		// exit waited on a FLUSH to its own mount (fuse_flush in
		// do_exit), which nobody could answer. Not what this test is
		// about: make the mount dead as the kernel would once every
		// holder is gone, and say so.
		t.Logf("the killed server did not exit within 20 s; aborting FUSE connection %d", mi.Minor)
		os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", mi.Minor), []byte("1"), 0)
		<-waited
	}
	// statfs asks the server (a stat of the root may be answered from the
	// kernel's cache).
	var st syscall.Statfs_t
	if err := syscall.Statfs(mp, &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("statfs of the mount after its server was killed: %v; want ENOTCONN", err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("blobfs unmount of a dead blobfs mount: %v: %s", err, out)
	}
	if mounted(t, mp) {
		t.Fatal("the dead blobfs mount is still mounted after blobfs unmount")
	}
}
