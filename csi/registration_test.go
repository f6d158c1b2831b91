package csi

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// identityOnly is a driver that answers the Identity service only.
type identityOnly struct {
	csipb.UnimplementedIdentityServer
	ready  atomic.Bool
	probes atomic.Int64 // Probes answered
}

func (d *identityOnly) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: "blob.csi.blobfs.io", VendorVersion: "test"}, nil
}

func (d *identityOnly) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	defer d.probes.Add(1)
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(d.ready.Load())}, nil
}

// startIdentity serves d on sock until the returned stop is called.
func startIdentity(t *testing.T, sock string, d *identityOnly) (stop func()) {
	t.Helper()
	os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, d)
	go srv.Serve(lis)
	return srv.Stop
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRegistrar plays kubelet against the registrar: registration is
// offered only while the driver is ready; a failed registration (kubelet
// restarted while the driver was down) withdraws the socket and a new one
// appears once the driver is back; a removed socket comes back.
func TestRegistrar(t *testing.T) {
	dir := t.TempDir()
	driverSock := filepath.Join(dir, "csi.sock")
	regDir := filepath.Join(dir, "plugins_registry")
	regSock := filepath.Join(regDir, "blob.csi.blobfs.io-reg.sock")
	drv := &identityOnly{}
	stopDriver := startIdentity(t, driverSock, drv)

	r, err := NewRegistrar(RegistrarConfig{DriverAddress: "unix://" + driverSock, KubeletDriverPath: "/var/lib/kubelet/plugins/blob.csi.blobfs.io/csi.sock",
		RegistrationDir: regDir, CheckInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	exists := func() bool { _, err := os.Stat(regSock); return err == nil }
	// Once a third Probe is answered "not ready", the registrar has
	// finished two rounds with that answer, in which it must not have
	// offered registration (a registrar that did stops probing).
	waitFor(t, "the registrar's third Probe", func() bool { return drv.probes.Load() >= 3 || exists() })
	if exists() {
		t.Fatal("registration offered while the driver's Probe says not ready")
	}
	drv.ready.Store(true)
	waitFor(t, "the registration socket appears", exists)

	kubelet := func() registerapi.RegistrationClient {
		conn, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return registerapi.NewRegistrationClient(conn)
	}
	info, err := kubelet().GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "blob.csi.blobfs.io" || info.Endpoint != "/var/lib/kubelet/plugins/blob.csi.blobfs.io/csi.sock" {
		t.Fatalf("GetInfo = %+v; want the CSI plugin blob.csi.blobfs.io at kubelet's path of its socket", info)
	}
	if _, err := kubelet().NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if !r.Registered() {
		t.Error("Registered() is false after kubelet said registered")
	}
	// A hard link keeps the first socket's inode alive, so that a new socket
	// cannot be given the same inode number and look like the old one.
	firstLink := filepath.Join(dir, "first-reg.sock")
	if err := os.Link(regSock, firstLink); err != nil {
		t.Fatal(err)
	}
	first, _ := os.Stat(firstLink)

	// kubelet restarts while the driver is down: its registration fails.
	stopDriver()
	if _, err := kubelet().NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "connection refused"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the socket is withdrawn after a failed registration", func() bool { return !exists() })
	time.Sleep(200 * time.Millisecond)
	if exists() {
		t.Fatal("registration offered again while the driver is down")
	}
	stopDriver = startIdentity(t, driverSock, drv)
	defer func() { stopDriver() }()
	waitFor(t, "a new registration socket appears once the driver is back", exists)
	if now, _ := os.Stat(regSock); os.SameFile(first, now) {
		t.Error("the registration socket was not created anew")
	}
	if _, err := kubelet().GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("GetInfo on the new socket: %v", err)
	}

	// Someone removes the socket: it comes back.
	os.Remove(regSock)
	waitFor(t, "a removed registration socket is created again", exists)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if exists() {
		t.Error("the registration socket is left behind after Run returned")
	}
}
