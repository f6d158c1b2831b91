package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/csi"
	"github.com/blobfs/blobfs/fusefs/listing"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// csiFlags are the flags of `blobfs csi`; keep the table in
// docs/reference.md in step (docs_test.go checks).
type csiFlags struct {
	cfg        csi.Config
	mode       string
	log        logFlags
	kubeconfig string
	// restartInPlace: supervise the driver as a child (csirestart.go).
	restartInPlace bool
	// listCacheMB is the budget of every volume's listing cache together.
	listCacheMB int64
	// disk is the node's disk cache (0 MiB: none).
	disk diskCacheFlags
	// memoryMB is the read caches' and upload buffers' budget over every
	// volume (0: none).
	memoryMB int64
}

func registerCSIFlags(fl *pflag.FlagSet, f *csiFlags) {
	endpoint := os.Getenv("CSI_ENDPOINT")
	if endpoint == "" {
		endpoint = "unix:///csi/csi.sock"
	}
	nodeID := os.Getenv("KUBE_NODE_NAME")
	if nodeID == "" {
		nodeID, _ = os.Hostname()
	}
	fl.StringVar(&f.cfg.Endpoint, "endpoint", endpoint, "CSI gRPC endpoint, unix:///path/to/csi.sock (env CSI_ENDPOINT)")
	fl.StringVar(&f.cfg.DriverName, "driver-name", csi.DefaultDriverName, "CSI driver name (DNS style)")
	fl.StringVar(&f.mode, "mode", "all", "services to serve: controller, node or all")
	fl.StringVar(&f.cfg.NodeID, "node-id", nodeID, "this node's name (env KUBE_NODE_NAME, else the host name)")
	fl.StringVar(&f.cfg.KubeletDir, "kubelet-dir", csi.DefaultKubeletDir, "kubelet's root directory; staging and target paths must be inside it")
	fl.StringVar(&f.cfg.StateDir, "state-dir", "", "node state directory (default KUBELET_DIR/plugins/DRIVER_NAME/state)")
	fl.StringVar(&f.cfg.CacheDir, "cache-dir", csi.DefaultCacheDir, "spill files of files being written, one subdirectory per volume; on the node's disk")
	fl.StringVar(&f.cfg.MetricsAddress, "metrics-address", "", "serve Prometheus metrics at http://ADDRESS/metrics, e.g. :9809 (default: off)")
	fl.StringVar(&f.cfg.KeeperSocket, "keeper-socket", "", "socket of a blobfs keeper that holds the mounts across restarts of this driver (default: none; mounts die with the driver and are mounted again at start-up)")
	fl.Int64Var(&f.listCacheMB, "list-cache-mb", listing.DefaultListCacheBytes>>20, "memory for cached directory listings of every volume of the node together, MiB (about 200 bytes a name); the oldest are dropped first")
	fl.Int64Var(&f.memoryMB, "memory-mb", 2048, "memory for the read block caches (three quarters) and upload buffers (a quarter) of every volume of the node together, MiB; each volume also keeps its own block-cache-mb; 0: no bound over the volumes")
	fl.Int64Var(&f.disk.mb, "disk-cache-mb", 0, "disk space for content read from every volume of the node, MiB (0: no disk cache); files held whole are read by the kernel itself (FUSE passthrough) on read-only volumes")
	fl.StringVar(&f.disk.dir, "disk-cache-dir", csi.DefaultDiskCacheDir, "directory of the disk cache, on the node's disk; emptied at start")
	fl.DurationVar(&f.cfg.HealthInterval, "health-interval", 30*time.Second, "how often the node checks its mounts and repairs dead ones (0 disables)")
	f.log.register(fl)
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "read Secrets (secretName) through this kubeconfig instead of the pod's service account: for a driver run outside a pod")
	fl.BoolVar(&f.restartInPlace, "restart-in-place", false, "run the driver as a child process and start it again at once when it crashes or is OOM-killed (up to 5 times in 10 minutes), instead of waiting for kubelet's restart back-off")
}

// runCSI is `blobfs csi`, its flags parsed into f.
func runCSI(f csiFlags) error {
	switch f.mode {
	case "all":
		f.cfg.Controller, f.cfg.Node = true, true
	case "controller":
		f.cfg.Controller = true
	case "node":
		f.cfg.Node = true
	default:
		return usageError{fmt.Errorf("--mode %q: use controller, node or all", f.mode)}
	}
	if f.listCacheMB < 1 || f.listCacheMB > 1<<20 {
		return usageError{fmt.Errorf("--list-cache-mb %d: must be between 1 and 1048576 (MiB)", f.listCacheMB)}
	}
	listing.SetListCacheBytes(f.listCacheMB << 20)
	if err := f.disk.check(); err != nil {
		return usageError{err}
	}
	if f.memoryMB != 0 && (f.memoryMB < 64 || f.memoryMB > 1<<30) {
		return usageError{fmt.Errorf("--memory-mb %d: must be 0 (no bound) or between 64 and 1073741824 (MiB)", f.memoryMB)}
	}
	memory.SetBudget(f.memoryMB << 20)
	if f.cfg.HealthInterval == 0 {
		f.cfg.HealthInterval = -1 // the flag's 0 disables; Config's 0 means default
	}
	logger, _, err := newLogger(f.log, os.Stderr)
	if err != nil {
		return err
	}
	if f.restartInPlace && os.Getenv(envCSIChild) == "" {
		return superviseCSI(logger)
	}
	f.cfg.Version = version
	f.cfg.Logger = logger
	if f.cfg.DiskCache, err = f.disk.open(logger); err != nil {
		return err
	}
	if f.cfg.DiskCache != nil {
		defer f.cfg.DiskCache.Close()
	}
	f.cfg.Metrics = csi.NewMetrics()
	f.cfg.Metrics.CountDriverRestarts(restartsBefore())
	if f.kubeconfig != "" {
		if f.cfg.Secrets, err = csi.KubeconfigSecrets(f.kubeconfig); err != nil {
			return err
		}
	}
	d, err := csi.New(f.cfg)
	if err != nil {
		return err
	}
	ctx, stop := signalContext(f.cfg.Logger, "stopping the CSI driver: in-flight calls finish, dirty files are uploaded, mounts stay with the keeper if one runs")
	defer stop()
	return d.Run(ctx)
}
