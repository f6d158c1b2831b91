package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/blobfs/blobfs/blobstore"
)

// blobfs on the cluster, installed as docs/kubernetes.md tells users to: the
// image imported into containerd, then `kubectl apply -k` of deploy/
// through the e2e overlay (deploy/e2e/overlay), which swaps only what
// these machines cannot have (install_test.go). The tests add a Secret
// with Azurite's account and StorageClasses.

const (
	driverName = "blob.csi.blobfs.io"
	// secretName holds Azurite's account; in kube-system for the
	// StorageClasses and static PVs, in default for inline volumes (which
	// may only use their pod's namespace).
	secretName = "azure-storage"
	// Storage classes: containers deleted with their volume, or kept.
	classDelete = "blobfs"
	classRetain = "blobfs-retain"
)

func (c *cluster) setUpBlobfs(ctx context.Context) error {
	if err := c.startAzurite(); err != nil {
		return err
	}
	secretData := map[string]string{"azurestorageaccountname": blobstore.AzuriteAccount, "azurestorageaccountkey": blobstore.AzuriteAccountKey}
	for _, ns := range []string{"kube-system", "default"} {
		if err := c.apply(&corev1.Secret{TypeMeta: typeMeta("v1", "Secret"), ObjectMeta: objectMeta(secretName, ns), StringData: secretData}); err != nil {
			return err
		}
	}
	immediate := storagev1.VolumeBindingImmediate
	for _, sc := range []struct {
		name   string
		retain bool
	}{{classDelete, false}, {classRetain, true}} {
		params := map[string]string{
			"storageAccount": blobstore.AzuriteAccount,
			"server":         c.azuriteURL,
			// The controller gets the key from the provisioner (as with
			// the real sidecar); the node reads the Secret itself, so
			// that it can mount again after a restart.
			"csi.storage.k8s.io/provisioner-secret-name":      secretName,
			"csi.storage.k8s.io/provisioner-secret-namespace": "kube-system",
			"secretName":      secretName,
			"secretNamespace": "kube-system",
		}
		if sc.retain {
			params["retainContainer"] = "true"
		}
		if err := c.apply(&storagev1.StorageClass{
			TypeMeta: typeMeta("storage.k8s.io/v1", "StorageClass"), ObjectMeta: objectMeta(sc.name, ""),
			Provisioner: driverName, Parameters: params, VolumeBindingMode: &immediate,
		}); err != nil {
			return err
		}
	}
	return c.install(ctx)
}

// waitDriverRegistered waits until kubelet lists the driver in its CSINode.
func (c *cluster) waitDriverRegistered(ctx context.Context, timeout time.Duration) error {
	return waitUntil(ctx, "kubelet registered "+driverName, timeout, func() (bool, error) {
		var n storagev1.CSINode
		if err := c.getJSON(&n, "get", "csinode", c.node); err != nil {
			return false, nil
		}
		for _, d := range n.Spec.Drivers {
			if d.Name == driverName {
				return true, nil
			}
		}
		return false, nil
	})
}

func (c *cluster) startAzurite() error {
	script := filepath.Join(repoRoot(), ".ci", "azurite.sh")
	// On every address: the host's tests use 127.0.0.1, the pods the
	// bridge's address.
	env := append(os.Environ(), "AZURITE_PORT="+strconv.Itoa(c.azuritePort), "AZURITE_HOST=0.0.0.0",
		"AZURITE_RUN_DIR="+filepath.Join(c.runDir, "azurite"))
	for _, verb := range []string{"install", "start"} {
		cmd := exec.Command("bash", script, verb)
		cmd.Env = env
		// Its own session: the pid file names a process that outlives
		// this command.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("azurite.sh %s: %v\n%s", verb, err, out)
		}
	}
	return nil
}

// blobClient talks to the test's Azurite through the SDK: the store's
// view, independent of blobfs.
func (c *cluster) blobClient() (*azblob.Client, error) {
	cred, err := azblob.NewSharedKeyCredential(blobstore.AzuriteAccount, blobstore.AzuriteAccountKey)
	if err != nil {
		return nil, err
	}
	return azblob.NewClientWithSharedKeyCredential(c.azuriteURL+"/", cred, nil)
}

func (c *cluster) containerExists(ctx context.Context, name string) (bool, error) {
	cl, err := c.blobClient()
	if err != nil {
		return false, err
	}
	pager := cl.NewListContainersPager(&azblob.ListContainersOptions{Prefix: to.Ptr(name)})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return false, err
		}
		for _, ct := range page.ContainerItems {
			if ct.Name != nil && *ct.Name == name {
				return true, nil
			}
		}
	}
	return false, nil
}

func (c *cluster) readBlob(ctx context.Context, container, name string) ([]byte, error) {
	cl, err := c.blobClient()
	if err != nil {
		return nil, err
	}
	resp, err := cl.DownloadStream(ctx, container, name, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func (c *cluster) putBlob(ctx context.Context, container, name string, data []byte) error {
	cl, err := c.blobClient()
	if err != nil {
		return err
	}
	if _, err := cl.CreateContainer(ctx, container, nil); err != nil && !strings.Contains(err.Error(), "ContainerAlreadyExists") {
		return err
	}
	_, err = cl.UploadBuffer(ctx, container, name, data, nil)
	return err
}

func (c *cluster) deleteContainer(ctx context.Context, name string) {
	if cl, err := c.blobClient(); err == nil {
		cl.DeleteContainer(ctx, name, nil)
	}
}

// blobMetadata returns a blob's metadata with lower-case keys (the service
// may report them capitalised).
func (c *cluster) blobMetadata(ctx context.Context, container, name string) (map[string]string, error) {
	cl, err := c.blobClient()
	if err != nil {
		return nil, err
	}
	props, err := cl.ServiceClient().NewContainerClient(container).NewBlobClient(name).GetProperties(ctx, nil)
	if err != nil {
		return nil, err
	}
	md := map[string]string{}
	for k, v := range props.Metadata {
		if v != nil {
			md[strings.ToLower(k)] = *v
		}
	}
	return md, nil
}
