package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// --- fsGroup (VOLUME_MOUNT_GROUP) -----------------------------------------

// TestFSGroup: pods with a securityContext share a volume through their
// fsGroup, which kubelet hands to the driver (VOLUME_MOUNT_GROUP) rather
// than chowning files. A pod running as 1000:3000 with fsGroup 2000 writes
// a file, a script (0755) and a directory only the group may write in; a
// second pod, 1001:4000 with the same fsGroup, reads the file, runs the
// script and writes in the group's directory, which it can only do as a
// member of group 2000. The files' group is 2000 in the pods' mounts, in
// the node's staged mount, and in the blobs' metadata; a blob another tool
// wrote shows group 2000 and was not touched (kubelet did not chown it). A
// third pod with fsGroup 3000 waits while the second uses the volume on
// this node, and starts, with the volume mounted for group 3000, once the
// others are gone.
func TestFSGroup(t *testing.T) {
	ctx := testContext(t)
	c := theCluster
	const claim = "fsgroup"
	pvName, container := newClaim(t, ctx, claim, classDelete)
	handle := volumeHandle(t, pvName)
	if err := c.putBlob(ctx, container, "legacy.txt", []byte("written by another tool\n")); err != nil {
		t.Fatal(err)
	}

	withIDs := func(p *corev1.Pod, uid, gid int64) *corev1.Pod {
		fsGroup := int64(2000)
		p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &fsGroup}
		return p
	}
	writer := withIDs(c.podWith("fsgroup-writer", `set -e
echo "ID $(id -u) $(id -g)"
echo "ROOT $(stat -c '%g %a' /data)"
echo "shared by fsGroup 2000" > /data/shared.txt
printf '#!/bin/sh\necho "script ran as $(id -u)"\n' > /data/run.sh
chmod 0755 /data/run.sh
mkdir /data/team
chmod 2770 /data/team
echo "for the group" > /data/team/notes.txt
chmod 0660 /data/team/notes.txt
stat -c 'STAT %n %u %g %a' /data/shared.txt /data/run.sh /data/team /data/team/notes.txt /data/legacy.txt`, pvcVolume("data", claim, false)), 1000, 3000)
	runPod(t, ctx, writer)
	if err := c.waitPodPhase(ctx, writer.Name, corev1.PodSucceeded, 180*time.Second); err != nil {
		t.Fatal(err)
	}
	wlog := podLog(t, writer.Name)
	t.Logf("writer:\n%s", wlog)
	for _, want := range []string{
		"ID 1000 3000",
		"ROOT 2000 2777", // the volume's root: the fsGroup, set-group-ID, group rwx
		"STAT /data/shared.txt 1000 2000 644",
		"STAT /data/run.sh 1000 2000 755",
		"STAT /data/team 1000 2000 2770",
		"STAT /data/team/notes.txt 1000 2000 660",
		"STAT /data/legacy.txt 0 2000 666", // no attributes: the mount's defaults
	} {
		if !strings.Contains(wlog, want) {
			t.Errorf("the writer's log lacks %q", want)
		}
	}

	reader := withIDs(c.podWith("fsgroup-reader", `set -e
echo "ID $(id -u) $(id -g)"
cat /data/shared.txt
/data/run.sh
echo "and the second pod" >> /data/team/notes.txt
echo "new" > /data/team/from-reader.txt
stat -c 'STAT %n %u %g %a' /data/team/from-reader.txt
cat /data/team/notes.txt
echo "READER DONE"
sleep 3600`, pvcVolume("data", claim, false)), 1001, 4000)
	runPod(t, ctx, reader)
	var rlog string
	if err := waitUntil(ctx, "the reader is done", 180*time.Second, func() (bool, error) {
		if p, err := c.pod(reader.Name); err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded) {
			out, _ := c.kubectl("logs", "-n", "default", reader.Name)
			t.Fatalf("the reader ended %s; its log:\n%s", p.Status.Phase, out)
		}
		rlog, _ = c.kubectl("logs", "-n", "default", reader.Name)
		return strings.Contains(rlog, "READER DONE"), nil
	}); err != nil {
		t.Fatalf("%v; its log:\n%s", err, rlog)
	}
	t.Logf("reader:\n%s", rlog)
	for _, want := range []string{
		"ID 1001 4000",
		"shared by fsGroup 2000",
		"script ran as 1001", // the script ran (exit 0: set -e)
		"STAT /data/team/from-reader.txt 1001 2000 644",
		"for the group\nand the second pod",
	} {
		if !strings.Contains(rlog, want) {
			t.Errorf("the reader's log lacks %q", want)
		}
	}

	// The node's view: the staged mount, while the reader uses it.
	out, err := statFromHost(stagingPath(handle), "shared.txt", "team/from-reader.txt")
	if err != nil {
		t.Errorf("stat in the staged mount: %v: %s", err, out)
	} else if want := "shared.txt 1000 2000\nteam/from-reader.txt 1001 2000\n"; out != want {
		t.Errorf("in the staged mount:\n%s\nwant\n%s", out, want)
	}
	// The store's: the group is in the blobs' metadata, for the next mount.
	for _, name := range []string{"shared.txt", "run.sh", "team/notes.txt", "team/from-reader.txt"} {
		md, err := c.blobMetadata(ctx, container, name)
		if err != nil || md["blobfs_gid"] != "2000" {
			t.Errorf("blob %s: metadata %v, %v; want blobfs_gid 2000", name, md, err)
		}
	}
	if md, _ := c.blobMetadata(ctx, container, "run.sh"); md["blobfs_mode"] != "100755" {
		t.Errorf("blob run.sh: blobfs_mode %q, want 100755", md["blobfs_mode"])
	}
	// Had kubelet applied the fsGroup itself (a driver without
	// VOLUME_MOUNT_GROUP), it would have chowned this blob: one Set Blob
	// Metadata per blob.
	if md, err := c.blobMetadata(ctx, container, "legacy.txt"); err != nil || md["blobfs_gid"] != "" || md["blobfs_mode"] != "" {
		t.Errorf("blob legacy.txt: metadata %v, %v; want it untouched", md, err)
	}

	// Another fsGroup on the same node while the reader uses the volume:
	// it waits, told why.
	other := c.podWith("fsgroup-other", `set -e
echo "ROOT $(stat -c '%g %a' /data)"
echo x > /data/other.txt
stat -c 'STAT %n %u %g' /data/other.txt /data/shared.txt /data/legacy.txt`, pvcVolume("data", claim, false))
	uid, gid := int64(1002), int64(3000)
	other.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &gid}
	runPod(t, ctx, other)
	var events string
	if err := waitUntil(ctx, "the third pod is told why it waits", 120*time.Second, func() (bool, error) {
		events, _ = c.kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name="+other.Name, "-o", "jsonpath={.items[*].message}")
		return strings.Contains(events, "fsGroup 2000") && strings.Contains(events, "fsGroup 3000"), nil
	}); err != nil {
		t.Fatalf("%v; its events: %s", err, events)
	}
	if p, err := c.pod(other.Name); err != nil {
		t.Fatal(err)
	} else if p.Status.Phase != corev1.PodPending {
		t.Fatalf("the pod with another fsGroup is %s; want it Pending while the reader uses the volume", p.Status.Phase)
	}
	t.Logf("the third pod waits: %s", lastLines(events, 1))
	for _, p := range []string{writer.Name, reader.Name} {
		if err := c.deletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// kubelet keeps the volume staged for the waiting pod and retries.
	if err := c.waitPodPhase(ctx, other.Name, corev1.PodSucceeded, 240*time.Second); err != nil {
		t.Fatal(err)
	}
	olog := podLog(t, other.Name)
	t.Logf("third pod:\n%s", olog)
	for _, want := range []string{
		"ROOT 3000 2777",
		"STAT /data/other.txt 1002 3000",
		"STAT /data/shared.txt 1000 2000", // stored: kept
		"STAT /data/legacy.txt 0 3000",    // none stored: the mount's group
	} {
		if !strings.Contains(olog, want) {
			t.Errorf("the third pod's log lacks %q", want)
		}
	}
	if err := c.deletePod(ctx, other.Name); err != nil {
		t.Fatal(err)
	}
	waitNoMounts(t, ctx, pvName, handle)
	deleteClaim(t, ctx, claim, pvName)
	waitContainerGone(t, ctx, container)
}

// statFromHost prints "NAME UID GID" for names under dir, in a child
// process (this process never holds files open on a FUSE mount).
func statFromHost(dir string, names ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "stat", append([]string{"-c", "%n %u %g"}, names...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}
