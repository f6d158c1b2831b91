package bench

// The Azurite figures: each client's mount against the raw SDK on the same
// container. Every mount is fresh, so that nothing is cached in blobfs or
// in the kernel, and the page cache is dropped before each timed phase.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/blobfs/blobfs/fusefs"
)

// seqRead: read one large blob sequentially through a fresh mount, against
// the fastest SDK download of the same blob.
func (r *runner) seqRead(ctx context.Context) Row {
	size := r.cfg.Size
	row := Row{ID: FigSeqRead, Figure: fmt.Sprintf("sequential read %s (Azurite)", human(size)), Unit: UnitMBps, Target: Target{Min: 0.9}}
	data := r.largeData()
	name := fmt.Sprintf("read-%d.bin", r.unique())
	if err := r.az.uploadFast(ctx, name, data); err != nil {
		row.Err = fmt.Errorf("upload %s: %w", name, err)
		return row
	}
	defer r.az.delete(context.Background(), name)
	dst := r.scratchBuf()

	baselines := r.az.downloadStrategies(name, data, dst, r.work, r.cfg.FewStrategies)
	contenders := r.clientSides(func(ctx context.Context, c client) (time.Duration, error) {
		return r.withMount(ctx, c, func(dir string) (time.Duration, error) {
			return r.timedRead(ctx, joinPath(dir, name), dst, data)
		})
	})
	out, err := r.compare(ctx, row.ID, "SDK", mbps(size), baselines, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, throughput(size), "SDK ")
}

// seqReadWarm: the sequential read of seqRead on one mount that serves
// every repetition, informational. A fresh mount is a new blobfs process
// whose block cache is new memory, and on these VMs faulting that in costs
// the process about as much CPU as the read itself (the host takes freed
// guest memory back); the SDK side reads into a buffer it faulted in long
// before. This row shows the read with that paid once, before timing.
//
// The reads go round a ring of blobs of the same content, enough of them
// that the others read since a blob's last turn add up to more than the
// block cache: no repetition finds its blocks there.
func (r *runner) seqReadWarm(ctx context.Context) (row Row) {
	size := r.cfg.Size
	row = Row{ID: FigSeqReadWarm, Figure: fmt.Sprintf("sequential read %s, one mount for every repetition (Azurite)", human(size)), Unit: UnitMBps}
	cache := blobfsCacheBytes(r.cfg.BlobfsArgs)
	data := r.largeData()
	u := r.unique()
	names := make([]string, cache/size+2)
	for i := range names {
		names[i] = fmt.Sprintf("read-warm-%d-%d.bin", u, i)
		if err := r.az.uploadFast(ctx, names[i], data); err != nil {
			row.Err = fmt.Errorf("upload %s: %w", names[i], err)
			return row
		}
		defer r.az.delete(context.Background(), names[i])
	}
	dst := r.scratchBuf()
	dir, err := r.newDir("mnt-warm-" + r.blobfs.name)
	if err == nil {
		var scratch string
		if scratch, err = r.newDir("cache-warm-" + r.blobfs.name); err == nil {
			defer os.RemoveAll(scratch)
			var m mount
			if m, err = r.blobfs.mount(ctx, dir, scratch); err == nil {
				defer func() {
					// As withMount: an unmount failure fails the figure.
					if cerr := m.Close(); cerr != nil && row.Err == nil {
						row.Err = fmt.Errorf("unmount: %w", cerr)
					}
				}()
				dir = m.Dir()
			}
		}
	}
	if err != nil {
		row.Err = err
		return row
	}
	reads := 0
	read := func(ctx context.Context) (time.Duration, error) {
		name := names[reads%len(names)]
		reads++
		return r.timedRead(ctx, joinPath(dir, name), dst, data)
	}
	// Untimed: the mount faults in its cache.
	if _, err := read(ctx); err != nil {
		row.Err = fmt.Errorf("warm-up read: %w", err)
		return row
	}
	baselines := r.az.downloadStrategies(names[0], data, dst, r.work, r.cfg.FewStrategies)
	contenders := []side{{name: blobfsName, run: read}}
	out, err := r.compare(ctx, row.ID, "SDK", mbps(size), baselines, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	row = r.fill(row, out, throughput(size), "SDK ")
	row.Note = fmt.Sprintf("informational (seq-read is the issue's figure): one blobfs mount reads %d blobs of %s in turn, the first read untimed, so that none is in its %s cache when read", len(names), human(size), human(cache))
	return row
}

// timedRead reads path whole into dst, timed from a settled machine, and
// checks that it holds want.
func (r *runner) timedRead(ctx context.Context, path string, dst, want []byte) (time.Duration, error) {
	clear(dst)
	r.settle()
	start := time.Now()
	if err := readFileInto(ctx, path, dst); err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, verify(dst, want)
}

// blobfsCacheBytes is the block cache of the blobfs mounts that take args:
// the last --block-cache-mb among them, else blobfs's default.
func blobfsCacheBytes(args []string) int64 {
	cache := int64(fusefs.DefaultBlockCacheBytes)
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "block-cache-mb" {
			continue
		}
		if !hasValue && i+1 < len(args) {
			value = args[i+1]
		}
		if mb, err := strconv.ParseInt(value, 10, 64); err == nil {
			cache = mb * MiB
		}
	}
	return cache
}

// seqWrite: write one large file through a fresh mount and close it, until
// the blob is in the store, against the fastest SDK upload with the same
// integrity check (a Content-MD5 on every block).
func (r *runner) seqWrite(ctx context.Context) Row {
	row := Row{ID: FigSeqWrite, Figure: r.seqWriteTitle("Azurite"), Unit: UnitMBps, Target: Target{Min: 1}}
	return r.seqWriteRow(ctx, row, nil)
}

// seqWriteTitle is the figure of a seqWrite row, where says where the
// store ran.
func (r *runner) seqWriteTitle(where string) string {
	return fmt.Sprintf("sequential write %s until durable, Content-MD5 on every block (%s)", human(r.cfg.Size), where)
}

// errNoCPUOfItsOwn: seqWriteOwnCPU cannot give Azurite a CPU of its own
// here.
var errNoCPUOfItsOwn = errors.New("Azurite cannot be given a CPU of its own")

// seqWriteOwnCPU: seqWrite with Azurite on a CPU of its own and every
// client on the others (cpuSplit), as a store elsewhere is. On shared
// CPUs Azurite's one thread decides seqWrite for both sides; here each
// side meets its own bound: the store's CPU, or its own.
func (r *runner) seqWriteOwnCPU(ctx context.Context) Row {
	row := Row{ID: FigSeqWriteOwnCPU, Unit: UnitMBps, Target: Target{Min: 1}}
	split, err := newCPUSplit()
	if err != nil {
		row.Figure = r.seqWriteTitle("Azurite on a CPU of its own")
		row.Err = fmt.Errorf("%w: %w", errNoCPUOfItsOwn, err)
		return row
	}
	row.Figure = r.seqWriteTitle(fmt.Sprintf("Azurite on CPU %s of its own, the clients on CPU %s", cpuList(&split.store), cpuList(&split.clients)))
	proc, ok := r.az.storeProcess()
	if !ok {
		row.Err = fmt.Errorf("%w: its process is not on this machine, or not readable", errNoCPUOfItsOwn)
		return row
	}
	// Before any pinning: one that fails half way is undone too.
	defer func() {
		// The Azurite of the end: -fresh-azurite replaces it.
		end, _ := r.az.storeProcess()
		if err := split.release(end); err != nil {
			r.logf("%s: giving the CPUs back: %v", row.ID, err)
		}
	}()
	if err := split.pinClients(); err != nil {
		row.Err = err
		return row
	}
	if err := split.pinStore(proc); err != nil {
		row.Err = err
		return row
	}
	r.logf("%s: %s (Azurite pid %d)", row.ID, split, proc.pid)
	return r.seqWriteRow(ctx, row, split)
}

// seqWriteRow measures seqWrite's figure into row. With split, the
// Azurite of every repetition is put on the store's CPU first: a fresh
// one started by this process may have inherited the clients' CPUs.
func (r *runner) seqWriteRow(ctx context.Context, row Row, split *cpuSplit) Row {
	size := r.cfg.Size
	data := r.largeData()
	newName := func() string { return fmt.Sprintf("write-sdk-%d.bin", r.unique()) }
	baselines := r.az.uploadStrategies(newName, data)
	// Every repetition on a fresh Azurite where the run can have one:
	// this figure writes a GiB a repetition, and an in-memory Azurite's
	// garbage collection of the ones before slowed every repetition
	// after the first few down by 1.7 times, so that the best of three
	// depended on who went first (SDK 5.4, 9.3 and 9.5 s in one run).
	fresh := func() error {
		if r.cfg.FreshAzurite != "" {
			if err := r.freshAzurite(ctx); err != nil {
				return err
			}
		}
		if split == nil {
			return nil
		}
		proc, ok := r.az.storeProcess()
		if !ok {
			return errors.New("Azurite's process is no longer found on this machine")
		}
		return split.pinStore(proc)
	}
	for i := range baselines {
		prepare := baselines[i].prepare
		baselines[i].prepare = func() error {
			if err := fresh(); err != nil {
				return err
			}
			if prepare != nil {
				return prepare()
			}
			return nil
		}
	}
	// After each repetition, untimed and outside its Azurite CPU (as the
	// baseline's check): the blob is deleted, and the first of each
	// client is read back first, to check that it holds what was
	// written.
	verified := map[string]bool{}
	written, toVerify := "", false
	contenders := r.clientSides(func(ctx context.Context, c client) (time.Duration, error) {
		name := pathSafe(fmt.Sprintf("write-%s-%d.bin", c.name, r.unique()))
		d, err := r.withMount(ctx, c, func(dir string) (time.Duration, error) {
			r.settle()
			return r.timeUntilDurable(ctx, c.name, func(interrupted *int) error {
				return countInterrupted(writeFileFrom(ctx, joinPath(dir, name), data), interrupted)
			}, func(ctx context.Context) (bool, error) {
				n, err := r.az.size(ctx, name)
				return n == size, err
			})
		})
		if err != nil {
			// No check follows a failed repetition.
			r.az.delete(context.Background(), name)
			return 0, err
		}
		written, toVerify = name, !verified[c.name]
		verified[c.name] = true
		return d, nil
	})
	readBack := func(ctx context.Context) error {
		name := written
		defer r.az.delete(context.Background(), name)
		if !toVerify {
			return nil
		}
		dst := r.scratchBuf()
		clear(dst)
		n, err := r.az.download(ctx, name, dst)
		if err != nil {
			return fmt.Errorf("read back %s: %w", name, err)
		}
		return verify(dst[:min(n, len(dst))], data)
	}
	for i := range contenders {
		contenders[i].prepare = fresh
		contenders[i].check = readBack
	}
	out, err := r.compare(ctx, row.ID, "SDK", mbps(size), baselines, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, throughput(size), "SDK ")
}

// timeUntilDurable times write and then durable: when durable holds right
// after write returns, the time is write's; otherwise it runs until
// durable first holds, and the log says so.
//
// write reports closes that failed with EINTR through interrupted and
// carries on; the store then decides whether the data made it.
func (r *runner) timeUntilDurable(ctx context.Context, who string, write func(interrupted *int) error, durable func(context.Context) (bool, error)) (time.Duration, error) {
	start := time.Now()
	interrupted := 0
	if err := write(&interrupted); err != nil {
		return 0, err
	}
	closed := time.Since(start)
	if interrupted > 0 {
		r.interrupted[who] += interrupted
		r.detail("    %s: close(2) failed with EINTR %d times; waiting for the store", who, interrupted)
	}
	at, atClose, err := waitDurable(ctx, durable)
	if err != nil {
		return 0, fmt.Errorf("after close: %w", err)
	}
	if atClose {
		return closed, nil
	}
	d := at.Sub(start)
	r.detail("    %s: not durable when close returned (%.3f s); durable after %.3f s", who, closed.Seconds(), d.Seconds())
	return d, nil
}

// smallData is the content of the small files: file i is the i-th slice
// of SmallFileSize bytes.
func (r *runner) smallData() []byte {
	return randomBytes(int64(r.cfg.SmallFiles*r.cfg.SmallFileSize), 2)
}

func (r *runner) smallContent(all []byte, i int) []byte {
	return all[i*r.cfg.SmallFileSize : (i+1)*r.cfg.SmallFileSize]
}

func smallName(dir string, i int) string { return fmt.Sprintf("%s/f%05d", dir, i) }

// smallCreate: create SmallFiles files through a fresh mount, one after
// another, until all are in the store, against the SDK uploading them one
// after another.
func (r *runner) smallCreate(ctx context.Context) Row {
	n := r.cfg.SmallFiles
	// No target on Azurite, where a Put costs about a millisecond and
	// a create's five FUSE round trips weigh as much: faulty-create
	// holds the target, at a real store's latency.
	row := Row{ID: FigSmallCreate, Figure: fmt.Sprintf("create %d × %s files until durable (Azurite)", n, human(int64(r.cfg.SmallFileSize))), Unit: UnitFilesS}
	all := r.smallData()
	var dir string
	baseline := strategy{
		name:    "Upload × N, serially",
		prepare: func() error { dir = fmt.Sprintf("create-sdk-%d", r.unique()); return nil },
		run: func(ctx context.Context) error {
			for i := range n {
				if err := r.az.upload(ctx, smallName(dir, i), r.smallContent(all, i)); err != nil {
					return err
				}
			}
			return nil
		},
		check: func(ctx context.Context) error {
			got, err := r.az.count(ctx, dir+"/")
			if err == nil && got != n {
				err = fmt.Errorf("%d blobs under %s/, want %d", got, dir, n)
			}
			return err
		},
	}
	contenders := r.clientSides(func(ctx context.Context, c client) (time.Duration, error) {
		dir := pathSafe(fmt.Sprintf("create-%s-%d", c.name, r.unique()))
		return r.withMount(ctx, c, func(mnt string) (time.Duration, error) {
			if err := os.Mkdir(joinPath(mnt, dir), 0o755); err != nil {
				return 0, err
			}
			r.settle()
			return r.timeUntilDurable(ctx, c.name, func(interrupted *int) error {
				for i := range n {
					err := createFile(joinPath(mnt, smallName(dir, i)), r.smallContent(all, i))
					if err := countInterrupted(err, interrupted); err != nil {
						return err
					}
				}
				return nil
			}, func(ctx context.Context) (bool, error) {
				got, err := r.az.count(ctx, dir+"/")
				return got == n, err
			})
		})
	})
	out, err := r.compare(ctx, row.ID, "SDK", filesPerSec(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "SDK ")
}

// createFile creates path, which must not exist, with data.
func createFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return closeFile(f)
}

// countInterrupted counts err in *n when it is errCloseInterrupted and
// returns nil then; other errors pass through.
func countInterrupted(err error, n *int) error {
	if errors.Is(err, errCloseInterrupted) {
		*n++
		return nil
	}
	return err
}

// smallSetDir holds the small files that small-list and small-read work
// on, uploaded by the SDK (untimed) on first use.
const smallSetDir = "small"

func (r *runner) smallSet(ctx context.Context) ([]byte, error) {
	all := r.smallData()
	if got, err := r.az.count(ctx, smallSetDir+"/"); err != nil || got == r.cfg.SmallFiles {
		return all, err
	}
	for i := range r.cfg.SmallFiles {
		if err := r.az.uploadAsBlobfs(ctx, smallName(smallSetDir, i), r.smallContent(all, i)); err != nil {
			return nil, err
		}
	}
	return all, nil
}

// smallList: list the directory of small files on a fresh mount and stat
// each entry (ls -l), against one flat listing with metadata.
func (r *runner) smallList(ctx context.Context) Row {
	n := r.cfg.SmallFiles
	row := Row{ID: FigSmallList, Figure: fmt.Sprintf("cold list + stat of %d files (Azurite)", n), Unit: UnitFilesS, Target: Target{Min: 0.9}}
	if _, err := r.smallSet(ctx); err != nil {
		row.Err = err
		return row
	}
	baseline := strategy{
		name: "ListBlobsFlat + metadata",
		run: func(ctx context.Context) error {
			got, err := r.az.count(ctx, smallSetDir+"/")
			if err == nil && got != n {
				err = fmt.Errorf("listed %d blobs, want %d", got, n)
			}
			return err
		},
	}
	contenders := r.clientSides(func(ctx context.Context, c client) (time.Duration, error) {
		return r.withMount(ctx, c, func(mnt string) (time.Duration, error) {
			r.settle()
			dir := joinPath(mnt, smallSetDir)
			start := time.Now()
			entries, err := os.ReadDir(dir)
			if err != nil {
				return 0, err
			}
			for _, e := range entries {
				fi, err := os.Lstat(joinPath(dir, e.Name()))
				if err != nil {
					return 0, err
				}
				if !fi.Mode().IsRegular() || fi.Size() != int64(r.cfg.SmallFileSize) {
					return 0, fmt.Errorf("%s: mode %v size %d, want a regular file of %d bytes", e.Name(), fi.Mode(), fi.Size(), r.cfg.SmallFileSize)
				}
			}
			d := time.Since(start)
			if len(entries) != n {
				return 0, fmt.Errorf("listed %d entries, want %d", len(entries), n)
			}
			return d, nil
		})
	})
	out, err := r.compare(ctx, row.ID, "SDK", filesPerSec(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "SDK ")
}

// smallRead: read every small file by name on a fresh mount, against one
// GET per file.
func (r *runner) smallRead(ctx context.Context) Row {
	n := r.cfg.SmallFiles
	row := Row{ID: FigSmallRead, Figure: fmt.Sprintf("cold read of %d × %s files (Azurite)", n, human(int64(r.cfg.SmallFileSize))), Unit: UnitFilesS, Target: Target{Min: 0.9}}
	all, err := r.smallSet(ctx)
	if err != nil {
		row.Err = err
		return row
	}
	buf := make([]byte, r.cfg.SmallFileSize)
	baseline := strategy{
		name: "DownloadStream × N, serially",
		run: func(ctx context.Context) error {
			for i := range n {
				name := smallName(smallSetDir, i)
				got, err := r.az.download(ctx, name, buf)
				if err != nil {
					return err
				}
				if got != len(buf) || !bytes.Equal(buf, r.smallContent(all, i)) {
					return fmt.Errorf("%s: wrong content", name)
				}
			}
			return nil
		},
	}
	contenders := r.clientSides(func(ctx context.Context, c client) (time.Duration, error) {
		return r.withMount(ctx, c, func(mnt string) (time.Duration, error) {
			r.settle()
			start := time.Now()
			for i := range n {
				name := smallName(smallSetDir, i)
				got, err := os.ReadFile(joinPath(mnt, name))
				if err != nil {
					return 0, err
				}
				if !bytes.Equal(got, r.smallContent(all, i)) {
					return 0, fmt.Errorf("%s: wrong content (%d bytes)", name, len(got))
				}
			}
			return time.Since(start), nil
		})
	})
	out, err := r.compare(ctx, row.ID, "SDK", filesPerSec(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "SDK ")
}
