package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestNormalizeArgs: the long flags Go's flag package took with one dash
// get their second; shorthands, values and what follows "--" do not.
func TestNormalizeArgs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"mount -container c -read-only /mnt", "mount --container c --read-only /mnt"},
		{"mount -umask=027 -read-only=false /mnt", "mount --umask=027 --read-only=false /mnt"},
		{"mount --container c /mnt", "mount --container c /mnt"},
		{"mount -kernel-readahead-kb -1 /mnt", "mount --kernel-readahead-kb -1 /mnt"},
		{"mount --log-file -container /mnt", "mount --log-file -container /mnt"},
		{"mount -no-such-flag /mnt", "mount --no-such-flag /mnt"},
		{"mount -h", "mount -h"},
		{"mount -help", "mount --help"},
		{"mount -- -container", "mount -- -container"},
		{"mount-worker -cache-dir=/c -log-file /l /mnt", "mount-worker --cache-dir=/c --log-file /l /mnt"},
		{"unmount -z /mnt", "unmount -z /mnt"},
		{"umount -z /mnt", "umount -z /mnt"},
		{"csi -endpoint unix:///s -mode node", "csi --endpoint unix:///s --mode node"},
		{"-version", "--version"},
		{"--version", "--version"},
		{"keeper -socket /k.sock", "keeper --socket /k.sock"},
	} {
		got := strings.Join(normalizeArgs(newRootCommand(), strings.Fields(tc.in)), " ")
		if got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCommandLine runs the binary as a user would: the version in both
// forms, completion, help, and mistakes answered in one line with exit
// status 2.
func TestCommandLine(t *testing.T) {
	bin := blobfsBin(t)
	mp := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string // in the output
		one  bool   // the output is one line
	}{
		{[]string{"--version"}, 0, "blobfs " + version + "\n", true},
		{[]string{"-version"}, 0, "blobfs " + version + "\n", true},
		{[]string{"version"}, 0, "blobfs " + version + "\n", true},
		{[]string{"completion", "bash"}, 0, "__start_blobfs", false},
		{[]string{"completion", "zsh"}, 0, "#compdef blobfs", false},
		{[]string{"--help"}, 0, "completion", false},
		{[]string{"help", "mount"}, 0, "--umask octal", false},
		{[]string{"mount", "-help"}, 0, "Usage:\n  blobfs mount [flags] MOUNTPOINT", false},
		{[]string{"mount", "-umask", "9", mp}, 2, "invalid argument \"9\" for \"--umask\" flag: not an octal number (usage: blobfs mount [flags] MOUNTPOINT; see blobfs mount --help)", true},
		{[]string{"mount", "-no-such-flag", mp}, 2, "unknown flag: --no-such-flag", true},
		{[]string{"mount"}, 2, "mount needs exactly one MOUNTPOINT", true},
		{[]string{"unmount", "-z"}, 2, "unmount needs exactly one MOUNTPOINT", true},
		{[]string{"unmount", "-x", mp}, 2, "see blobfs unmount --help", true},
		{[]string{"csi", "extra"}, 2, "csi takes no arguments", true},
		{[]string{"keeper"}, 2, "keeper needs --socket", true},
		{[]string{"no-such-command"}, 2, `unknown command "no-such-command" (see blobfs --help)`, true},
		{nil, 2, "a command is needed", true},
		{[]string{"mount-worker", mp}, 2, "not by hand", true},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.want) || tc.one && strings.Count(string(out), "\n") != 1 {
			t.Errorf("blobfs %q: exit status %d, output %q; want status %d and %s%q", tc.args, code, out, tc.code, map[bool]string{true: "one line with "}[tc.one], tc.want)
		}
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	if strings.Contains(string(out), workerMode) {
		t.Errorf("blobfs --help lists the hidden %s:\n%s", workerMode, out)
	}
}

// TestSingleDashFlags: a background mount given its flags in the single
// dash form of Go's flag package mounts with them; its supervisor passes
// them on to the worker, which serves the mount with them (a file's mode
// from -umask); unmount -z detaches it.
func TestSingleDashFlags(t *testing.T) {
	bin := blobfsBin(t)
	store, mp := t.TempDir(), t.TempDir()
	log := filepath.Join(t.TempDir(), "log")
	out, err := exec.Command(bin, "mount", "-local-dir", store, "-umask=027", "-log-file", log, "-read-block-mb", "4", mp).CombinedOutput()
	if err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	if !mounted(t, mp) {
		t.Fatal("not mounted after blobfs mount returned")
	}
	// The worker has the flags, in their long form.
	var worker []string
	for _, pid := range processesWith(t, mp) {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"); slices.Contains(args, workerMode) {
			worker = args
		}
	}
	if !slices.Contains(worker, "--umask=0027") || !slices.Contains(worker, "--local-dir="+store) || !slices.Contains(worker, "--read-block-mb=4") {
		t.Errorf("worker runs with %q; want --umask=0027, --local-dir=%s and --read-block-mb=4", worker, store)
	}
	// A file stored without a mode gets 0666 minus the umask.
	if err := os.WriteFile(filepath.Join(store, "plain"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(mp, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o640 {
		t.Errorf("a file stored without a mode has mode %#o under -umask=027; want 0640", got)
	}
	if out, err := exec.Command(bin, "unmount", "-z", mp).CombinedOutput(); err != nil {
		t.Fatalf("unmount -z: %v\n%s", err, out)
	}
	waitMounted(t, mp, false)
}
