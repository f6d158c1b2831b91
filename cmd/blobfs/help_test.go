package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the output")

// TestHelpGolden: `blobfs COMMAND --help` is what testdata/help-COMMAND.golden
// holds (go test -run TestHelpGolden -update rewrites them after a
// deliberate change), and shows every default in its own unit: the umask
// in octal, durations as durations, sizes with their MiB.
func TestHelpGolden(t *testing.T) {
	// Defaults that come from the environment, fixed.
	for _, k := range []string{
		"AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_CONTAINER",
		"AZURE_STORAGE_AUTH_TYPE", "AZURE_STORAGE_BLOB_ENDPOINT", "AZURE_STORAGE_CONNECTION_STRING",
		"AZURE_STORAGE_CONTAINER", "AZURE_STORAGE_IDENTITY_CLIENT_ID", "AZURE_STORAGE_KEY",
		"AZURE_STORAGE_SAS_TOKEN", "CSI_ENDPOINT",
	} {
		t.Setenv(k, "")
	}
	t.Setenv("KUBE_NODE_NAME", "node-1")
	// --uid and --gid default to the user running the command: shown as
	// "(default 1000)", or not at all for root (pflag hides a zero).
	ownDefault := regexp.MustCompile(`(?m)^(\s+--[ug]id int .*?)( \(default \d+\))?$`)

	for _, tc := range []struct {
		cmd   string
		usage string
		// lines: a flag (its first column) and what its line must show
		lines [][2]string
	}{
		{"mount", "blobfs mount [flags] MOUNTPOINT", [][2]string{
			{"--umask octal", "(default 0022)"},
			{"--attr-timeout duration", "(0 disables) (default 1s)"},
			{"--check-timeout duration", "(default 30s)"},
			{"--retry-max-delay duration", "(default 5s)"},
			{"--retry-attempts int", "the first included; one only while the mount's retry budget is spent (default 5)"},
			{"--block-cache-mb int", "MiB (default 256)"},
			{"--read-block-mb int", "MiB (default 8)"},
			{"--kernel-readahead-kb int", "KiB (root only; -1 keeps the kernel's 128) (default 4096)"},
			{"--file-mode octal", "default: stored, else 0666 minus --umask)"},
			{"--posix-attrs[=true|false]", "(default true)"},
		}},
		{"csi", "blobfs csi [flags]", [][2]string{
			{"--health-interval duration", "(default 30s)"},
			{"--node-id string", `(default "node-1")`},
		}},
		{"keeper", "blobfs keeper --socket PATH [flags]", [][2]string{
			{"--socket string", "(required; the driver's --keeper-socket)"},
			{"--log-level string", `(default "info")`},
		}},
		{"registrar", "blobfs registrar [flags]", [][2]string{
			{"--check-interval duration", "(default 1s)"},
		}},
		{"unmount", "blobfs unmount [-z] MOUNTPOINT", [][2]string{
			{"-z, --lazy", "detach now even if busy"},
		}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			var out bytes.Buffer
			root := newRootCommand()
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs([]string{tc.cmd, "--help"})
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			got := ownDefault.ReplaceAllString(out.String(), "$1")
			if !strings.Contains(got, "Usage:\n  "+tc.usage+"\n") {
				t.Errorf("blobfs %s --help has no usage line %q:\n%s", tc.cmd, tc.usage, got)
			}
			for _, l := range tc.lines {
				line := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(l[0]) + `[\s[].*$`).FindString(got)
				if !strings.Contains(line, l[1]) {
					t.Errorf("blobfs %s --help: want a line %s ... %s, got %q", tc.cmd, l[0], l[1], line)
				}
			}
			golden := filepath.Join("testdata", "help-"+tc.cmd+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestHelpGolden -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("blobfs %s --help differs from %s (go test -run TestHelpGolden -update rewrites it):\n%s", tc.cmd, golden, lineDiff(string(want), got))
			}
		})
	}
}

// lineDiff lists the lines of want and got that differ, by line number.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}
