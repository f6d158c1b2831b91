package storetest

import (
	"io"
	"os"
	"testing"
)

// CopyTestBinary copies the running test binary to dst, executable by
// everyone: tests that run it as another user (whose permissions do not
// reach the build cache) run the copy.
func CopyTestBinary(t testing.TB, dst string) {
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
