package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// fakeBinary is enough of an ELF file for the builder.
var fakeBinary = append([]byte("\x7fELF"), bytes.Repeat([]byte("blobfs"), 1000)...)

func writeInputs(t *testing.T) (bin, ca string) {
	t.Helper()
	dir := t.TempDir()
	bin, ca = filepath.Join(dir, "blobfs"), filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(bin, fakeBinary, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n...\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return bin, ca
}

// TestImage: the tarball holds both tags of one image whose layer has the
// binary (0755), its mount.blobfs link and the CA certificates, and whose
// config runs blobfs and dates everything at the epoch.
func TestImage(t *testing.T) {
	bin, ca := writeInputs(t)
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := run([]string{"-binary", bin, "-ca-bundle", ca, "-o", out, "-version", "0.1.0-abc", "-epoch", "1700000000",
		"-tag", "blobfs:0.1.0", "-tag", "blobfs:0.1.0-abc"}); err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"blobfs:0.1.0", "blobfs:0.1.0-abc"} {
		ref, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(out, &ref)
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/usr/local/bin/blobfs" {
			t.Errorf("entrypoint %q", cf.Config.Entrypoint)
		}
		if cf.Config.Labels["org.opencontainers.image.version"] != "0.1.0-abc" || cf.Architecture != "amd64" || cf.OS != "linux" {
			t.Errorf("config: labels %v, platform %s/%s", cf.Config.Labels, cf.OS, cf.Architecture)
		}
		if !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("created %v, want the epoch", cf.Created.Time)
		}
		files := map[string]*tar.Header{}
		contents := map[string][]byte{}
		tr := tar.NewReader(mutate.Extract(img))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			n := strings.TrimSuffix(h.Name, "/") // Extract drops a directory's slash
			files[n] = h
			contents[n], _ = io.ReadAll(tr)
			if !h.ModTime.Equal(time.Unix(1700000000, 0)) || h.Uid != 0 || h.Gid != 0 {
				t.Errorf("%s: mtime %v, owner %d:%d; want the epoch, root", h.Name, h.ModTime, h.Uid, h.Gid)
			}
		}
		if h := files[binPath]; h == nil || h.Mode != 0o755 || !bytes.Equal(contents[binPath], fakeBinary) {
			t.Errorf("%s: %+v", binPath, h)
		}
		if h := files[helperPath]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "blobfs" {
			t.Errorf("%s: %+v", helperPath, h)
		}
		if h := files[caPath]; h == nil || len(contents[caPath]) == 0 {
			t.Errorf("%s: %+v", caPath, h)
		}
		if h := files["tmp"]; h == nil || h.Mode&0o7777 != 0o1777 {
			t.Errorf("tmp: %+v", h)
		}
	}
}

// TestImageReproducible: the same inputs give the same bytes (and so the
// same digest); another epoch gives another image.
func TestImageReproducible(t *testing.T) {
	bin, ca := writeInputs(t)
	build := func(epoch string) []byte {
		out := filepath.Join(t.TempDir(), "image.tar")
		if err := run([]string{"-binary", bin, "-ca-bundle", ca, "-o", out, "-version", "v", "-epoch", epoch, "-tag", "blobfs:0.1.0"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := build("1700000000"), build("1700000000")
	if !bytes.Equal(a, b) {
		t.Error("two builds from the same inputs differ")
	}
	if bytes.Equal(a, build("1700000001")) {
		t.Error("another epoch gave the same image: the times are not the epoch's")
	}
}

// TestImageBadInput: clear errors, nothing written.
func TestImageBadInput(t *testing.T) {
	bin, ca := writeInputs(t)
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	out := filepath.Join(t.TempDir(), "image.tar")
	for _, args := range [][]string{
		{"-binary", bin, "-ca-bundle", ca, "-o", out},                                      // no tag
		{"-binary", notELF, "-ca-bundle", ca, "-o", out, "-tag", "blobfs:1"},               // not a binary
		{"-binary", bin, "-ca-bundle", ca, "-o", out, "-tag", "Blobfs:UPPER CASE"},         // bad tag
		{"-binary", bin, "-ca-bundle", ca, "-o", out, "-tag", "blobfs:1", "-epoch", "now"}, // bad epoch
	} {
		if err := run(args); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("run(%q) wrote %s", args, out)
		}
	}
}
