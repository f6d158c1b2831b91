package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Artifacts: everything the cluster runs, built or fetched once into the
// cache directory and reused while its key (the Kubernetes version, the
// package list, the image recipe) stays the same. Each artifact is made in
// a temporary directory and renamed into place, so a killed run never
// leaves a half-made one that a later run would trust.

// kubeVersion is the Kubernetes release the tests run; kube/go.mod pins
// the same.
const kubeVersion = "v1.34.4"

// kubeCommands are built from k8s.io/kubernetes. The scheduler places
// the pods of deploy/'s DaemonSet and Deployment (the test's own pods
// name their node).
var kubeCommands = []string{"kubelet", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"}

// debianPackages are unpacked (dpkg -x) into the cache, not installed.
var debianPackages = []string{"containerd", "runc", "etcd-server", "busybox-static", "containernetworking-plugins"}

// Image references the pods use; imported into containerd, never pulled.
const (
	pauseImage   = "localhost/pause:3.10"
	busyboxImage = "localhost/busybox:e2e"
)

type artifacts struct {
	cache   string // root of the cache
	kubeBin string // kubelet, kube-apiserver, kube-controller-manager, kubectl
	root    string // unpacked Debian packages (usr/bin/containerd, ...)
	images  string // pause.tar, busybox.tar (docker-save format)
}

// ensureArtifacts builds or fetches what is missing.
func ensureArtifacts(cache, repo string) (*artifacts, error) {
	a := &artifacts{
		cache:   cache,
		kubeBin: filepath.Join(cache, "kube-"+kubeVersion, "bin"),
		root:    filepath.Join(cache, "debian-root-"+shortHash(strings.Join(debianPackages, " "))),
		images:  filepath.Join(cache, "images-"+shortHash(pauseSource+imageRecipeVersion)),
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	if err := a.ensureKube(repo); err != nil {
		return nil, fmt.Errorf("kubernetes binaries: %w", err)
	}
	if err := a.ensureDebian(); err != nil {
		return nil, fmt.Errorf("debian packages: %w", err)
	}
	if err := a.ensureImages(); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	return a, nil
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:4])
}

func (a *artifacts) bin(name string) string { return filepath.Join(a.kubeBin, name) }

// cniBin is the directory of the CNI plugins (bridge, host-local, loopback).
func (a *artifacts) cniBin() string { return filepath.Join(a.root, "usr/lib/cni") }

// debBin finds a program in the unpacked packages.
func (a *artifacts) debBin(name string) string {
	for _, d := range []string{"usr/bin", "usr/sbin", "bin", "sbin"} {
		p := filepath.Join(a.root, d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join(a.root, "usr/bin", name)
}

// ensureKube builds the Kubernetes commands from deploy/e2e/kube (a module
// that requires k8s.io/kubernetes and replaces its staging modules by
// their published versions). Cold: about 15 minutes on 2 cores; -p 2
// keeps memory under about 2 GB.
func (a *artifacts) ensureKube(repo string) error {
	missing := false
	for _, c := range kubeCommands {
		if _, err := os.Stat(a.bin(c)); err != nil {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	tmp := a.kubeBin + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	minor := strings.Split(strings.TrimPrefix(kubeVersion, "v"), ".")[1]
	ld := "-s -w"
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ld += fmt.Sprintf(" -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean", p, kubeVersion, p, p, minor, p)
	}
	args := []string{"build", "-p", "2", "-trimpath", "-ldflags", ld, "-o", tmp + "/"}
	for _, c := range kubeCommands {
		args = append(args, "k8s.io/kubernetes/cmd/"+c)
	}
	logf("building Kubernetes %s (%s) from the Go module proxy; cold this takes 5 to 15 minutes", kubeVersion, strings.Join(kubeCommands, ", "))
	start := time.Now()
	cmd := exec.Command("nice", append([]string{"-n", "10", "go"}, args...)...)
	cmd.Dir = filepath.Join(repo, "deploy", "e2e", "kube")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	os.RemoveAll(a.kubeBin)
	if err := os.Rename(tmp, a.kubeBin); err != nil {
		return err
	}
	logf("built Kubernetes %s in %s", kubeVersion, time.Since(start).Round(time.Second))
	return nil
}

// ensureDebian downloads the packages with apt-get download (no install)
// and unpacks them with dpkg -x.
func (a *artifacts) ensureDebian() error {
	done := filepath.Join(a.root, ".complete")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	tmp := a.root + ".tmp"
	os.RemoveAll(tmp)
	debs := filepath.Join(tmp, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	logf("downloading Debian packages %s", strings.Join(debianPackages, ", "))
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", append([]string{"download"}, debianPackages...)...)
		cmd.Dir = debs
		return cmd.CombinedOutput()
	}
	if out, err := download(); err != nil {
		logf("apt-get download failed (%v: %s); running apt-get update", err, lastLines(string(out), 3))
		if out, err := exec.Command("apt-get", "update").CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get update: %v\n%s", err, out)
		}
		if out, err := download(); err != nil {
			return fmt.Errorf("apt-get download %s: %v\n%s", strings.Join(debianPackages, " "), err, out)
		}
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(files) < len(debianPackages) {
		return fmt.Errorf("apt-get download left %d packages, want %d", len(files), len(debianPackages))
	}
	root := filepath.Join(tmp, "root")
	for _, f := range files {
		if out, err := exec.Command("dpkg-deb", "-x", f, root).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v\n%s", f, err, out)
		}
	}
	os.RemoveAll(a.root)
	if err := os.Rename(root, a.root); err != nil {
		return err
	}
	os.RemoveAll(tmp)
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "runc", "etcd", "busybox"} {
		if _, err := os.Stat(a.debBin(p)); err != nil {
			return fmt.Errorf("the packages hold no %s", p)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(a.cniBin(), p)); err != nil {
			return fmt.Errorf("the packages hold no CNI plugin %s", p)
		}
	}
	return os.WriteFile(done, []byte(strings.Join(debianPackages, "\n")+"\n"), 0o644)
}

// pauseSource is the sandbox's pause process (after kubernetes/build/pause).
const pauseSource = `#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void sigdown(int signo) { psignal(signo, "Shutting down, got signal"); exit(0); }
static void sigreap(int signo) { (void)signo; while (waitpid(-1, NULL, WNOHANG) > 0) ; }
int main(void) {
  struct sigaction a = {.sa_handler = sigdown};
  sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  struct sigaction r = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
  return 42;
}
`

// imageRecipeVersion changes the image cache key when the recipe changes.
const imageRecipeVersion = "busybox-all-applets-1"

// ensureImages makes the pause and busybox images as docker-save tarballs.
func (a *artifacts) ensureImages() error {
	if _, err := os.Stat(filepath.Join(a.images, "busybox.tar")); err == nil {
		return nil
	}
	tmp := a.images + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	src := filepath.Join(tmp, "pause.c")
	if err := os.WriteFile(src, []byte(pauseSource), 0o644); err != nil {
		return err
	}
	pause := filepath.Join(tmp, "pause")
	if out, err := exec.Command("gcc", "-Os", "-static", "-s", "-o", pause, src).CombinedOutput(); err != nil {
		return fmt.Errorf("gcc -static pause.c (needs gcc and libc6-dev): %v\n%s", err, out)
	}
	pauseBin, err := os.ReadFile(pause)
	if err != nil {
		return err
	}
	if err := writeImage(filepath.Join(tmp, "pause.tar"), pauseImage, nil, []string{"/pause"},
		[]layerFile{{name: "pause", mode: 0o755, data: pauseBin}}); err != nil {
		return err
	}

	busybox, err := os.ReadFile(a.debBin("busybox"))
	if err != nil {
		return err
	}
	out, err := exec.Command(a.debBin("busybox"), "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %v", err)
	}
	files := []layerFile{
		{name: "bin/", mode: 0o755}, {name: "tmp/", mode: 0o1777}, {name: "etc/", mode: 0o755},
		{name: "proc/", mode: 0o755}, {name: "sys/", mode: 0o755}, {name: "dev/", mode: 0o755}, {name: "data/", mode: 0o755},
		{name: "bin/busybox", mode: 0o755, data: busybox},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\n")},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			files = append(files, layerFile{name: "bin/" + applet, link: "busybox"})
		}
	}
	if err := writeImage(filepath.Join(tmp, "busybox.tar"), busyboxImage, nil, []string{"/bin/sh"}, files); err != nil {
		return err
	}
	os.RemoveAll(a.images)
	return os.Rename(tmp, a.images)
}

type layerFile struct {
	name string // relative; a trailing / makes a directory
	mode int64
	data []byte
	link string // symlink target
}

// writeImage writes a one-layer image in docker-save format, which
// `ctr images import` reads.
func writeImage(out, ref string, entrypoint, cmd []string, files []layerFile) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		case strings.HasSuffix(f.name, "/"):
			h.Typeflag = tar.TypeDir
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffSum := sha256.Sum256(layer.Bytes())
	diffID := hex.EncodeToString(diffSum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
		"config": map[string]any{"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
	})
	if err != nil {
		return err
	}
	cfgSum := sha256.Sum256(config)
	cfgName := hex.EncodeToString(cfgSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{ref}, "Layers": []string{diffID + "/layer.tar"}}})
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw = tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {cfgName, config}, {diffID + "/", nil}, {diffID + "/layer.tar", layer.Bytes()}} {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: time.Unix(0, 0)}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, bytes.NewReader(e.data)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
