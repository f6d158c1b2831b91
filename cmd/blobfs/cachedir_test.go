package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestForegroundMountRemovesItsCacheDir: a foreground mount that made its
// own cache directory (no --cache-dir) removes it when it ends cleanly,
// whether unmounted from outside or stopped by SIGTERM; a directory the
// user named stays.
func TestForegroundMountRemovesItsCacheDir(t *testing.T) {
	bin := blobfsBin(t)
	cases := []struct {
		name     string
		cacheDir bool // pass --cache-dir
		stop     func(t *testing.T, cmd *exec.Cmd, mp string)
	}{
		{"unmounted", false, func(t *testing.T, cmd *exec.Cmd, mp string) {
			if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
				t.Fatalf("unmount: %v\n%s", err, out)
			}
		}},
		{"SIGTERM", false, func(t *testing.T, cmd *exec.Cmd, mp string) {
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}},
		{"named by the user", true, func(t *testing.T, cmd *exec.Cmd, mp string) {
			if out, err := exec.Command(bin, "unmount", mp).CombinedOutput(); err != nil {
				t.Fatalf("unmount: %v\n%s", err, out)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store, mp, tmp := t.TempDir(), t.TempDir(), t.TempDir()
			args := []string{"mount", "--foreground", "--local-dir", store}
			userDir := filepath.Join(t.TempDir(), "cache")
			if tc.cacheDir {
				args = append(args, "--cache-dir", userDir)
			}
			cmd := exec.Command(bin, append(args, mp)...)
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); syscall.Unmount(mp, syscall.MNT_DETACH) })
			waitMounted(t, mp, true)
			if err := os.WriteFile(filepath.Join(mp, "f.txt"), []byte("through the mount"), 0o644); err != nil {
				t.Fatal(err)
			}
			made, _ := filepath.Glob(filepath.Join(tmp, "blobfs-cache-*"))
			if tc.cacheDir != (len(made) == 0) {
				t.Fatalf("while mounted, $TMPDIR holds %v", made)
			}

			tc.stop(t, cmd, mp)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("blobfs exited with %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("blobfs did not exit")
			}
			if got, err := os.ReadFile(filepath.Join(store, "f.txt")); err != nil || string(got) != "through the mount" {
				t.Fatalf("store has %q, %v", got, err)
			}
			if left, _ := filepath.Glob(filepath.Join(tmp, "*")); len(left) != 0 {
				t.Errorf("left behind in $TMPDIR after a clean end: %v", left)
			}
			if _, err := os.Stat(userDir); tc.cacheDir && err != nil {
				t.Errorf("the cache directory the user named is gone: %v", err)
			}
		})
	}
}
