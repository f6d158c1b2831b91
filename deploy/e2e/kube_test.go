package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// kubectl runs kubectl as cluster admin; the error carries stderr.
func (c *cluster) kubectl(args ...string) (string, error) {
	return c.kubectlIn(nil, args...)
}

func (c *cluster) kubectlIn(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command(c.art.bin("kubectl"), append([]string{"--kubeconfig", c.adminKubeconfig, "--request-timeout=60s"}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// apply creates or updates objects given as Go values (k8s.io/api types).
func (c *cluster) apply(objs ...any) error {
	for _, o := range objs {
		b, err := json.Marshal(o)
		if err != nil {
			return err
		}
		if out, err := c.kubectlIn(b, "apply", "-f", "-"); err != nil {
			return fmt.Errorf("%w\n%s", err, out)
		}
	}
	return nil
}

// getJSON decodes `kubectl get ARGS -o json` into out.
func (c *cluster) getJSON(out any, args ...string) error {
	s, err := c.kubectl(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(s), out)
}

// exec runs a command in a pod's container; stdout and stderr come back
// together, as a user would see them.
func (c *cluster) exec(pod string, command ...string) (string, error) {
	return c.kubectl(append([]string{"exec", "-n", "default", pod, "--"}, command...)...)
}

func (c *cluster) pod(name string) (*corev1.Pod, error) {
	var p corev1.Pod
	if err := c.getJSON(&p, "get", "pod", "-n", "default", name); err != nil {
		return nil, err
	}
	return &p, nil
}

// waitPodPhase waits until the pod reaches phase; a pod that reaches
// another final phase fails at once.
func (c *cluster) waitPodPhase(ctx context.Context, name string, phase corev1.PodPhase, timeout time.Duration) error {
	return waitUntil(ctx, fmt.Sprintf("pod %s is %s", name, phase), timeout, func() (bool, error) {
		p, err := c.pod(name)
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == phase {
			return true, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			logs, _ := c.kubectl("logs", "-n", "default", name)
			return false, fmt.Errorf("pod %s ended %s; its log:\n%s", name, p.Status.Phase, lastLines(logs, 30))
		}
		return false, nil
	})
}

func (c *cluster) deletePod(ctx context.Context, name string) error {
	if out, err := c.kubectl("delete", "pod", "-n", "default", name, "--ignore-not-found", "--wait=false"); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return waitUntil(ctx, "pod "+name+" is gone", 180*time.Second, func() (bool, error) {
		out, err := c.kubectl("get", "pod", "-n", "default", name, "--ignore-not-found", "-o", "name")
		return err == nil && strings.TrimSpace(out) == "", nil
	})
}

// podWith returns a pod on this node (no scheduler runs), on the host's
// network (no CNI plugin), running script in busybox, with volumes mounted
// under /data, /data2, ... in the order given.
func (c *cluster) podWith(name, script string, volumes ...corev1.Volume) *corev1.Pod {
	grace := int64(2)
	no := false
	p := &corev1.Pod{
		TypeMeta:   typeMeta("v1", "Pod"),
		ObjectMeta: objectMeta(name, "default"),
		Spec: corev1.PodSpec{
			NodeName:                      c.node,
			HostNetwork:                   true,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			RestartPolicy:                 corev1.RestartPolicyNever,
			Volumes:                       volumes,
			Containers: []corev1.Container{{
				Name: "app", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"/bin/sh", "-c", script},
			}},
		},
	}
	for i, v := range volumes {
		mp := "/data"
		if i > 0 {
			mp = fmt.Sprintf("/data%d", i+1)
		}
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: mp})
	}
	return p
}

func pvcVolume(name, claim string, readOnly bool) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly}}}
}

// readFileFromHost is for assertions about the node's own view (staging
// mounts); it runs in a child process so that this process never has a
// file open on a FUSE mount whose server it might start.
func readFileFromHost(path string) (string, error) {
	// A mount whose server is gone but whose connection a keeper still
	// holds makes readers wait: never wait forever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "cat", path).CombinedOutput()
	return string(out), err
}
