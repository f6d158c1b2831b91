// Package deploy holds the Kubernetes manifests; its test decodes every
// one strictly into the Kubernetes API types, so that a misspelt field
// fails CI instead of being dropped silently by the API server.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const driverName = "blob.csi.blobfs.io"

// newObject returns an empty typed object for apiVersion and kind.
func newObject(apiVersion, kind string) any {
	switch apiVersion + "/" + kind {
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1/Secret":
		return &corev1.Secret{}
	case "v1/PersistentVolume":
		return &corev1.PersistentVolume{}
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}
	case "v1/Pod":
		return &corev1.Pod{}
	case "v1/Service":
		return &corev1.Service{}
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "storage.k8s.io/v1/CSIDriver":
		return &storagev1.CSIDriver{}
	case "storage.k8s.io/v1/StorageClass":
		return &storagev1.StorageClass{}
	}
	return nil
}

// kustomization is the part of kustomize's format used here.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decodeAll strictly decodes every manifest under the deploy directory.
func decodeAll(t *testing.T) map[string][]any {
	t.Helper()
	files, _ := filepath.Glob("*.yaml")
	ex, _ := filepath.Glob("examples/*.yaml")
	files = append(files, ex...)
	if len(files) < 8 {
		t.Fatalf("only %d manifests found: %v", len(files), files)
	}
	out := map[string][]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if f == "kustomization.yaml" {
			var k kustomization
			if err := yaml.UnmarshalStrict(b, &k); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			for _, r := range k.Resources {
				if _, err := os.Stat(r); err != nil {
					t.Errorf("%s: resource %s: %v", f, r, err)
				}
			}
			continue
		}
		for i, doc := range docSep.Split(string(b), -1) {
			if len(bytes.TrimSpace([]byte(stripComments(doc)))) == 0 {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Errorf("%s #%d: %v", f, i, err)
				continue
			}
			obj := newObject(tm.APIVersion, tm.Kind)
			if obj == nil {
				t.Errorf("%s #%d: no type known for %s %s (add it to newObject)", f, i, tm.APIVersion, tm.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s #%d (%s): %v", f, i, tm.Kind, err)
				continue
			}
			out[f] = append(out[f], obj)
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestManifestsDecodeStrictly(t *testing.T) {
	decodeAll(t)
}

// TestStrictDecodingCatchesTypos proves the check can fail.
func TestStrictDecodingCatchesTypos(t *testing.T) {
	doc := "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: x}\nspec: {attachRequierd: false}\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &storagev1.CSIDriver{}); err == nil {
		t.Fatal("a misspelt field decoded without error")
	}
}

// TestManifestsFitTogether checks what a cluster would trip over: one
// driver name everywhere, the node plugin's privileges and mounts, the
// surge update, the sidecars.
func TestManifestsFitTogether(t *testing.T) {
	all := decodeAll(t)
	var ds, keeper *appsv1.DaemonSet
	var dep *appsv1.Deployment
	for _, objs := range all {
		for _, o := range objs {
			switch o := o.(type) {
			case *storagev1.CSIDriver:
				if o.Name != driverName || o.Spec.AttachRequired == nil || *o.Spec.AttachRequired {
					t.Errorf("CSIDriver %s: attachRequired must be false", o.Name)
				}
				modes := map[storagev1.VolumeLifecycleMode]bool{}
				for _, m := range o.Spec.VolumeLifecycleModes {
					modes[m] = true
				}
				if !modes[storagev1.VolumeLifecyclePersistent] || !modes[storagev1.VolumeLifecycleEphemeral] {
					t.Errorf("CSIDriver lifecycle modes %v", o.Spec.VolumeLifecycleModes)
				}
				// Volumes honour a pod's fsGroup: the node plugin applies
				// it (VOLUME_MOUNT_GROUP, whatever the policy); File is
				// kubelet's own chown should a node plugin lack that.
				if p := o.Spec.FSGroupPolicy; p == nil || *p != storagev1.FileFSGroupPolicy {
					t.Errorf("CSIDriver %s: fsGroupPolicy %v, want File", o.Name, p)
				}
			case *storagev1.StorageClass:
				if o.Provisioner != driverName {
					t.Errorf("StorageClass %s: provisioner %q", o.Name, o.Provisioner)
				}
			case *corev1.PersistentVolume:
				if o.Spec.CSI == nil || o.Spec.CSI.Driver != driverName || !strings.HasPrefix(o.Spec.CSI.VolumeHandle, "blobfs1#") {
					t.Errorf("PersistentVolume %s: csi %+v", o.Name, o.Spec.CSI)
				}
			case *corev1.Pod:
				for _, v := range o.Spec.Volumes {
					if v.CSI != nil && v.CSI.Driver != driverName {
						t.Errorf("Pod %s: inline volume driver %q", o.Name, v.CSI.Driver)
					}
				}
			case *appsv1.DaemonSet:
				switch o.Name {
				case "blobfs-csi-node":
					ds = o
				case "blobfs-csi-keeper":
					keeper = o
				default:
					t.Errorf("unexpected DaemonSet %s", o.Name)
				}
			case *appsv1.Deployment:
				dep = o
			}
		}
	}
	if ds == nil || keeper == nil || dep == nil {
		t.Fatal("node DaemonSet, keeper DaemonSet or controller Deployment missing")
	}
	checkKeeper(t, ds, keeper)
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
		t.Error("node DaemonSet: rolling update needs maxSurge >= 1")
	}
	containers := map[string]corev1.Container{}
	for _, c := range ds.Spec.Template.Spec.Containers {
		containers[c.Name] = c
	}
	for _, want := range []string{"blobfs", "registrar", "liveness-probe"} {
		if _, ok := containers[want]; !ok {
			t.Errorf("node DaemonSet lacks container %s", want)
		}
	}
	if !ds.Spec.Template.Spec.HostPID {
		t.Error("node DaemonSet: hostPID is needed to repair running containers' views of a volume (csi/views.go)")
	}
	node := containers["blobfs"]
	if node.SecurityContext == nil || node.SecurityContext.Privileged == nil || !*node.SecurityContext.Privileged {
		t.Error("node plugin must be privileged")
	}
	var bidir, fuse bool
	for _, m := range node.VolumeMounts {
		if m.MountPath == "/var/lib/kubelet" && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			bidir = true
		}
		if m.MountPath == "/dev/fuse" {
			fuse = true
		}
	}
	if !bidir || !fuse {
		t.Errorf("node plugin mounts: kubelet dir bidirectional %v, /dev/fuse %v", bidir, fuse)
	}
	if !strings.Contains(strings.Join(containers["registrar"].Args, " "), "/var/lib/kubelet/plugins/"+driverName+"/csi.sock") {
		t.Error("registrar registers another socket path")
	}
	var prov bool
	for _, c := range dep.Spec.Template.Spec.Containers {
		if strings.Contains(c.Image, "csi-provisioner") {
			prov = strings.Contains(strings.Join(c.Args, " "), "--extra-create-metadata")
		}
	}
	if !prov {
		t.Error("controller: csi-provisioner with --extra-create-metadata missing")
	}
	// Each component's metrics Service selects its pods and reaches their
	// named metrics port.
	for _, w := range []struct {
		labels map[string]string
		spec   corev1.PodSpec
	}{{ds.Spec.Template.Labels, ds.Spec.Template.Spec}, {dep.Spec.Template.Labels, dep.Spec.Template.Spec}} {
		found := false
		for _, objs := range all {
			for _, o := range objs {
				svc, ok := o.(*corev1.Service)
				if !ok || len(svc.Spec.Selector) == 0 {
					continue
				}
				selected := true
				for k, v := range svc.Spec.Selector {
					selected = selected && w.labels[k] == v
				}
				if !selected {
					continue
				}
				for _, p := range svc.Spec.Ports {
					for _, c := range w.spec.Containers {
						for _, cp := range c.Ports {
							if cp.Name == p.TargetPort.String() && cp.Name == "metrics" && slices.Contains(c.Args, fmt.Sprintf("--metrics-address=:%d", cp.ContainerPort)) {
								found = true
							}
						}
					}
				}
			}
		}
		if !found {
			t.Errorf("no metrics Service reaches the metrics port of the pods labelled %v", w.labels)
		}
	}
}

// checkKeeper: the keeper is a DaemonSet of its own (so that deleting the
// node plugin's pod does not stop it), rolls out with a surge (its
// successor takes the mounts over), and listens where the driver looks
// for it: the same host directory, the socket --keeper-socket names.
func checkKeeper(t *testing.T, node, keeper *appsv1.DaemonSet) {
	t.Helper()
	for _, c := range node.Spec.Template.Spec.Containers {
		if slices.Contains(c.Args, "keeper") {
			t.Errorf("node DaemonSet runs the keeper in its pod (container %s): it would die with the pod", c.Name)
		}
	}
	if ru := keeper.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
		t.Error("keeper DaemonSet: rolling update needs maxSurge >= 1")
	}
	hostDir := func(spec corev1.PodSpec, c corev1.Container, mountPath string) string {
		for _, m := range c.VolumeMounts {
			if m.MountPath == mountPath {
				for _, v := range spec.Volumes {
					if v.Name == m.Name && v.HostPath != nil {
						return v.HostPath.Path
					}
				}
			}
		}
		return ""
	}
	flag := func(c corev1.Container, name string) string {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		return ""
	}
	var driverSide, keeperSide string
	for _, c := range node.Spec.Template.Spec.Containers {
		if sock := flag(c, "--keeper-socket"); sock != "" {
			driverSide = filepath.Join(hostDir(node.Spec.Template.Spec, c, filepath.Dir(sock)), filepath.Base(sock))
		}
	}
	for _, c := range keeper.Spec.Template.Spec.Containers {
		if sock := flag(c, "--socket"); sock != "" && slices.Contains(c.Args, "keeper") {
			keeperSide = filepath.Join(hostDir(keeper.Spec.Template.Spec, c, filepath.Dir(sock)), filepath.Base(sock))
		}
	}
	if driverSide == "" || driverSide != keeperSide {
		t.Errorf("the driver looks for its keeper at %q on the host, the keeper listens at %q", driverSide, keeperSide)
	}
}

// TestImageTags: every container of blobfs's image runs the tag the
// kustomization names, which is the release `make image` tags
// (Makefile's RELEASE reads it), and never pulls it from a registry.
func TestImageTags(t *testing.T) {
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 || k.Images[0].Name != "blobfs" || k.Images[0].NewTag == "" || k.Images[0].NewTag == "latest" {
		t.Fatalf("kustomization images: %+v; want blobfs with a release tag", k.Images)
	}
	want := "blobfs:" + k.Images[0].NewTag
	n := 0
	for file, objs := range decodeAll(t) {
		for _, o := range objs {
			var spec *corev1.PodSpec
			switch o := o.(type) {
			case *appsv1.DaemonSet:
				spec = &o.Spec.Template.Spec
			case *appsv1.Deployment:
				spec = &o.Spec.Template.Spec
			default:
				continue
			}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Image != "blobfs" && !strings.HasPrefix(c.Image, "blobfs:") {
					continue
				}
				n++
				if c.Image != want {
					t.Errorf("%s: container %s runs %s; the kustomization (and make image) tag %s", file, c.Name, c.Image, want)
				}
				if c.ImagePullPolicy != corev1.PullIfNotPresent {
					t.Errorf("%s: container %s: imagePullPolicy %q; an imported image needs IfNotPresent", file, c.Name, c.ImagePullPolicy)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no container runs blobfs's image")
	}
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mk), "-tag blobfs:$(RELEASE)") || !strings.Contains(string(mk), "newTag") {
		t.Error("Makefile: make image does not tag blobfs:$(RELEASE) read from the kustomization's newTag")
	}
}
