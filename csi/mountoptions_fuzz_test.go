package csi

import (
	"strings"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// FuzzMountOptions feeds the CSI mount option parser (PV mountOptions, the
// mountOptions parameter) arbitrary option lists. It must never panic; an
// error is one line that names the field; and whatever it accepts, the
// filesystem accepts too: a volume whose options pass NodeStage's checks
// must not fail later when it is mounted.
func FuzzMountOptions(f *testing.F) {
	for _, seed := range []string{
		"uid=1000,umask=022", "-o ro,allow_other", "block-cache-mb=8", "block-cache-mb=16,read-block-mb=8",
		"read-block-mb=256", "umask=8888", "attr-timeout=-1s", "--upload-block-mb=4000", "prefetch-files=0",
		"fuse-readers=999", "list-timeout=0", "ro=maybe", "cache-dir=/", "a,,b", "\x00", "gid=4294967294",
		"retry-max-delay=25h", "readahead-blocks=1024,block-cache-mb=16",
		"-o allow_other --file-cache-timeout-in-seconds=120", "-o attr_timeout=120", "--use-adls=true", "-o\n-o", "--cache-size-mb=1000",
	} {
		f.Add(seed)
	}
	store := blobstore.NewMemory()
	f.Fuzz(func(t *testing.T, opts string) {
		s, err := parseMountOptions(strings.Split(opts, "\n"), "mountOptions")
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "mountOptions: ") {
				t.Fatalf("error is not one line naming the field: %q", msg)
			}
			return
		}
		o := s.FS
		o.CacheDir = t.TempDir()
		fsys, err := fusefs.New(store, o)
		if err != nil {
			t.Fatalf("parseMountOptions accepted %q, but the filesystem refuses it: %v", opts, err)
		}
		fsys.Close()
	})
}
