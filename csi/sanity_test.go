package csi

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
)

// TestSanity runs the CSI conformance suite (csi-sanity, in-process)
// against the real driver: real blobfs mounts served by this process,
// containers in Azurite. Specs that do not apply are skipped by the suite
// itself; docs/testing.md lists them with the reason.
func TestSanity(t *testing.T) {
	if c := flag.Lookup("test.count"); c != nil && c.Value.String() != "1" {
		t.Skip("csi-sanity (Ginkgo) refuses go test -count > 1")
	}
	needFUSE(t)
	az := azuriteEnv(t)
	d := startDriver(t, driverOptions{})

	// The suite creates the last element of each path itself; kubelet's
	// layout above it is ours to make.
	targetParent := filepath.Join(d.kubelet, "pods/sanity-pod/volumes/kubernetes.io~csi")
	stagingParent := filepath.Join(d.kubelet, "plugins/kubernetes.io/csi/blob.csi.blobfs.io/sanity")
	for _, p := range []string{targetParent, stagingParent} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	secret := fmt.Sprintf("{%s: %s, %s: %q}", secretAccountName, az.account, secretAccountKey, az.key)
	secretsFile := filepath.Join(t.TempDir(), "secrets.yaml")
	var yaml string
	for _, k := range []string{"CreateVolumeSecret", "DeleteVolumeSecret", "ControllerValidateVolumeCapabilitiesSecret", "NodeStageVolumeSecret", "NodePublishVolumeSecret"} {
		yaml += k + ": " + secret + "\n"
	}
	if err := os.WriteFile(secretsFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg := sanity.NewTestConfig()
	cfg.Address = d.endpoint
	cfg.TargetPath = filepath.Join(targetParent, "pv")
	cfg.StagingPath = filepath.Join(stagingParent, "globalmount")
	cfg.SecretsFile = secretsFile
	cfg.TestVolumeParameters = az.params()
	cfg.IDGen = sanityIDs{az: az}
	sanity.Test(t, cfg)
}

// sanityIDs makes volume ids in blobfs's format for containers that do not
// exist, so that "not found" answers are tested, not "malformed".
type sanityIDs struct{ az azurite }

func (g sanityIDs) GenerateUniqueValidVolumeID() string {
	return volumeID{Account: g.az.account, Container: "sanity-missing-" + uuid.NewString()[:8], Endpoint: g.az.endpoint}.String()
}

func (g sanityIDs) GenerateInvalidVolumeID() string { return "fake-vol-id" }

func (g sanityIDs) GenerateUniqueValidNodeID() string { return "node-" + uuid.NewString()[:8] }

func (g sanityIDs) GenerateInvalidNodeID() string { return "fake-node-id" }
