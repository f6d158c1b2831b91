// Command blobfs-image writes the container image of the CSI driver (its
// controller and node plugin run the same image) as a docker-archive
// tarball, without a container daemon: `ctr images import` and
// `docker load` read it. `make image` runs it; deploy/Dockerfile builds the
// same image for those who have Docker.
//
// The image is one layer on nothing: the static blobfs binary, its
// mount(8) helper mount.blobfs, and the CA certificates for https
// endpoints. The driver mounts with system calls as root and needs no other
// program. The image is reproducible: every time in it is the commit's
// (-epoch, as SOURCE_DATE_EPOCH), owners are root, entries are in a fixed
// order, so the same binary gives the same digest.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// spec is what goes into the image.
type spec struct {
	binary   []byte   // the static blobfs binary
	caBundle []byte   // PEM certificates
	tags     []string // repository:tag, at least one
	version  string   // blobfs's version, as a label
	epoch    time.Time
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "blobfs-image:", err)
		os.Exit(1)
	}
}

type tagList []string

func (t *tagList) String() string     { return strings.Join(*t, ",") }
func (t *tagList) Set(s string) error { *t = append(*t, s); return nil }

func run(args []string) error {
	fl := flag.NewFlagSet("blobfs-image", flag.ContinueOnError)
	var (
		binary  = fl.String("binary", "", "the static blobfs binary (CGO_ENABLED=0)")
		ca      = fl.String("ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA certificates (PEM) for https endpoints")
		out     = fl.String("o", "", "the docker-archive tarball to write")
		version = fl.String("version", "", "blobfs's version, for the image's label")
		epoch   = fl.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "Unix time of every timestamp in the image (default $SOURCE_DATE_EPOCH, else 0)")
		tags    tagList
	)
	fl.Var(&tags, "tag", "repository:tag of the image (repeat for several)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *binary == "" || *out == "" || len(tags) == 0 {
		return errors.New("-binary, -o and at least one -tag are needed")
	}
	s := spec{tags: tags, version: *version}
	var err error
	if s.binary, err = os.ReadFile(*binary); err != nil {
		return err
	}
	if !bytes.HasPrefix(s.binary, []byte("\x7fELF")) {
		return fmt.Errorf("%s is not an ELF binary", *binary)
	}
	if s.caBundle, err = os.ReadFile(*ca); err != nil {
		return fmt.Errorf("CA certificates: %w", err)
	}
	secs := int64(0)
	if *epoch != "" {
		if secs, err = strconv.ParseInt(*epoch, 10, 64); err != nil {
			return fmt.Errorf("-epoch %q: not a Unix time", *epoch)
		}
	}
	s.epoch = time.Unix(secs, 0).UTC()
	img, err := build(s)
	if err != nil {
		return err
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range s.tags {
		ref, err := name.NewTag(t, name.WithDefaultRegistry(""))
		if err != nil {
			return fmt.Errorf("-tag %q: %w", t, err)
		}
		refs[ref] = img
	}
	tmp := *out + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, *out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s %s\n", *out, strings.Join(s.tags, " "), digest)
	return nil
}

// Where things go in the image.
const (
	binPath    = "usr/local/bin/blobfs"
	helperPath = "usr/local/bin/mount.blobfs"
	caPath     = "etc/ssl/certs/ca-certificates.crt"
)

// build makes the image.
func build(s spec) (v1.Image, error) {
	layerTar, err := layer(s)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: l, History: v1.History{
		Created: v1.Time{Time: s.epoch}, CreatedBy: "blobfs-image", Comment: "blobfs " + s.version,
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: s.epoch}
	cf.Config.Entrypoint = []string{"/" + binPath}
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=/" + caPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "blobfs",
		"org.opencontainers.image.version":  s.version,
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.created":  s.epoch.Format(time.RFC3339),
	}
	return mutate.ConfigFile(img, cf)
}

// layer is the image's one layer, an uncompressed tar.
func layer(s spec) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		typ  byte
		data []byte
		link string
	}{
		{name: "etc/", mode: 0o755, typ: tar.TypeDir},
		{name: "etc/ssl/", mode: 0o755, typ: tar.TypeDir},
		{name: "etc/ssl/certs/", mode: 0o755, typ: tar.TypeDir},
		{name: caPath, mode: 0o644, typ: tar.TypeReg, data: s.caBundle},
		{name: "tmp/", mode: 0o1777, typ: tar.TypeDir},
		{name: "usr/", mode: 0o755, typ: tar.TypeDir},
		{name: "usr/local/", mode: 0o755, typ: tar.TypeDir},
		{name: "usr/local/bin/", mode: 0o755, typ: tar.TypeDir},
		{name: binPath, mode: 0o755, typ: tar.TypeReg, data: s.binary},
		{name: helperPath, mode: 0o777, typ: tar.TypeSymlink, link: "blobfs"},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: e.typ, Linkname: e.link, Size: int64(len(e.data)),
			ModTime: s.epoch, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
