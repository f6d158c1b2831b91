package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

type probeFlags struct {
	csiAddress   string
	healthPort   int
	probeTimeout time.Duration
	httpEndpoint string
	verbosity    int
}

func parseProbeFlags(args []string, stderr io.Writer) (probeFlags, error) {
	var f probeFlags
	fs := flag.NewFlagSet("livenessprobe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.csiAddress, "csi-address", "/run/csi/socket", "path of the CSI driver's unix socket")
	fs.IntVar(&f.healthPort, "health-port", 9808, "TCP port to serve /healthz on, on all addresses")
	fs.DurationVar(&f.probeTimeout, "probe-timeout", time.Second, "timeout of the CSI Probe call")
	fs.StringVar(&f.httpEndpoint, "http-endpoint", "", "host:port to serve /healthz on; overrides --health-port")
	// Accepted because the manifests may pass it to the real sidecar;
	// this one logs little either way.
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity; 4 or more logs failed probes")
	// Parse prints what is wrong and the usage itself.
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments: %q", fs.Args())
		fmt.Fprintln(stderr, err)
		return f, err
	}
	return f, nil
}

func (f probeFlags) addr() string {
	if f.httpEndpoint != "" {
		return f.httpEndpoint
	}
	return ":" + strconv.Itoa(f.healthPort)
}

// prober answers /healthz from the driver's Identity.Probe.
type prober struct {
	client  csipb.IdentityClient
	timeout time.Duration
	log     *slog.Logger
}

func (p *prober) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), p.timeout)
	defer cancel()
	err := p.probe(ctx)
	if err != nil {
		p.log.Debug("probe failed", "error", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok")
}

func (p *prober) probe(ctx context.Context) error {
	resp, err := p.client.Probe(ctx, &csipb.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("Probe: %w", err)
	}
	// An unset Ready means ready, by the CSI spec.
	if r := resp.GetReady(); r != nil && !r.GetValue() {
		return errors.New("driver is not ready")
	}
	return nil
}

func healthHandler(c csipb.IdentityClient, timeout time.Duration, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", &prober{client: c, timeout: timeout, log: log})
	return mux
}

// runLivenessProbe is the livenessprobe role: it serves until ctx ends.
func runLivenessProbe(ctx context.Context, f probeFlags, log *slog.Logger) error {
	// One connection for all requests: grpc reconnects by itself when the
	// driver restarts and its socket comes back.
	conn, err := dialCSI(f.csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	srv := &http.Server{Handler: healthHandler(csipb.NewIdentityClient(conn), f.probeTimeout, log), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", f.addr())
	if err != nil {
		return err
	}
	log.Info("livenessprobe serving", "address", ln.Addr().String(), "csi_address", f.csiAddress)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
