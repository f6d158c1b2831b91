package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
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

const (
	provisionerIdentityKey = "storage.kubernetes.io/csiProvisionerIdentity"
	provisionedByKey       = "pv.kubernetes.io/provisioned-by"
	deletionSecretName     = "volume.kubernetes.io/provisioner-deletion-secret-name"
	deletionSecretNS       = "volume.kubernetes.io/provisioner-deletion-secret-namespace"
	selectedNodeKey        = "volume.kubernetes.io/selected-node"
)

type provisionerFlags struct {
	csiAddress    string
	timeout       time.Duration
	verbosity     int
	extraMetadata bool
}

func parseProvisionerFlags(args []string, stderr io.Writer) (provisionerFlags, error) {
	var f provisionerFlags
	fs := flag.NewFlagSet("csi-provisioner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.csiAddress, "csi-address", "/run/csi/socket", "path of the CSI driver's unix socket")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "timeout of each CSI call")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity; 4 or more logs every round")
	fs.BoolVar(&f.extraMetadata, "extra-create-metadata", false, "pass the PVC's name and namespace and the PV's name as CreateVolume parameters")
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

// csiTarget turns --csi-address into a grpc target; the sidecars take a
// plain path or a unix:// URL.
func csiTarget(addr string) string {
	if strings.HasPrefix(addr, "unix://") {
		return addr
	}
	return "unix://" + addr
}

func dialCSI(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(csiTarget(addr), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// runProvisioner is the csi-provisioner role: it returns when ctx ends.
func runProvisioner(ctx context.Context, f provisionerFlags, log *slog.Logger) error {
	kube, err := inClusterAPI()
	if err != nil {
		return err
	}
	conn, err := dialCSI(f.csiAddress)
	if err != nil {
		return err
	}
	defer conn.Close()
	driver, err := driverName(ctx, csipb.NewIdentityClient(conn), f.timeout, log)
	if err != nil {
		return err
	}
	p := newProvisioner(kube, csipb.NewControllerClient(conn), driver, f, log)
	log.Info("provisioner running", "driver", driver, "identity", p.identity, "csi_address", f.csiAddress)
	for {
		p.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// driverName asks the driver for its name, waiting for it to come up: the
// sidecar starts alongside it and the socket may not exist yet.
func driverName(ctx context.Context, c csipb.IdentityClient, timeout time.Duration, log *slog.Logger) (string, error) {
	var last string
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := c.GetPluginInfo(cctx, &csipb.GetPluginInfoRequest{})
		cancel()
		if err == nil && resp.GetName() == "" {
			err = errors.New("GetPluginInfo returned no name")
		}
		if err == nil {
			return resp.GetName(), nil
		}
		if err.Error() != last {
			last = err.Error()
			log.Warn("waiting for the CSI driver", "error", err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// provisioner does what the external-provisioner sidecar does for this
// driver, with the same CSI parameters and the same PV, polling.
type provisioner struct {
	kube          *kubeAPI
	client        csipb.ControllerClient
	driver        string
	identity      string
	timeout       time.Duration
	extraMetadata bool
	log           *slog.Logger

	mu     sync.Mutex
	failed map[string]string // object -> last error, so each is logged once
	seen   map[string]bool   // objects reported on in the current round
}

func newProvisioner(kube *kubeAPI, client csipb.ControllerClient, driver string, f provisionerFlags, log *slog.Logger) *provisioner {
	return &provisioner{
		kube: kube, client: client, driver: driver, timeout: f.timeout, extraMetadata: f.extraMetadata, log: log,
		// The sidecar's identity format: start time, its port, driver name.
		// The driver sees it in volumeAttributes.
		identity: fmt.Sprintf("%d-8081-%s", time.Now().UnixMilli(), driver),
		failed:   map[string]string{},
	}
}

// report logs an object's failure the first time and when it changes,
// not on every round, and forgets it on success.
func (p *provisioner) report(key string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[key] = true
	if err == nil {
		delete(p.failed, key)
		return
	}
	if p.failed[key] != err.Error() {
		p.failed[key] = err.Error()
		p.log.Error("failed", "object", key, "error", err)
	}
}

// round looks at the cluster once and acts on what it finds.
func (p *provisioner) round(ctx context.Context) {
	p.mu.Lock()
	p.seen = map[string]bool{}
	p.mu.Unlock()
	defer func() {
		// Objects that are gone or fine again may fail anew later with
		// the same error; that is worth a line then.
		p.mu.Lock()
		for k := range p.failed {
			if !p.seen[k] {
				delete(p.failed, k)
			}
		}
		p.mu.Unlock()
	}()

	var vols corev1.PersistentVolumeList
	err := p.kube.get(ctx, "/api/v1/persistentvolumes", &vols)
	p.report("list persistentvolumes", err)
	if err != nil {
		return
	}
	var classes storagev1.StorageClassList
	err = p.kube.get(ctx, "/apis/storage.k8s.io/v1/storageclasses", &classes)
	p.report("list storageclasses", err)
	if err != nil {
		return
	}
	var claims corev1.PersistentVolumeClaimList
	err = p.kube.get(ctx, "/api/v1/persistentvolumeclaims", &claims)
	p.report("list persistentvolumeclaims", err)
	if err != nil {
		return
	}

	ours := map[string]storagev1.StorageClass{}
	for _, sc := range classes.Items {
		if sc.Provisioner == p.driver {
			ours[sc.Name] = sc
		}
	}
	exists := map[string]bool{}
	for _, pv := range vols.Items {
		exists[pv.Name] = true
	}
	pending, released := 0, 0
	for _, pvc := range claims.Items {
		if pvc.Spec.StorageClassName == nil || pvc.Spec.VolumeName != "" || pvc.Status.Phase != corev1.ClaimPending || pvc.DeletionTimestamp != nil {
			continue
		}
		sc, ok := ours[*pvc.Spec.StorageClassName]
		if !ok {
			continue
		}
		// Like the sidecar, a WaitForFirstConsumer claim waits for the
		// scheduler to pick a node (this stand-in then ignores which).
		if sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer && pvc.Annotations[selectedNodeKey] == "" {
			continue
		}
		// The PV of an earlier round waits for the PV controller to bind
		// it; creating the volume again would only repeat the answer.
		if exists["pvc-"+string(pvc.UID)] {
			continue
		}
		pending++
		p.report("pvc "+pvc.Namespace+"/"+pvc.Name, p.provision(ctx, pvc, sc))
	}
	for _, pv := range vols.Items {
		if pv.Annotations[provisionedByKey] != p.driver || pv.Status.Phase != corev1.VolumeReleased ||
			pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.DeletionTimestamp != nil {
			continue
		}
		released++
		p.report("pv "+pv.Name, p.delete(ctx, pv))
	}
	p.log.Debug("round", "classes", len(ours), "pending_claims", pending, "released_volumes", released)
}

// sidecarKey tells the StorageClass parameters the sidecar consumes
// itself and does not pass to the driver.
func sidecarKey(k string) bool {
	return strings.HasPrefix(k, "csi.storage.k8s.io/") && (strings.Contains(k, "-secret-") || strings.HasSuffix(k, "/fstype"))
}

func (p *provisioner) readSecret(ctx context.Context, ns, name string) (map[string]string, error) {
	var s corev1.Secret
	if err := p.kube.get(ctx, "/api/v1/namespaces/"+url.PathEscape(ns)+"/secrets/"+url.PathEscape(name), &s); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, nil
}

// secretRef is the class's secret of this kind (provisioner,
// node-stage), if it names one.
func secretRef(sc storagev1.StorageClass, kind string) *corev1.SecretReference {
	name, ns := sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-name"], sc.Parameters["csi.storage.k8s.io/"+kind+"-secret-namespace"]
	if name == "" {
		return nil
	}
	return &corev1.SecretReference{Name: name, Namespace: ns}
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
	if p.extraMetadata {
		params["csi.storage.k8s.io/pvc/name"] = pvc.Name
		params["csi.storage.k8s.io/pvc/namespace"] = pvc.Namespace
		params["csi.storage.k8s.io/pv/name"] = pvName
	}
	var secrets map[string]string
	if ref := secretRef(sc, "provisioner"); ref != nil {
		var err error
		if secrets, err = p.readSecret(ctx, ref.Namespace, ref.Name); err != nil {
			return err
		}
	}
	var caps []*csipb.VolumeCapability
	for _, m := range pvc.Spec.AccessModes {
		caps = append(caps, &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{MountFlags: sc.MountOptions}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: accessMode(m)},
		})
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
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
	capacity := size
	if b := resp.GetVolume().GetCapacityBytes(); b > 0 {
		capacity = *resource.NewQuantity(b, resource.BinarySI)
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if sc.ReclaimPolicy != nil {
		reclaim = *sc.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{
			provisionedByKey: p.driver,
			// Deletion finds the secret here: the class may be gone by then.
			deletionSecretName: sc.Parameters["csi.storage.k8s.io/provisioner-secret-name"],
			deletionSecretNS:   sc.Parameters["csi.storage.k8s.io/provisioner-secret-namespace"],
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
				Driver: p.driver, VolumeHandle: resp.GetVolume().GetVolumeId(),
				// Only referenced, not read, as the sidecar does: kubelet
				// reads it at NodeStageVolume.
				VolumeAttributes: attrs, NodeStageSecretRef: secretRef(sc, "node-stage"),
			}},
		},
	}
	switch err := p.kube.create(ctx, "/api/v1/persistentvolumes", pv); {
	case isStatus(err, http.StatusConflict):
		// Created by an earlier round whose answer was lost; the
		// volume is the same (CreateVolume is idempotent by name).
		p.log.Debug("already provisioned", "pvc", pvc.Namespace+"/"+pvc.Name, "pv", pvName)
		return nil
	case err != nil:
		return err
	}
	p.log.Info("provisioned", "pvc", pvc.Namespace+"/"+pvc.Name, "pv", pvName, "volume_id", resp.GetVolume().GetVolumeId())
	return nil
}

// delete finds the provisioner secret through the PV's annotations, as
// the sidecar does (the class may be gone by then).
func (p *provisioner) delete(ctx context.Context, pv corev1.PersistentVolume) error {
	if pv.Spec.CSI == nil {
		return errors.New("not a CSI volume")
	}
	var secrets map[string]string
	if name := pv.Annotations[deletionSecretName]; name != "" {
		var err error
		if secrets, err = p.readSecret(ctx, pv.Annotations[deletionSecretNS], name); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if _, err := p.client.DeleteVolume(cctx, &csipb.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, Secrets: secrets}); err != nil {
		return fmt.Errorf("DeleteVolume: %w", err)
	}
	// 404: someone deleted the PV meanwhile, which is the goal.
	if err := p.kube.delete(ctx, "/api/v1/persistentvolumes/"+url.PathEscape(pv.Name)); err != nil && !isStatus(err, http.StatusNotFound) {
		return err
	}
	claim := ""
	if r := pv.Spec.ClaimRef; r != nil {
		claim = r.Namespace + "/" + r.Name
	}
	p.log.Info("deleted", "pvc", claim, "pv", pv.Name, "volume_id", pv.Spec.CSI.VolumeHandle)
	return nil
}
