package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs/cache"
)

// Defaults of Config.
const (
	DefaultDriverName = "blob.csi.blobfs.io"
	DefaultKubeletDir = "/var/lib/kubelet"
	DefaultCacheDir   = "/var/lib/blobfs/csi-cache"
	// DefaultDiskCacheDir is where `blobfs csi --disk-cache-mb` keeps
	// the node's disk cache by default.
	DefaultDiskCacheDir = "/var/lib/blobfs/disk-cache"
	defaultHealthEvery  = 30 * time.Second
	// maxLookupBackoff bounds the wait between two API lookups of an
	// unhealthy volume's credentials (apiBackoff).
	maxLookupBackoff = 10 * time.Minute
)

// Config is everything the driver is told; cmd turns flags into one. New
// validates it.
type Config struct {
	// DriverName is the CSI driver name, DNS style. Default
	// blob.csi.blobfs.io.
	DriverName string
	// Version is reported by GetPluginInfo.
	Version string
	// Endpoint is the gRPC socket: unix:///path/to/csi.sock.
	Endpoint string
	// Controller and Node select the services served (Identity always).
	Controller, Node bool
	// NodeID is this node's name (the Kubernetes node name); needed with
	// Node.
	NodeID string
	// KubeletDir is kubelet's root directory; staging and target paths
	// outside it are refused. Default /var/lib/kubelet.
	KubeletDir string
	// StateDir holds the node state. Default
	// KUBELET_DIR/plugins/DRIVER_NAME/state.
	StateDir string
	// CacheDir holds the spill files of every mount, one subdirectory per
	// volume. Default /var/lib/blobfs/csi-cache.
	CacheDir string
	// DiskCache, when set, is the disk cache of every volume of the node
	// (cache.DiskCache): reads are kept on the node's disk, and files held
	// whole are opened with FUSE passthrough on read-only volumes. Only
	// with the default (in-process) Mounter.
	DiskCache *cache.DiskCache
	// MetricsAddress, when set, serves Prometheus metrics at
	// http://ADDRESS/metrics.
	MetricsAddress string
	// HealthInterval is how often the node checks its mounts and repairs
	// dead ones. Default 30s; negative turns the check off.
	HealthInterval time.Duration
	// KeeperSocket, when set, is the socket of a `blobfs keeper` that
	// holds the node's mounts across restarts of the driver: they are
	// handed to it as they are made and adopted back at start-up. Only
	// with the default (in-process) Mounter.
	KeeperSocket string
	// AdoptTimeout bounds the adoption of the keeper's mounts at start-up
	// (the keeper must answer, and a running driver release them).
	// Default 3 minutes.
	AdoptTimeout time.Duration

	// Mounter puts volumes in place. Default: blobfs in this process.
	Mounter Mounter
	// Containers creates, deletes and checks containers. Default: Azure.
	Containers Containers
	// Secrets reads Secrets named by secretName/secretNamespace. Default:
	// the API server of the cluster this pod runs in, if any.
	Secrets SecretGetter
	// KeyVault reads the Key Vault secrets volumes name (keyVaultURL).
	// Default: Azure Key Vault with the driver's Azure AD identity.
	KeyVault KeyVault
	// State is the node state. Default: files in StateDir.
	State NodeState
	// Metrics receives the driver's metrics. Default: a new set.
	Metrics *Metrics
	// Logger receives the driver's log; New wraps its handler in
	// blobstore's redaction. Default: slog.Default().
	Logger *slog.Logger
}

// Containers is what the controller needs of the blob service.
type Containers interface {
	// Create creates cfg's container; an existing one is success.
	Create(ctx context.Context, cfg blobstore.AzureConfig) error
	// Delete deletes cfg's container and its blobs; a missing one is
	// success.
	Delete(ctx context.Context, cfg blobstore.AzureConfig) error
	// Check verifies that the container exists and the credentials can
	// read it; errors wrap blobstore's sentinels.
	Check(ctx context.Context, cfg blobstore.AzureConfig) error
}

type azureContainers struct{}

func (azureContainers) Create(ctx context.Context, cfg blobstore.AzureConfig) error {
	return blobstore.CreateContainer(ctx, cfg, map[string]string{"createdby": "blobfs-csi"})
}

func (azureContainers) Delete(ctx context.Context, cfg blobstore.AzureConfig) error {
	return blobstore.DeleteContainer(ctx, cfg)
}

func (azureContainers) Check(ctx context.Context, cfg blobstore.AzureConfig) error {
	az, err := blobstore.NewAzure(cfg)
	if err != nil {
		return err
	}
	return az.Check(ctx)
}

// Driver serves the CSI Identity, Controller and Node services.
type Driver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer
	csipb.UnimplementedNodeServer

	cfg        Config
	log        *slog.Logger
	kubeletDir string
	mounter    Mounter
	containers Containers
	secrets    SecretGetter
	keyVault   KeyVault
	state      NodeState
	metrics    *Metrics
	locks      *volumeLocks
	socketPath string

	// ready is set once start-up recovery has finished (Probe).
	ready atomic.Bool

	// credsMu guards creds: the credentials each staged volume was
	// mounted with, in memory only, for repairs while this process lives.
	credsMu sync.Mutex
	creds   map[string]credentials
	// lookups spaces out the API lookups of an unhealthy volume's
	// credentials (apibackoff.go).
	lookups *apiBackoff
	// unhealthy counts volumes whose last check found a dead mount.
	unhealthyMu sync.Mutex
	unhealthy   map[string]string // volume id -> reason
	// repairReported: the repair failure last logged, per volume
	// (reportRepairFailure); guarded by unhealthyMu.
	repairReported map[string]string
}

var driverNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// New validates cfg and builds a driver; Run serves it.
func New(cfg Config) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if !driverNameRE.MatchString(cfg.DriverName) || !strings.Contains(cfg.DriverName, ".") {
		return nil, fmt.Errorf("driver name %q: use a DNS-style name of at most 63 lowercase characters, like %s", cfg.DriverName, DefaultDriverName)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if !cfg.Controller && !cfg.Node {
		return nil, errors.New("serve the controller, the node service or both")
	}
	sock, err := parseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg.KubeletDir == "" {
		cfg.KubeletDir = DefaultKubeletDir
	}
	if !filepath.IsAbs(cfg.KubeletDir) {
		return nil, fmt.Errorf("kubelet directory %q is not an absolute path", cfg.KubeletDir)
	}
	cfg.KubeletDir = filepath.Clean(cfg.KubeletDir)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// Requests carry credentials outside their secrets fields (volume
	// attributes, parameters, mount flags): every line the driver and its
	// mounts log is redacted here, whatever handler the caller gave.
	cfg.Logger = slog.New(blobstore.NewRedactingHandler(cfg.Logger.Handler()))
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.HealthInterval == 0 {
		cfg.HealthInterval = defaultHealthEvery
	}
	if cfg.Containers == nil {
		cfg.Containers = azureContainers{}
	}
	if cfg.Secrets == nil {
		s, err := InClusterSecrets()
		if err != nil {
			return nil, err
		}
		if s != nil {
			cfg.Secrets = s
		}
	}
	if cfg.KeyVault == nil {
		cfg.KeyVault = newAzureKeyVault()
	}
	d := &Driver{
		cfg:            cfg,
		log:            cfg.Logger,
		kubeletDir:     cfg.KubeletDir,
		containers:     cfg.Containers,
		secrets:        cfg.Secrets,
		keyVault:       cfg.KeyVault,
		metrics:        cfg.Metrics,
		locks:          newVolumeLocks(),
		socketPath:     sock,
		creds:          map[string]credentials{},
		lookups:        newAPIBackoff(cfg.HealthInterval, maxLookupBackoff),
		unhealthy:      map[string]string{},
		repairReported: map[string]string{},
	}
	if cfg.Node {
		if cfg.NodeID == "" {
			return nil, errors.New("the node service needs a node id (the Kubernetes node name)")
		}
		if cfg.CacheDir == "" {
			cfg.CacheDir = DefaultCacheDir
		}
		if !filepath.IsAbs(cfg.CacheDir) {
			return nil, fmt.Errorf("cache directory %q is not an absolute path", cfg.CacheDir)
		}
		if cfg.StateDir == "" {
			cfg.StateDir = filepath.Join(cfg.KubeletDir, "plugins", cfg.DriverName, "state")
		}
		if cfg.State == nil {
			st, bad, err := OpenFileState(cfg.StateDir)
			if err != nil {
				return nil, err
			}
			for _, e := range bad {
				d.log.Error("skipping unreadable node state record", "err", e)
			}
			cfg.State = st
		}
		if cfg.Mounter == nil {
			bm := NewBlobfsMounter(cfg.Logger, cfg.Metrics)
			bm.diskCache = cfg.DiskCache
			if cfg.KeeperSocket != "" {
				if !filepath.IsAbs(cfg.KeeperSocket) {
					return nil, fmt.Errorf("keeper socket %q is not an absolute path", cfg.KeeperSocket)
				}
				bm.UseKeeper(cfg.KeeperSocket)
			}
			cfg.Mounter = bm
		} else if cfg.KeeperSocket != "" {
			return nil, errors.New("a keeper socket works only with the in-process mounter")
		}
		if cfg.AdoptTimeout <= 0 {
			cfg.AdoptTimeout = 3 * time.Minute
		}
		d.state, d.mounter = cfg.State, cfg.Mounter
		d.metrics.setMountsFunc(d.mountCounts)
	}
	d.cfg = cfg
	return d, nil
}

// parseEndpoint accepts unix:///abs/path (and unix:/abs/path).
func parseEndpoint(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "unix://")
	if !ok {
		rest, ok = strings.CutPrefix(ep, "unix:")
	}
	if !ok || !filepath.IsAbs(rest) {
		return "", fmt.Errorf("endpoint %q: expected unix:///path/to/csi.sock", ep)
	}
	return filepath.Clean(rest), nil
}

// Run listens on the endpoint, recovers the node's volumes, serves until
// ctx ends, then stops gracefully and uploads the mounts' dirty data.
func (d *Driver) Run(ctx context.Context) error {
	// Take the live mounts back from the keeper before anything else: no
	// request of kubelet's may find a volume half adopted.
	if d.cfg.Node {
		d.adoptMounts(ctx)
	}
	if err := os.MkdirAll(filepath.Dir(d.socketPath), 0o750); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	// A socket left by an earlier process (or the pod being replaced):
	// take the name over; kubelet connects to whoever listens now.
	lis, name, err := listenTakeover(d.socketPath)
	if err != nil {
		return err
	}
	// During a rolling update with surge, the new pod takes the name
	// over while this one still runs.
	defer name.removeIfOurs()
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(d.logAndMeasure, d.recoverPanics))
	csipb.RegisterIdentityServer(srv, d)
	if d.cfg.Controller {
		csipb.RegisterControllerServer(srv, d)
	}
	if d.cfg.Node {
		csipb.RegisterNodeServer(srv, d)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()

	var metricsSrv *http.Server
	if d.cfg.MetricsAddress != "" {
		ml, err := net.Listen("tcp", d.cfg.MetricsAddress)
		if err != nil {
			srv.Stop()
			return fmt.Errorf("metrics address: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.Registry, promhttp.HandlerOpts{}))
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go metricsSrv.Serve(ml)
	}
	d.log.Info("CSI driver serving", "driver", d.cfg.DriverName, "version", d.cfg.Version, "endpoint", d.cfg.Endpoint,
		"controller", d.cfg.Controller, "node", d.cfg.Node, "node_id", d.cfg.NodeID, "metrics", d.cfg.MetricsAddress)

	if d.cfg.Node {
		d.recover(ctx)
	}
	d.ready.Store(true)
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		if d.cfg.Node && d.cfg.HealthInterval > 0 {
			d.healthLoop(ctx)
		}
	}()

	var err2 error
	select {
	case <-ctx.Done():
	case err2 = <-serveErr:
	}
	d.ready.Store(false)
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	<-healthDone
	if metricsSrv != nil {
		metricsSrv.Close()
	}
	if s, ok := d.mounter.(interface{ Shutdown(context.Context) error }); ok {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := s.Shutdown(sctx); err != nil {
			d.log.Error("upload of dirty data at shutdown failed; data kept in the cache directory", "err", err)
		}
		cancel()
	}
	return err2
}

// --- interceptors ------------------------------------------------------

// quietMethods are polled by kubelet and the sidecars; they log at debug.
var quietMethods = map[string]bool{
	"Probe": true, "NodeGetVolumeStats": true, "NodeGetCapabilities": true,
	"GetPluginInfo": true, "GetPluginCapabilities": true, "ControllerGetCapabilities": true,
}

// logAndMeasure logs each call with its secrets stripped and records its
// metrics. protosanitizer strips only the secrets fields; the credentials
// that volume_context, parameters, publish_context or mount flags may hold
// (blob-csi-driver takes keys and SAS tokens there) are redacted by the
// driver's logger (New).
func (d *Driver) logAndMeasure(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	level := slog.LevelInfo
	if quietMethods[method] {
		level = slog.LevelDebug
	}
	start := time.Now()
	d.log.Log(ctx, level, "CSI request", "method", method, "request", protosanitizer.StripSecrets(req).String())
	resp, err := handler(ctx, req)
	// The status message reaches kubelet, which turns it into an event
	// that anyone who may describe the pod reads.
	err = redactStatus(err)
	dur := time.Since(start)
	d.metrics.observeCSI(method, err, dur)
	if err != nil {
		d.log.Log(ctx, max(level, slog.LevelWarn), "CSI request failed", "method", method, "code", status.Code(err).String(), "err", status.Convert(err).Message(), "duration", dur.Round(time.Millisecond))
	} else {
		d.log.Log(ctx, level, "CSI request done", "method", method, "duration", dur.Round(time.Millisecond))
	}
	return resp, err
}

// recoverPanics turns a panic in a handler into Internal: one bad request
// must not take the node's mounts down with the process.
func (d *Driver) recoverPanics(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("panic in CSI handler", "method", info.FullMethod, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	return handler(ctx, req)
}

// --- Identity ----------------------------------------------------------

func (d *Driver) GetPluginInfo(ctx context.Context, req *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: d.cfg.DriverName, VendorVersion: d.cfg.Version}, nil
}

func (d *Driver) GetPluginCapabilities(ctx context.Context, req *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	resp := &csipb.GetPluginCapabilitiesResponse{}
	if d.cfg.Controller {
		resp.Capabilities = append(resp.Capabilities, &csipb.PluginCapability{
			Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{
				Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE,
			}},
		})
	}
	return resp, nil
}

// Probe is ready once start-up recovery has finished.
func (d *Driver) Probe(ctx context.Context, req *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(d.ready.Load())}, nil
}
