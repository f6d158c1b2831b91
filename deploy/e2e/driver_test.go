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

// blobfs on the cluster, run on the host as the manifests run it in pods:
// the node plugin (deploy/node.yaml's blobfs container, with the
// registrar beside it), the controller (deploy/controller.yaml, with the
// test's provisioner in place of the external-provisioner sidecar), the
// CSIDriver and RBAC objects from deploy/, a Secret with Azurite's
// account, and StorageClasses.

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

func (c *cluster) driverSocket() string {
	return filepath.Join(c.kubeletDir, "plugins", driverName, "csi.sock")
}
func (c *cluster) keeperSocket() string {
	return filepath.Join(c.kubeletDir, "plugins", driverName, "keeper.sock")
}
func (c *cluster) controllerSocket() string { return c.path("controller", "csi.sock") }

// haveKeeper says whether the blobfs under test has restart support (the
// keeper that holds FUSE connections while the driver is away).
func (c *cluster) haveKeeper() bool {
	return exec.Command(c.blobfs, "keeper", "--help").Run() == nil
}

func (c *cluster) setUpBlobfs(ctx context.Context) error {
	if err := c.startAzurite(); err != nil {
		return err
	}
	for _, f := range []string{"rbac.yaml", "csi-driver.yaml"} {
		if out, err := c.kubectl("apply", "-f", filepath.Join(repoRoot(), "deploy", f)); err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
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
	if c.haveKeeper() {
		if err := c.startKeeper(); err != nil {
			return err
		}
	} else {
		logf("the blobfs under test has no keeper (blobfs keeper --help fails): the scenarios that need restart support are skipped")
	}
	if err := c.startNodePlugin("node-plugin"); err != nil {
		return err
	}
	if _, err := c.procs.start("registrar", nil, c.blobfs, "registrar", "--csi-address="+c.driverSocket(),
		"--kubelet-registration-path="+c.driverSocket(), "--registration-dir="+filepath.Join(c.kubeletDir, "plugins_registry")); err != nil {
		return err
	}
	if _, err := c.procs.start("controller-plugin", nil, c.blobfs, "csi", "--mode=controller",
		"--endpoint=unix://"+c.controllerSocket(), "--kubeconfig="+c.path("etc/blobfs-csi-controller.kubeconfig")); err != nil {
		return err
	}
	if err := c.waitDriverRegistered(ctx, 120*time.Second); err != nil {
		return err
	}
	return startProvisioner(ctx, c)
}

// startNodePlugin starts a node plugin process under the given name (a
// second one for the rolling upgrade).
func (c *cluster) startNodePlugin(name string) error {
	args := []string{"csi", "--mode=node", "--endpoint=unix://" + c.driverSocket(), "--node-id=" + c.node,
		"--kubelet-dir=" + c.kubeletDir, "--cache-dir=" + c.path("blobfs-cache"),
		"--kubeconfig=" + c.path("etc/blobfs-csi-node.kubeconfig"), "--health-interval=10s"}
	if c.haveKeeper() {
		args = append(args, "--keeper-socket="+c.keeperSocket())
	}
	_, err := c.procs.start(name, nil, c.blobfs, args...)
	return err
}

func (c *cluster) startKeeper() error {
	_, err := c.procs.start("keeper", nil, c.blobfs, "keeper", "--socket="+c.keeperSocket())
	return err
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
	env := append(os.Environ(), "AZURITE_PORT="+strconv.Itoa(c.azuritePort), "AZURITE_RUN_DIR="+filepath.Join(c.runDir, "azurite"))
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
