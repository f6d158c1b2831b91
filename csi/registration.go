package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registration with kubelet (what node-driver-registrar does).
//
// kubelet watches its plugins_registry directory. When a socket appears
// there it calls GetInfo on it, learns the driver's name and the path of
// the driver's CSI socket, calls NodeGetInfo on the driver and tells the
// registration socket how that went (NotifyRegistrationStatus).
//
// The hazard is kubelet's retry policy: registration attempts are keyed by
// the registration socket's path and back off exponentially (0.5 s
// doubling to about 2 minutes). When kubelet restarts while the driver is
// down, it finds the old registration socket, fails to reach the driver,
// and keeps retrying with a growing delay; once the driver is back, the
// node can wait minutes before kubelet tries again, and pods stay in
// ContainerCreating meanwhile. So the Registrar offers registration only
// while the driver answers: when kubelet reports a failed registration it
// withdraws its socket (kubelet stops retrying), waits until the driver is
// ready again and then creates the socket anew, which kubelet sees as a new
// plugin and registers at once. A socket that disappears (someone cleaned
// the directory) is created again the same way.

// RegistrarConfig is what the registrar is told; cmd turns flags into one.
type RegistrarConfig struct {
	// DriverAddress is the driver's CSI socket as this process sees it:
	// unix:///csi/csi.sock or a plain path.
	DriverAddress string
	// KubeletDriverPath is the same socket as kubelet sees it (the host
	// path), handed to kubelet in GetInfo. Default: DriverAddress's path.
	KubeletDriverPath string
	// RegistrationDir is kubelet's plugins_registry directory (as this
	// process sees it).
	RegistrationDir string
	// CheckInterval is how often the registrar checks the driver and its
	// own socket. Default 1s.
	CheckInterval time.Duration
	Logger        *slog.Logger
}

// Registrar serves kubelet's plugin registration API for one driver.
type Registrar struct {
	cfg        RegistrarConfig
	driverSock string
	log        *slog.Logger

	// failed receives kubelet's report of a failed registration.
	failed chan string

	// mu guards registered.
	mu         sync.Mutex
	registered bool
}

// NewRegistrar validates cfg.
func NewRegistrar(cfg RegistrarConfig) (*Registrar, error) {
	sock := cfg.DriverAddress
	if sock == "" {
		return nil, errors.New("registrar: the driver's CSI address is missing")
	}
	if !filepath.IsAbs(sock) {
		var err error
		if sock, err = parseEndpoint(sock); err != nil {
			return nil, fmt.Errorf("registrar: %w", err)
		}
	}
	if cfg.KubeletDriverPath == "" {
		cfg.KubeletDriverPath = sock
	}
	if !filepath.IsAbs(cfg.KubeletDriverPath) {
		return nil, fmt.Errorf("registrar: kubelet registration path %q is not an absolute path", cfg.KubeletDriverPath)
	}
	if cfg.RegistrationDir == "" || !filepath.IsAbs(cfg.RegistrationDir) {
		return nil, fmt.Errorf("registrar: registration directory %q is not an absolute path", cfg.RegistrationDir)
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Registrar{cfg: cfg, driverSock: filepath.Clean(sock), log: cfg.Logger, failed: make(chan string, 1)}, nil
}

// Registered says whether kubelet's last word was a successful registration.
func (r *Registrar) Registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

func (r *Registrar) setRegistered(ok bool) {
	r.mu.Lock()
	r.registered = ok
	r.mu.Unlock()
}

// Run offers registration until ctx ends, then removes its socket.
func (r *Registrar) Run(ctx context.Context) error {
	if err := os.MkdirAll(r.cfg.RegistrationDir, 0o750); err != nil {
		return fmt.Errorf("registration directory: %w", err)
	}
	for {
		name, err := r.waitForDriver(ctx)
		if err != nil {
			return nil // ctx ended
		}
		sock := filepath.Join(r.cfg.RegistrationDir, name+"-reg.sock")
		why, err := r.serve(ctx, name, sock)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		r.log.Info("offering registration again", "driver", name, "why", why)
		select { // never spin: kubelet paces its own retries
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.CheckInterval):
		}
	}
}

// waitForDriver polls the driver until it answers GetPluginInfo and its
// Probe says ready, and returns the driver's name.
func (r *Registrar) waitForDriver(ctx context.Context) (string, error) {
	conn, err := grpc.NewClient("unix://"+r.driverSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	client := csipb.NewIdentityClient(conn)
	lastLogged := time.Time{}
	for {
		name, err := r.driverReady(ctx, client)
		if err == nil {
			return name, nil
		}
		if time.Since(lastLogged) > 30*time.Second {
			r.log.Info("waiting for the driver", "address", r.driverSock, "err", err)
			lastLogged = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(r.cfg.CheckInterval):
		}
	}
}

func (r *Registrar) driverReady(ctx context.Context, client csipb.IdentityClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := client.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil {
		return "", err
	}
	if info.GetName() == "" {
		return "", errors.New("the driver reports an empty name")
	}
	probe, err := client.Probe(ctx, &csipb.ProbeRequest{})
	if err != nil {
		return "", err
	}
	if probe.GetReady() != nil && !probe.GetReady().GetValue() {
		return "", errors.New("the driver is not ready yet (recovering its mounts)")
	}
	return info.GetName(), nil
}

// serve listens on sock and answers kubelet until ctx ends, kubelet
// reports a failed registration, or the socket disappears; it says which.
func (r *Registrar) serve(ctx context.Context, name, sock string) (string, error) {
	lis, owned, err := listenTakeover(sock)
	if err != nil {
		return "", err
	}
	// Drain a failure report left from an earlier round.
	select {
	case <-r.failed:
	default:
	}
	r.setRegistered(false)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &registrationServer{r: r, name: name})
	go srv.Serve(lis)
	defer func() {
		// Let the answer to kubelet's last call go out first.
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
		owned.removeIfOurs()
	}()
	r.log.Info("offering registration to kubelet", "driver", name, "socket", sock, "driver_path", r.cfg.KubeletDriverPath)

	t := time.NewTicker(r.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "stopping", nil
		case msg := <-r.failed:
			// Withdraw: kubelet retries with a growing delay while the
			// socket stays; a new socket later is registered at once.
			return "kubelet could not register the driver: " + msg, nil
		case <-t.C:
			if !owned.stillOurs() {
				return "the registration socket was removed or replaced", nil
			}
		}
	}
}

// registrationServer answers kubelet's registration calls.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	r    *Registrar
	name string
}

func (s *registrationServer) GetInfo(ctx context.Context, req *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.r.log.Info("kubelet asks for the driver's registration", "driver", s.name, "endpoint", s.r.cfg.KubeletDriverPath)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.name,
		Endpoint:          s.r.cfg.KubeletDriverPath,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.r.setRegistered(st.PluginRegistered)
	if st.PluginRegistered {
		s.r.log.Info("kubelet registered the driver", "driver", s.name)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	s.r.log.Warn("kubelet could not register the driver; will offer again once the driver answers", "driver", s.name, "err", st.Error)
	select {
	case s.r.failed <- st.Error:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
