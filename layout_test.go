package blobfs_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The layout of the code: which of the project's packages each package
// may import (its non-test files). Imports run one way, from the commands
// down to the store: a package that needs one it may not import is a sign
// that code sits in the wrong place, not that the table is wrong. A new
// package needs a row here, with a word on what it owns.
var allowedImports = map[string][]string{
	// The blob store interface and its backends (Azure, local directory,
	// memory, faults, retries): the bottom.
	"blobstore": nil,
	// Shared test stores (Azurite, a local directory, faults).
	"blobstore/storetest": {"blobstore"},
	// MD5 of a block and of the whole blob in one pass.
	"fusefs/internal/md5pair": nil,
	// The keeper and its client: mounts carried across restarts of the
	// serving process, their fds and records opaque.
	"fusefs/handoff": nil,
	// Block buffers, the process's memory budget, upload buffers.
	"fusefs/memory": nil,
	// Content-MD5 checks of whole reads.
	"fusefs/contentsum": nil,
	// Blobs as entries: names checked, metadata read as kinds and POSIX
	// attributes.
	"fusefs/meta": {"blobstore", "fusefs/contentsum"},
	// Directory listings, page merges, tree walks.
	"fusefs/listing": {"blobstore", "fusefs/meta"},
	// The write side: block streams, their MD5, upload progress.
	"fusefs/upload": {"blobstore", "fusefs/internal/md5pair", "fusefs/memory"},
	// The state region's format: what a server journals for its successor.
	"fusefs/journal": nil,
	// The FUSE kernel connection: mounting, the session loop, adoption.
	"fusefs/kernel": {"fusefs/memory"},
	// The read side: block, chunk and disk caches over the store.
	"fusefs/cache": {"blobstore", "fusefs/contentsum", "fusefs/memory"},
	// The filesystem, its caches, uploads and the restart mechanism.
	"fusefs": {"blobstore", "fusefs/cache", "fusefs/contentsum", "fusefs/journal", "fusefs/kernel", "fusefs/listing", "fusefs/memory", "fusefs/meta", "fusefs/upload"},
	// Prometheus metrics of a mounted filesystem.
	"fusefs/fsmetrics": {"blobstore", "fusefs"},
	// The mount options, each defined once (name, kind, bounds, default,
	// help, what it sets in fusefs's options): blobfs mount's flags and
	// CSI volumes' mountOptions.
	"mountopt": {"blobstore", "fusefs", "fusefs/kernel", "fusefs/listing"},
	// The CSI driver: it mounts through fusefs, in-process.
	"csi": {"blobstore", "fusefs", "fusefs/cache", "fusefs/fsmetrics", "fusefs/handoff", "fusefs/kernel", "mountopt"},
	// The one binary: mount, supervisor, keeper, CSI driver, registrar.
	"cmd/blobfs": {"blobstore", "csi", "fusefs", "fusefs/cache", "fusefs/fsmetrics", "fusefs/handoff", "fusefs/kernel", "fusefs/listing", "fusefs/memory", "mountopt"},
	// Builds the driver's image without Docker.
	"cmd/blobfs-image": nil,
	// Throughput benchmarks and their commands.
	"bench":                          {"blobstore", "fusefs", "fusefs/kernel", "fusefs/memory"},
	"bench/cmd/blobfs-bench":         {"bench"},
	"bench/cmd/blobfs-dirbench":      {"bench", "blobstore", "fusefs", "fusefs/kernel"},
	"bench/cmd/blobfs-restart-bench": {"bench"},
	// Manifests (tested, no code), and the end-to-end tests on a real
	// kubelet.
	"deploy":              {},
	"deploy/e2e":          {},
	"deploy/e2e/standins": {},
}

// TestLayout fails when a package imports a project package its row does
// not allow, or when a package has no row.
func TestLayout(t *testing.T) {
	module := modulePath(t)
	imports, lines := projectPackages(t, module)
	var names []string
	for p := range imports {
		names = append(names, p)
	}
	sort.Strings(names)
	total := 0
	for _, n := range lines {
		total += n
	}
	for _, p := range names {
		allowed, ok := allowedImports[p]
		if !ok {
			t.Errorf("package %s has no row in allowedImports (layout_test.go): add one that says what it owns and what it may import", p)
			continue
		}
		for _, imp := range imports[p] {
			if !slices.Contains(allowed, imp) {
				t.Errorf("package %s imports %s, which its row in allowedImports does not allow", p, imp)
			}
		}
		t.Logf("%-32s %6d lines (%4.1f%% of the project's non-test Go)", p, lines[p], 100*float64(lines[p])/float64(total))
	}
	for p := range allowedImports {
		if _, ok := imports[p]; !ok {
			t.Errorf("allowedImports has a row for %s, which is not a package of the project", p)
		}
	}
}

func modulePath(t *testing.T) string {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			return strings.TrimSpace(m)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

// projectPackages reads every package directory below the module root
// (test-only ones too): the project packages each one's non-test files
// import (relative to the module), and its count of non-test lines.
func projectPackages(t *testing.T, module string) (map[string][]string, map[string]int) {
	imports, lines := map[string][]string{}, map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != "." {
				return filepath.SkipDir // a module of its own (deploy/e2e/kube pins tools)
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		if dir == "." {
			return nil // this test
		}
		if _, ok := imports[dir]; !ok {
			imports[dir] = nil
		}
		if strings.HasSuffix(path, "_test.go") {
			return nil // tests may use what they test with
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		lines[dir] += strings.Count(string(src), "\n")
		for _, is := range f.Imports {
			p, _ := strconv.Unquote(is.Path.Value)
			if rel, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(imports[dir], rel) {
				imports[dir] = append(imports[dir], rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return imports, lines
}
