package csi

import (
	"context"
	"fmt"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Controller service: a volume is a blob container. CreateVolume creates it
// (or adopts an existing one of the same name), DeleteVolume deletes it
// unless the StorageClass said retainContainer=true. There is no attach
// step (CSIDriver attachRequired: false) and no capacity: a container
// grows as needed, so volumes report capacity 0 ("unknown") and the
// provisioner records the requested size.

func (d *Driver) ControllerGetCapabilities(ctx context.Context, req *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: []*csipb.ControllerServiceCapability{{
		Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{
			Type: csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		}},
	}}}, nil
}

func (d *Driver) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, invalid("name is missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities is missing")
	}
	for i, c := range req.GetVolumeCapabilities() {
		if _, _, err := checkCapability(fmt.Sprintf("volume_capabilities[%d]", i), c); err != nil {
			return nil, err
		}
	}
	if req.GetVolumeContentSource() != nil {
		return nil, invalid("volume_content_source: blobfs volumes cannot be created from snapshots or other volumes")
	}
	if cr := req.GetCapacityRange(); cr != nil && (cr.GetRequiredBytes() < 0 || cr.GetLimitBytes() < 0) {
		return nil, status.Error(codes.OutOfRange, "capacity_range: negative size")
	}
	p, err := parseParams(req.GetParameters(), "parameters")
	if err != nil {
		return nil, invalid("%v", err)
	}
	if p.SecretName != "" {
		p.SecretNamespace = p.secretNamespaceFor("")
	}
	if _, err := parseMountOptions(p.MountOptions, "parameters[mountOptions]"); err != nil {
		return nil, invalid("%v", err)
	}
	creds, _, err := d.credentialsFor(ctx, req.GetSecrets(), p, "secrets", "")
	if err != nil {
		return nil, err
	}
	account, endpoint, err := p.target(creds)
	if err != nil {
		return nil, invalid("%v", err)
	}
	container, err := containerNameFor(req.GetName(), p)
	if err != nil {
		return nil, invalid("%v", err)
	}
	id := volumeID{Account: account, Container: container, Endpoint: endpoint, Retain: p.RetainContainer}
	if err := id.check(); err != nil {
		return nil, invalid("%v", err)
	}
	cfg, err := azureConfig(id, creds, p)
	if err != nil {
		return nil, invalid("credentials: %v", err)
	}

	if !d.locks.tryLock(req.GetName()) {
		return nil, busy(req.GetName())
	}
	defer d.locks.unlock(req.GetName())
	// Creating is idempotent: an existing container is success, which is
	// also how a StorageClass with containerName adopts one.
	if err := d.containers.Create(ctx, cfg); err != nil {
		return nil, storeError(fmt.Sprintf("create container %q", container), err)
	}
	d.log.Info("volume created", "volume", id.String(), "container", container)
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{
		VolumeId:      id.String(),
		CapacityBytes: 0,
		VolumeContext: p.contextFor(),
	}}, nil
}

func (d *Driver) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	if _, err := parseBlobCSIHandle(req.GetVolumeId()); err == nil && !strings.HasPrefix(req.GetVolumeId(), volumeIDPrefix+"#") {
		// blobfs did not create that container (blob-csi-driver did, or
		// a user who moved the PV over): deleting data it never made is
		// not its to do. The provisioner calls this only for volumes it
		// provisioned, so this takes a PV edited by hand.
		d.log.Warn("DeleteVolume of a blob-csi-driver volume: blobfs did not create its container and keeps it; delete it with Azure's tools if it is no longer wanted", "volume", req.GetVolumeId())
		return &csipb.DeleteVolumeResponse{}, nil
	}
	id, err := parseVolumeID(req.GetVolumeId())
	if err != nil {
		// No volume of this driver has this id, so it does not exist:
		// the CSI spec answers that with success.
		d.log.Warn("DeleteVolume of an id this driver never made; nothing to delete", "err", err)
		return &csipb.DeleteVolumeResponse{}, nil
	}
	if id.Retain {
		d.log.Info("volume deleted; its container is kept (retainContainer)", "volume", req.GetVolumeId())
		return &csipb.DeleteVolumeResponse{}, nil
	}
	creds, err := parseSecrets(req.GetSecrets(), "secrets")
	if err != nil {
		return nil, invalid("%v", err)
	}
	cfg, err := azureConfig(id, creds, volumeParams{})
	if err != nil {
		return nil, invalid("credentials: %v", err)
	}
	if !d.locks.tryLock(req.GetVolumeId()) {
		return nil, busy(req.GetVolumeId())
	}
	defer d.locks.unlock(req.GetVolumeId())
	if err := d.containers.Delete(ctx, cfg); err != nil {
		return nil, storeError(fmt.Sprintf("delete container %q", id.Container), err)
	}
	d.log.Info("volume deleted with its container", "volume", req.GetVolumeId())
	return &csipb.DeleteVolumeResponse{}, nil
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities is missing")
	}
	p, perr := parseParams(req.GetVolumeContext(), "volume_context")
	id, err := idOfHandle(req.GetVolumeId(), p)
	if err != nil {
		return nil, invalid("volume_id: %v", err)
	}
	creds, err := parseSecrets(req.GetSecrets(), "secrets")
	if err != nil {
		return nil, invalid("%v", err)
	}
	cfg, err := azureConfig(id, creds, p)
	if err != nil {
		return nil, invalid("credentials: %v", err)
	}
	if !d.locks.tryLock(req.GetVolumeId()) {
		return nil, busy(req.GetVolumeId())
	}
	defer d.locks.unlock(req.GetVolumeId())
	if err := d.containers.Check(ctx, cfg); err != nil {
		return nil, storeError(fmt.Sprintf("volume %q", req.GetVolumeId()), err)
	}
	var problems []string
	if perr != nil {
		problems = append(problems, perr.Error())
	}
	if _, err := parseParams(req.GetParameters(), "parameters"); err != nil {
		problems = append(problems, err.Error())
	}
	for i, c := range req.GetVolumeCapabilities() {
		if _, _, err := checkCapability(fmt.Sprintf("volume_capabilities[%d]", i), c); err != nil {
			problems = append(problems, status.Convert(err).Message())
		}
	}
	if len(problems) > 0 {
		return &csipb.ValidateVolumeCapabilitiesResponse{Message: strings.Join(problems, "; ")}, nil
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// idOfHandle names the container of a volume id: blobfs's, or one in
// blob-csi-driver's RG#ACCOUNT#CONTAINER#... format (at the endpoint p's
// server or storageEndpointSuffix gives, else the public cloud's).
func idOfHandle(handle string, p volumeParams) (volumeID, error) {
	id, err := parseVolumeID(handle)
	if err == nil || strings.HasPrefix(handle, volumeIDPrefix+"#") {
		return id, err
	}
	h, herr := parseBlobCSIHandle(handle)
	if herr != nil {
		return volumeID{}, herr
	}
	p.StorageAccount = h.Account
	_, endpoint, err := p.target(credentials{})
	if err != nil {
		return volumeID{}, err
	}
	id = volumeID{Account: h.Account, Container: h.Container, Endpoint: endpoint}
	return id, id.check()
}
