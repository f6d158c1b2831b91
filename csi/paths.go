package csi

import (
	"fmt"
	"path/filepath"
	"strings"
)

// checkPath validates a staging or target path from a request: present,
// absolute, and inside the kubelet directory. It returns the cleaned path.
// A path outside the kubelet directory is refused so that a request cannot
// make the driver (root, in the host's mount namespace) mount over or
// remove arbitrary host directories.
func (d *Driver) checkPath(field, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s is missing", field)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%s contains a NUL byte", field)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s %q is not an absolute path", field, clip(p, 200))
	}
	clean := filepath.Clean(p)
	rel, err := filepath.Rel(d.kubeletDir, clean)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s %q is not inside the kubelet directory %s", field, clip(p, 200), d.kubeletDir)
	}
	return clean, nil
}
