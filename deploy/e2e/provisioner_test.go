package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A stand-in for the external-provisioner sidecar (its image is not
// available here). It does what the sidecar does for this driver, with
// the same parameters, so the driver sees the requests it will see in a
// real cluster:
//
//   - a pending PVC of a StorageClass whose provisioner is this driver:
//     CreateVolume named pvc-<PVC uid>, with the class's parameters minus
//     the sidecar's own csi.storage.k8s.io/*-secret-* keys, plus what
//     --extra-create-metadata adds (csi.storage.k8s.io/pvc/name,
//     pvc/namespace, pv/name); the provisioner secret as request secrets;
//     then a PV bound to the claim whose volumeAttributes are the
//     response's volume context plus storage.kubernetes.io/csiProvisionerIdentity,
//     with the node-stage secret reference and the class's mount options;
//   - a Released PV it provisioned with reclaim policy Delete:
//     DeleteVolume with the provisioner secret, then the PV is deleted.
//
// It polls every second instead of watching: the tests wait for the
// outcome anyway.

const provisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"

type provisioner struct {
	c        *cluster
	client   csipb.ControllerClient
	conn     *grpc.ClientConn
	identity string
	cancel   context.CancelFunc
	done     chan struct{}

	mu     sync.Mutex
	failed map[string]string // object -> last error, logged once
}

var (
	provMu  sync.Mutex
	theProv *provisioner
)

func startProvisioner(ctx context.Context, c *cluster) error {
	conn, err := grpc.NewClient("unix://"+c.controllerSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &provisioner{c: c, client: csipb.NewControllerClient(conn), conn: conn, cancel: cancel, done: make(chan struct{}),
		identity: fmt.Sprintf("%d-8081-%s", time.Now().UnixMilli(), driverName), failed: map[string]string{}}
	provMu.Lock()
	theProv = p
	provMu.Unlock()
	go p.loop(ctx)
	logf("provisioner stand-in running (identity %s)", p.identity)
	return nil
}

func stopProvisioner() {
	provMu.Lock()
	p := theProv
	theProv = nil
	provMu.Unlock()
	if p != nil {
		p.cancel()
		<-p.done
		p.conn.Close()
	}
}

func (p *provisioner) loop(ctx context.Context) {
	defer close(p.done)
	for {
		p.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (p *provisioner) report(key string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.failed, key)
		return
	}
	if p.failed[key] != err.Error() {
		p.failed[key] = err.Error()
		logf("provisioner: %s: %v", key, err)
	}
}

func (p *provisioner) round(ctx context.Context) {
	var classes storagev1.StorageClassList
	if err := p.c.getJSON(&classes, "get", "storageclasses"); err != nil {
		return
	}
	ours := map[string]storagev1.StorageClass{}
	for _, sc := range classes.Items {
		if sc.Provisioner == driverName {
			ours[sc.Name] = sc
		}
	}
	var claims corev1.PersistentVolumeClaimList
	if err := p.c.getJSON(&claims, "get", "pvc", "-A"); err == nil {
		for _, pvc := range claims.Items {
			if pvc.Spec.StorageClassName == nil || pvc.Spec.VolumeName != "" || pvc.Status.Phase != corev1.ClaimPending || pvc.DeletionTimestamp != nil {
				continue
			}
			if sc, ok := ours[*pvc.Spec.StorageClassName]; ok {
				p.report("pvc "+pvc.Namespace+"/"+pvc.Name, p.provision(ctx, pvc, sc))
			}
		}
	}
	var vols corev1.PersistentVolumeList
	if err := p.c.getJSON(&vols, "get", "pv"); err == nil {
		for _, pv := range vols.Items {
			if pv.Annotations["pv.kubernetes.io/provisioned-by"] != driverName || pv.Status.Phase != corev1.VolumeReleased ||
				pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.DeletionTimestamp != nil {
				continue
			}
			p.report("pv "+pv.Name, p.delete(ctx, pv))
		}
	}
}

// sidecarKeys are the StorageClass parameters the sidecar consumes itself.
func sidecarKey(k string) bool {
	return strings.HasPrefix(k, "csi.storage.k8s.io/") && (strings.Contains(k, "-secret-") || strings.HasSuffix(k, "/fstype"))
}

func (p *provisioner) secret(sc storagev1.StorageClass, kind string) (map[string]string, *corev1.SecretReference, error) {
	name, ns := sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-name"], sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-namespace"]
	if name == "" {
		return nil, nil, nil
	}
	var s corev1.Secret
	if err := p.c.getJSON(&s, "get", "secret", "-n", ns, name); err != nil {
		return nil, nil, err
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, &corev1.SecretReference{Name: name, Namespace: ns}, nil
}

func accessMode(m corev1.PersistentVolumeAccessMode) csipb.VolumeCapability_AccessMode_Mode {
	switch m {
	case corev1.ReadWriteOnce:
		return csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case corev1.ReadOnlyMany:
		return csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case corev1.ReadWriteOncePod:
		return csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	default:
		return csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	}
}

func (p *provisioner) provision(ctx context.Context, pvc corev1.PersistentVolumeClaim, sc storagev1.StorageClass) error {
	pvName := "pvc-" + string(pvc.UID)
	params := map[string]string{}
	for k, v := range sc.Parameters {
		if !sidecarKey(k) {
			params[k] = v
		}
	}
	params["csi.storage.k8s.io/pvc/name"] = pvc.Name
	params["csi.storage.k8s.io/pvc/namespace"] = pvc.Namespace
	params["csi.storage.k8s.io/pv/name"] = pvName
	secrets, _, err := p.secret(sc, "provisioner")
	if err != nil {
		return err
	}
	var caps []*csipb.VolumeCapability
	for _, m := range pvc.Spec.AccessModes {
		caps = append(caps, &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{MountFlags: sc.MountOptions}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: accessMode(m)},
		})
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := p.client.CreateVolume(cctx, &csipb.CreateVolumeRequest{
		Name: pvName, Parameters: params, Secrets: secrets, VolumeCapabilities: caps,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: size.Value()},
	})
	if err != nil {
		return fmt.Errorf("CreateVolume: %w", err)
	}
	attrs := map[string]string{provisionerIdentityKey: p.identity}
	for k, v := range resp.GetVolume().GetVolumeContext() {
		attrs[k] = v
	}
	_, nodeStage, err := p.secret(sc, "node-stage")
	if err != nil {
		return err
	}
	capacity := size
	if b := resp.GetVolume().GetCapacityBytes(); b > 0 {
		capacity = *resource.NewQuantity(b, resource.BinarySI)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if sc.ReclaimPolicy != nil {
		reclaim = *sc.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		TypeMeta: typeMeta("v1", "PersistentVolume"),
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{
			"pv.kubernetes.io/provisioned-by":                            driverName,
			"volume.kubernetes.io/provisioner-deletion-secret-name":      sc.Parameters["csi.storage.k8s.io/provisioner-secret-name"],
			"volume.kubernetes.io/provisioner-deletion-secret-namespace": sc.Parameters["csi.storage.k8s.io/provisioner-secret-namespace"],
		}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: capacity},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              sc.Name,
			MountOptions:                  sc.MountOptions,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: resp.GetVolume().GetVolumeId(),
				VolumeAttributes: attrs, NodeStageSecretRef: nodeStage,
			}},
		},
	}
	if err := p.c.apply(pv); err != nil {
		return err
	}
	logf("provisioner: PVC %s/%s -> PV %s (volume %s)", pvc.Namespace, pvc.Name, pvName, resp.GetVolume().GetVolumeId())
	return nil
}

// delete finds the provisioner secret through the PV's annotations, as
// the sidecar does (the class may be gone by then).
func (p *provisioner) delete(ctx context.Context, pv corev1.PersistentVolume) error {
	var secrets map[string]string
	if name := pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"]; name != "" {
		var s corev1.Secret
		if err := p.c.getJSON(&s, "get", "secret", "-n", pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"], name); err != nil {
			return err
		}
		secrets = map[string]string{}
		for k, v := range s.Data {
			secrets[k] = string(v)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := p.client.DeleteVolume(cctx, &csipb.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, Secrets: secrets}); err != nil {
		return fmt.Errorf("DeleteVolume: %w", err)
	}
	if out, err := p.c.kubectl("delete", "pv", pv.Name, "--wait=false"); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	logf("provisioner: deleted PV %s (volume %s)", pv.Name, pv.Spec.CSI.VolumeHandle)
	return nil
}
