package storetest

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// BinaryForOtherUsers is for tests that run the test binary as another
// user: go test builds it in a directory only root may enter, so this
// copies it, executable by everyone, into a fresh directory every user can
// reach (removed with the test), and returns both. It skips the test when
// not run as root, who alone can start a process as another user.
func BinaryForOtherUsers(t testing.TB, prefix string) (dir, bin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, prefix+"test")
	copyTestBinary(t, bin)
	return dir, bin
}

// copyTestBinary copies the running test binary to dst, executable by
// everyone.
func copyTestBinary(t testing.TB, dst string) {
	t.Helper()
	src, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
