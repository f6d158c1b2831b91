package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
)

// Commands the README and docs give that are not make targets (TestDocs
// checks those) run here as a user would run them, so that they cannot
// drift from the code: the systemd unit and the fstab line.

// unitLines returns the values of key= lines of a unit file, in order.
func unitLines(unit, key string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^`+key+`=(.*)$`).FindAllStringSubmatch(unit, -1) {
		out = append(out, strings.TrimSpace(m[1]))
	}
	return out
}

// TestSystemdUnit: deploy/systemd/blobfs@.service passes systemd-analyze
// verify, and its commands, run as systemd would run them for an instance
// (specifiers expanded, the EnvironmentFile's variables set, under a
// scratch root instead of /mnt, /var/cache and /var/log), mount the
// container; SIGTERM to the main process (KillMode=mixed) uploads and
// unmounts.
func TestSystemdUnit(t *testing.T) {
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/systemd/blobfs@.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	// What install puts in /sbin is the binary under test here.
	local := strings.ReplaceAll(unit, "/sbin/blobfs", bin)

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Errorf("systemd-analyze is not installed (.ci/run installs systemd): the unit is not verified")
	} else {
		dir := t.TempDir()
		path := filepath.Join(dir, "blobfs@"+cfg.Container+".service")
		if err := os.WriteFile(path, []byte(local), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(analyze, "verify", path).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	}

	if got := unitLines(unit, "Type"); len(got) != 1 || got[0] != "forking" {
		t.Errorf("Type=%v; the background mount forks", got)
	}
	root := t.TempDir()
	expand := func(s string) string {
		s = strings.ReplaceAll(s, "%i", cfg.Container)
		for _, d := range []string{"/mnt/", "/var/cache/", "/var/log/"} {
			s = strings.ReplaceAll(s, " "+d, " "+root+d)
		}
		return s
	}
	env := cleanEnv()
	env = append(env, "AZURE_STORAGE_ACCOUNT="+cfg.Account, "AZURE_STORAGE_KEY="+cfg.Key, "AZURE_STORAGE_BLOB_ENDPOINT="+cfg.Endpoint)
	run := func(line string) {
		t.Helper()
		ignoreFailure := strings.HasPrefix(line, "-")
		args := strings.Fields(expand(strings.TrimPrefix(line, "-")))
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil && !ignoreFailure {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for _, pre := range unitLines(local, "ExecStartPre") {
		run(pre)
	}
	starts := unitLines(local, "ExecStart")
	if len(starts) != 1 {
		t.Fatalf("ExecStart lines: %q", starts)
	}
	run(starts[0])
	mp := filepath.Join(root, "mnt/blobfs", cfg.Container)
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if !mounted(t, mp) {
		t.Fatalf("ExecStart returned and %s is not mounted", mp)
	}
	if err := os.WriteFile(filepath.Join(mp, "from-systemd.txt"), []byte("unit"), 0o644); err != nil {
		t.Fatal(err)
	}
	// systemctl stop, KillMode=mixed: SIGTERM to the main process, the
	// supervisor (the worker's parent).
	w := waitWorker(t, mp, 0)
	if err := syscall.Kill(w.ppid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExited(t, w.ppid, "supervisor")
	if mounted(t, mp) {
		t.Error("still mounted after the unit's stop")
	}
	store, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBlob(t, store, "from-systemd.txt"); string(got) != "unit" {
		t.Errorf("blob from-systemd.txt holds %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, "var/log/blobfs", cfg.Container+".log")); err != nil {
		t.Errorf("the unit's --log-file: %v", err)
	}
}

// TestFstabLine: the /etc/fstab line of docs/usage.md, with the container
// and paths of this test, mounts through mount.blobfs as mount(8) runs it
// (SOURCE MOUNTPOINT -o OPTIONS).
func TestFstabLine(t *testing.T) {
	bin := blobfsBin(t)
	cfg := storetest.AzuriteConfig(t)
	usage, err := os.ReadFile(filepath.Join(repoRoot, "docs/usage.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^# /etc/fstab\n(.+)$`).FindStringSubmatch(string(usage))
	if m == nil {
		t.Fatal("docs/usage.md: no line after '# /etc/fstab'")
	}
	fields := strings.Fields(m[1])
	if len(fields) != 6 || fields[2] != "blobfs" {
		t.Fatalf("docs/usage.md's fstab line %q: want SOURCE MOUNTPOINT blobfs OPTIONS 0 0", m[1])
	}
	mp, cache := t.TempDir(), t.TempDir()
	opts := strings.ReplaceAll(fields[3], "/var/cache/blobfs", cache)
	source := strings.ReplaceAll(fields[0], "mycontainer", cfg.Container)
	cmd := exec.Command(filepath.Join(filepath.Dir(bin), "mount.blobfs"), source, mp, "-o", opts+",log-file="+filepath.Join(t.TempDir(), "log"))
	cmd.Env = append(cleanEnv(), "AZURE_STORAGE_ACCOUNT="+cfg.Account, "AZURE_STORAGE_KEY="+cfg.Key, "AZURE_STORAGE_BLOB_ENDPOINT="+cfg.Endpoint)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mount.blobfs %s %s -o %s: %v\n%s", source, mp, opts, err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mp, "from-fstab.txt"), []byte("fstab"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount: %v\n%s", err, out)
	}
	waitMounted(t, mp, false)
	store, err := blobstore.NewAzure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBlob(t, store, "from-fstab.txt"); string(got) != "fstab" {
		t.Errorf("blob from-fstab.txt holds %q", got)
	}
}
