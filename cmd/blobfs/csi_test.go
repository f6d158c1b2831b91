package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/blobfs/blobfs/blobstore/storetest"
)

// TestCSIServe runs `blobfs csi` as kubelet's sidecars see it: it answers
// on its socket with its name and version, is ready, serves the node
// service, and on SIGTERM stops and removes its socket.
func TestCSIServe(t *testing.T) {
	bin := blobfsBin(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	cmd := exec.Command(bin, "csi", "--mode=node", "--endpoint=unix://"+sock, "--node-id=node-7",
		"--kubelet-dir="+filepath.Join(dir, "kubelet"), "--state-dir="+filepath.Join(dir, "state"), "--cache-dir="+filepath.Join(dir, "cache"))
	var stderr lockedBuffer
	cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	id := csipb.NewIdentityClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p, err := id.Probe(ctx, &csipb.ProbeRequest{})
		cancel()
		if err == nil && p.GetReady().GetValue() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("blobfs csi not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := id.GetPluginInfo(context.Background(), &csipb.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "blob.csi.blobfs.io" || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	ni, err := csipb.NewNodeClient(conn).NodeGetInfo(context.Background(), &csipb.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-7" {
		t.Fatalf("NodeGetInfo = %v, %v", ni, err)
	}
	caps, err := id.GetPluginCapabilities(context.Background(), &csipb.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 0 {
		t.Errorf("a node-only driver offers %v (%v); want no controller", caps.GetCapabilities(), err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("blobfs csi exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("blobfs csi did not stop on SIGTERM")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	// The operator sees why it stopped.
	if log := stderr.String(); !strings.Contains(log, `msg="signal received: stopping the CSI driver`) || !strings.Contains(log, "signal=terminated") {
		t.Errorf("SIGTERM is not in the log:\n%s", log)
	}
}

// lockedBuffer collects a child's output while it runs: storetest.LogBuffer.
type lockedBuffer = storetest.LogBuffer

func TestCSIFlags(t *testing.T) {
	bin := blobfsBin(t)
	for _, args := range [][]string{
		{"csi", "--mode=everything"},
		{"csi", "extra-arg"},
		{"csi", "--endpoint=tcp://0.0.0.0:1"},
		{"csi", "--driver-name=Not_A_DNS_Name", "--endpoint=unix:///tmp/x.sock"},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Errorf("blobfs %v: %v; want a failure", args, err)
		}
		if len(out) == 0 {
			t.Errorf("blobfs %v: no message", args)
		}
	}
}
