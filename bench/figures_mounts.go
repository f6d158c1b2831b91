package bench

// The memory-mounts figure: many mounts in one process, as `blobfs csi`
// serves every volume of a node, all streaming at once, under the
// process's memory budget (memory.SetBudget, blobfs csi --memory-mb).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/fusefs/memory"
)

// mountsMemoryMB is the budget of memory-mounts: blobfs csi's default.
const mountsMemoryMB = 2048

// serveMountsEnv makes blobfs-bench the serving child of the figure
// (ServeMountsChild), with a serveMountsSpec in JSON.
const serveMountsEnv = "BLOBFS_BENCH_SERVE_MOUNTS"

type serveMountsSpec struct {
	Store, Cache string
	Mountpoints  []string
	MemoryMB     int64
}

// ServeMountsChild serves the figure's mounts when this process is its
// child, until stdin closes, and reports true; otherwise it returns false
// at once. Every binary that runs the figure (blobfs-bench, this package's
// tests) calls it first thing: the child is that binary started again.
func ServeMountsChild() (bool, error) {
	raw := os.Getenv(serveMountsEnv)
	if raw == "" {
		return false, nil
	}
	var spec serveMountsSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return true, err
	}
	memory.SetBudget(spec.MemoryMB << 20)
	store, err := blobstore.NewLocal(spec.Store)
	if err != nil {
		return true, err
	}
	var sessions []*kernel.Session
	var filesystems []*fusefs.FS
	defer func() {
		for _, s := range sessions {
			s.Unmount(true)
		}
		for _, f := range filesystems {
			f.Close()
		}
	}()
	for i, mp := range spec.Mountpoints {
		fsys, err := fusefs.New(store, fusefs.Options{CacheDir: filepath.Join(spec.Cache, fmt.Sprint(i)), StoreID: "local", ReadOnly: true, Logger: discardLogger})
		if err != nil {
			return true, err
		}
		filesystems = append(filesystems, fsys)
		s, err := kernel.Mount(mp, fsys, kernel.MountOptions{Logger: discardLogger})
		if err != nil {
			return true, err
		}
		sessions = append(sessions, s)
	}
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes it
	return true, nil
}

// memoryMounts: peak RSS of one process serving Config.Mounts read-only
// mounts of a local store, each streaming its own file at once, against
// the budget plus two read blocks a mount plus 64 MiB.
func (r *runner) memoryMounts(ctx context.Context) Row {
	mountsCount, mountsFileSize := r.cfg.Mounts, r.cfg.MountFileSize
	perMount := int64(2 * fusefs.DefaultReadBlockSize)
	allowed := float64(mountsMemoryMB<<20+int64(mountsCount)*perMount+64*MiB) / MiB
	row := Row{ID: FigMemoryMounts, Figure: fmt.Sprintf("peak RSS, %d mounts in one process streaming at once, budget %d MiB", mountsCount, mountsMemoryMB),
		Unit: UnitMiB, Baseline: allowed, BaselineName: fmt.Sprintf("budget + 2 read blocks a mount + 64 MiB"), Target: Target{Max: 1}}
	work, err := r.newDir("mounts")
	if err != nil {
		row.Err = err
		return row
	}
	defer os.RemoveAll(work)
	spec := serveMountsSpec{Store: filepath.Join(work, "store"), Cache: filepath.Join(work, "cache"), MemoryMB: mountsMemoryMB}
	if err := os.MkdirAll(spec.Store, 0o755); err != nil {
		row.Err = err
		return row
	}
	for i := range mountsCount {
		// Sparse: the figure is about the server's memory, not the disk.
		f, err := os.Create(filepath.Join(spec.Store, fmt.Sprintf("f%02d", i)))
		if err == nil {
			err = f.Truncate(mountsFileSize)
			f.Close()
		}
		mp := filepath.Join(work, fmt.Sprintf("mnt%02d", i))
		if err == nil {
			err = os.Mkdir(mp, 0o755)
		}
		if err != nil {
			row.Err = err
			return row
		}
		spec.Mountpoints = append(spec.Mountpoints, mp)
	}
	raw, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		row.Err = err
		return row
	}
	child := exec.Command(self)
	child.Env = append(os.Environ(), serveMountsEnv+"="+string(raw))
	child.Stderr = os.Stderr
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		row.Err = err
		return row
	}
	defer func() {
		stdin.Close()
		child.Wait()
	}()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		row.Err = fmt.Errorf("serving child: %q %v", line, err)
		return row
	}
	stopSampling := sampleRSS(child.Process.Pid)
	r.settle()
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for i, mp := range spec.Mountpoints {
		g.Go(func() error {
			n, err := streamFile(gctx, filepath.Join(mp, fmt.Sprintf("f%02d", i)))
			if err == nil && n != mountsFileSize {
				err = fmt.Errorf("%s: streamed %d bytes, want %d", mp, n, mountsFileSize)
			}
			return err
		})
	}
	err = g.Wait()
	d := time.Since(start)
	sampled := stopSampling()
	if err != nil {
		row.Err = err
		return row
	}
	peak, err := peakRSS(child.Process.Pid)
	if err != nil {
		row.Err = err
		return row
	}
	row.Blobfs = float64(peak) / MiB
	total := int64(mountsCount) * mountsFileSize
	r.detail("%-13s VmHWM %.0f MiB, sampled VmRSS max %.0f MiB; %d × %s at %s in all; without a budget each mount could hold its own 256 MiB (%d MiB)",
		row.ID, row.Blobfs, float64(sampled)/MiB, mountsCount, human(mountsFileSize), mbps(total)(d), mountsCount*256)
	row.Note = fmt.Sprintf("VmHWM of one process serving %d mounts (fusefs in process, local store), each streaming %s at once; %s in all",
		mountsCount, human(mountsFileSize), mbps(total)(d))
	return row
}
