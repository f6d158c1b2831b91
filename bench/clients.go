package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// blobfsName names blobfs's side in comparisons.
const blobfsName = "blobfs"

// client is a FUSE client that mounts the Azurite container: blobfs, or
// another one found on PATH.
type client struct {
	name string
	// mount mounts the container at the empty directory dir; scratch is
	// a directory it may use for caches and configuration.
	mount func(ctx context.Context, dir, scratch string) (mount, error)
}

// blobfsClient runs `blobfs mount --foreground` over the container, as a
// user would, or serves fusefs in-process when cfg.InProcess is set.
func blobfsClient(cfg *Config, az *azureEnv) client {
	return blobfsVariant(cfg, az, blobfsName, nil)
}

// blobfsVariant is blobfsClient with extra mount flags, under its own name.
func blobfsVariant(cfg *Config, az *azureEnv, name string, extra []string) client {
	if cfg.InProcess {
		return client{name: name, mount: func(ctx context.Context, dir, scratch string) (mount, error) {
			store, err := blobstore.NewAzure(az.storeConfig())
			if err != nil {
				return nil, err
			}
			return mountInProcess(dir, scratch, blobstore.NewRetrying(store, blobstore.RetryPolicy{}), fusefs.Options{})
		}}
	}
	return client{name: name, mount: func(ctx context.Context, dir, scratch string) (mount, error) {
		argv := []string{cfg.BlobfsBin, "mount", "--foreground",
			"--container", az.container,
			"--endpoint", az.endpoint,
			"--auth-type", "key",
			"--cache-dir", scratch,
			"--log-level", "warn",
		}
		argv = append(argv, cfg.BlobfsArgs...)
		argv = append(argv, extra...)
		argv = append(argv, dir)
		env := []string{"AZURE_STORAGE_ACCOUNT=" + az.account, "AZURE_STORAGE_KEY=" + az.key}
		return startProc(ctx, dir, argv, env, []string{cfg.BlobfsBin, "unmount", dir})
	}}
}

// otherClientNames are the FUSE clients measured beside blobfs when
// installed, in table order.
var otherClientNames = []string{"blobfuse2", "rclone"}

// otherClients reports which other FUSE clients are on PATH and returns
// those that are.
func otherClients(az *azureEnv) ([]ClientStatus, []client) {
	var status []ClientStatus
	var found []client
	for _, name := range otherClientNames {
		path, err := exec.LookPath(name)
		if err != nil {
			status = append(status, ClientStatus{Name: name})
			continue
		}
		status = append(status, ClientStatus{Name: name, Path: path})
		switch name {
		case "blobfuse2":
			found = append(found, blobfuse2Client(path, az))
		case "rclone":
			found = append(found, rcloneClient(path, az))
		}
	}
	return status, found
}

// blobfuse2Client mounts with blobfuse2's block cache (its streaming
// mode for large files), caches timing out after 1 s as blobfs's do.
func blobfuse2Client(bin string, az *azureEnv) client {
	return client{name: "blobfuse2", mount: func(ctx context.Context, dir, scratch string) (mount, error) {
		conf := fmt.Sprintf(`logging:
  type: silent
components:
  - libfuse
  - block_cache
  - attr_cache
  - azstorage
libfuse:
  attribute-expiration-sec: 1
  entry-expiration-sec: 1
  negative-entry-expiration-sec: 1
block_cache:
  block-size-mb: 8
  mem-size-mb: 1024
  path: %s
attr_cache:
  timeout-sec: 1
azstorage:
  type: block
  mode: key
  account-name: %s
  endpoint: %s
  container: %s
  use-http: true
`, filepath.Join(scratch, "blocks"), az.account, az.endpoint, az.container)
		path := filepath.Join(scratch, "blobfuse2.yaml")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Join(scratch, "blocks"), 0o700); err != nil {
			return nil, err
		}
		// The key goes through the environment, not the file.
		env := []string{"AZURE_STORAGE_ACCESS_KEY=" + az.key}
		argv := []string{bin, "mount", dir, "--config-file=" + path, "--foreground=true"}
		return startProc(ctx, dir, argv, env, []string{bin, "unmount", dir})
	}}
}

// rcloneClient mounts with `rclone mount` on an on-the-fly azureblob
// remote configured through the environment, --vfs-cache-mode off
// (streaming both ways; close returns when the upload is done), caches
// timing out after 1 s as blobfs's do.
func rcloneClient(bin string, az *azureEnv) client {
	return client{name: "rclone", mount: func(ctx context.Context, dir, scratch string) (mount, error) {
		env := []string{
			"RCLONE_AZUREBLOB_ACCOUNT=" + az.account,
			"RCLONE_AZUREBLOB_KEY=" + az.key,
			"RCLONE_AZUREBLOB_ENDPOINT=" + az.endpoint,
			"RCLONE_CONFIG=" + filepath.Join(scratch, "rclone.conf"),
		}
		argv := []string{bin, "mount", ":azureblob:" + az.container, dir,
			"--vfs-cache-mode", "off",
			"--dir-cache-time", "1s",
			"--attr-timeout", "1s",
			"--cache-dir", scratch,
		}
		return startProc(ctx, dir, argv, env, nil)
	}}
}
