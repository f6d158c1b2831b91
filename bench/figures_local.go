package bench

// The figures that need no Azurite: blobfs served in-process over the
// fault-injecting fake and the in-memory store, and the memory bound of a
// `blobfs mount` over a local directory.

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// withInProcess mounts blobfs over store in this process on a fresh
// directory, runs f with the mountpoint and unmounts.
func (r *runner) withInProcess(store blobstore.Store, f func(dir string) (time.Duration, error)) (d time.Duration, err error) {
	dir, err := r.newDir("mnt-inprocess")
	if err != nil {
		return 0, err
	}
	cache, err := r.newDir("cache-inprocess")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(cache)
	m, err := mountInProcess(dir, cache, store, fusefs.Options{})
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := m.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	return f(m.Dir())
}

// faultyStore is the fake of the faulty-* figures: the in-memory store
// behind the configured latency and per-stream bandwidth cap.
func (r *runner) faultyStore() (*blobstore.Memory, *blobstore.Faulty) {
	mem := blobstore.NewMemory()
	return mem, blobstore.NewFaulty(mem, blobstore.FaultOptions{
		Seed:      1,
		Latency:   r.cfg.FaultyLatency,
		Bandwidth: r.cfg.FaultyBandwidth,
	})
}

func (r *runner) faultyLabel() string {
	return fmt.Sprintf("fake store: %v latency, %s/s per stream", r.cfg.FaultyLatency, human(r.cfg.FaultyBandwidth))
}

// faultyRead: sequential read through blobfs over the fake, against
// direct reads of the fake, one stream and ranged in parallel, each
// checked against the Content-MD5 as blobfs checks it.
func (r *runner) faultyRead(ctx context.Context) Row {
	size := r.cfg.FaultySize
	row := Row{ID: FigFaultyRead, Figure: fmt.Sprintf("sequential read %s checked against its Content-MD5 (%s)", human(size), r.faultyLabel()), Unit: UnitMBps, Target: Target{Min: 0.9}}
	data := randomBytes(size, 3)
	dst := make([]byte, size)
	mem, store := r.faultyStore()
	const name = "read.bin"
	// The store keeps the Put's MD5 as the blob's Content-MD5, and blobfs
	// checks whole reads against it (--verify-md5, default on): the
	// direct reads check it too, as azcopy does by default
	// (--check-md5).
	a, err := mem.Put(ctx, name, data, blobstore.PutOptions{})
	if err != nil {
		row.Err = err
		return row
	}
	want := a.ContentMD5
	prepare := func() error { clear(dst); return nil }
	check := func(context.Context) error { return verify(dst, data) }
	baselines := []strategy{{"1 stream (one ReadAt), MD5 checked after", prepare, func(ctx context.Context) error {
		n, err := store.ReadAt(ctx, name, dst, 0, "")
		if n == len(dst) && err == io.EOF {
			err = nil
		}
		if err != nil {
			return err
		}
		if sum := md5.Sum(dst); !bytes.Equal(sum[:], want) {
			return errors.New("the content read does not match its Content-MD5")
		}
		return nil
	}, check}}
	for _, p := range []struct {
		block int64
		conc  int
	}{{4 * MiB, 4}, {4 * MiB, 8}, {4 * MiB, 16}, {8 * MiB, 16}} {
		baselines = append(baselines, strategy{fmt.Sprintf("ranged ReadAt %s × %d, MD5 checked in order", human(p.block), p.conc), prepare, func(ctx context.Context) error {
			return parallelRead(ctx, store, name, dst, p.block, p.conc, want)
		}, check})
	}
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		return r.withInProcess(store, func(dir string) (time.Duration, error) {
			clear(dst)
			r.settle()
			start := time.Now()
			if err := readFileInto(ctx, filepath.Join(dir, name), dst); err != nil {
				return 0, err
			}
			d := time.Since(start)
			return d, verify(dst, data)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "direct", mbps(size), baselines, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, throughput(size), "direct ")
}

// parallelRead reads name into dst in ranges of block bytes, conc at a
// time, what the SDK's DownloadBuffer does, and checks the whole against
// its Content-MD5 want, hashed in order as the ranges land, as azcopy
// does.
func parallelRead(ctx context.Context, s blobstore.Store, name string, dst []byte, block int64, conc int, want []byte) error {
	n := (int64(len(dst)) + block - 1) / block
	landed := make([]chan struct{}, n)
	for i := range landed {
		landed[i] = make(chan struct{})
	}
	failed := make(chan struct{}) // closed when a read fails
	hashed := make(chan error, 1)
	go func() {
		h := md5.New()
		for i := range n {
			select {
			case <-landed[i]:
			case <-failed:
				hashed <- nil
				return
			}
			h.Write(dst[i*block : min((i+1)*block, int64(len(dst)))])
		}
		if !bytes.Equal(h.Sum(nil), want) {
			hashed <- errors.New("the content read does not match its Content-MD5")
			return
		}
		hashed <- nil
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i := range n {
		off, end := i*block, min((i+1)*block, int64(len(dst)))
		g.Go(func() error {
			got, err := s.ReadAt(gctx, name, dst[off:end], off, "")
			if got == int(end-off) && err == io.EOF {
				err = nil
			}
			if err == nil {
				close(landed[i])
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		close(failed)
		<-hashed
		return err
	}
	return <-hashed
}

// faultyWrite: write a file through blobfs over the fake and close it,
// against direct uploads to the fake: one Put, or blocks staged in
// parallel and committed.
func (r *runner) faultyWrite(ctx context.Context) Row {
	size := r.cfg.FaultySize
	row := Row{ID: FigFaultyWrite, Figure: fmt.Sprintf("sequential write %s until durable, Content-MD5 of the whole (%s)", human(size), r.faultyLabel()), Unit: UnitMBps, Target: Target{Min: 0.9}}
	data := randomBytes(size, 4)
	mem, store := r.faultyStore()
	durable := func(name string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			a, err := mem.Stat(ctx, name)
			if err != nil {
				return false, nil
			}
			return a.Size == size, nil
		}
	}
	with := func(label string, upload func(ctx context.Context, name string) error) strategy {
		var name string
		return strategy{label, func() error { name = fmt.Sprintf("direct-%d.bin", r.unique()); return nil }, func(ctx context.Context) error {
			return upload(ctx, name)
		}, func(ctx context.Context) error {
			defer mem.Delete(ctx, name, blobstore.Conditions{})
			if ok, _ := durable(name)(ctx); !ok {
				return fmt.Errorf("%s missing or of the wrong size after the upload", name)
			}
			return nil
		}}
	}
	// blobfs sets every blob's Content-MD5 (of the whole; per block only
	// where the store checks it, Azure): the direct uploads do too, as
	// azcopy --put-md5 does.
	baselines := []strategy{with("1 stream (one Put; the store keeps its MD5)", func(ctx context.Context, name string) error {
		_, err := store.Put(ctx, name, data, blobstore.PutOptions{})
		return err
	})}
	for _, p := range []struct {
		block int64
		conc  int
	}{{4 * MiB, 8}, {8 * MiB, 8}, {8 * MiB, 16},
		// blobfs's own: 4 MiB blocks, and a file being written streams up
		// to twice --upload-concurrency at once. The fake's bandwidth is
		// per stream, so a baseline held to fewer streams than blobfs
		// would lose for that alone.
		{fusefs.DefaultUploadBlockSize, 32}} {
		baselines = append(baselines, with(fmt.Sprintf("StageBlock %s × %d + commit, MD5 of the whole", human(p.block), p.conc), func(ctx context.Context, name string) error {
			return parallelUpload(ctx, store, name, data, p.block, p.conc)
		}))
	}
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		name := fmt.Sprintf("blobfs-%d.bin", r.unique())
		defer mem.Delete(context.Background(), name, blobstore.Conditions{})
		return r.withInProcess(store, func(dir string) (time.Duration, error) {
			r.settle()
			d, err := r.timeUntilDurable(ctx, blobfsName, func(interrupted *int) error {
				return countInterrupted(writeFileFrom(ctx, filepath.Join(dir, name), data), interrupted)
			}, durable(name))
			if err != nil {
				return 0, err
			}
			got := make([]byte, size)
			if _, err := mem.ReadAt(ctx, name, got, 0, ""); err != nil && err != io.EOF {
				return 0, err
			}
			return d, verify(got, data)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "direct", mbps(size), baselines, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, throughput(size), "direct ")
}

// parallelUpload stages data in blocks, conc at a time, and commits them
// with the MD5 of the whole, hashed beside the blocks: what the SDK's
// UploadBuffer does, with azcopy --put-md5's Content-MD5.
func parallelUpload(ctx context.Context, s blobstore.Store, name string, data []byte, block int64, conc int) error {
	whole := make(chan [md5.Size]byte, 1)
	go func() { whole <- md5.Sum(data) }() // beside the blocks
	nonce := blobstore.NewBlockNonce()
	var ids []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for i, off := 0, int64(0); off < int64(len(data)); i, off = i+1, off+block {
		id := blobstore.BlockID(nonce, i)
		ids = append(ids, id)
		end := min(off+block, int64(len(data)))
		g.Go(func() error { return s.StageBlock(gctx, name, id, data[off:end]) })
	}
	sum := <-whole
	if err := g.Wait(); err != nil {
		return err
	}
	_, err := s.CommitBlocks(ctx, name, ids, blobstore.PutOptions{ContentMD5: sum[:]})
	return err
}

// fuseOverhead: sequential read through blobfs over the in-memory store,
// against go-fuse's own server reading a file from memory, both in this
// process: what blobfs's FUSE path costs when the store costs nothing.
func (r *runner) fuseOverhead(ctx context.Context) Row {
	size := r.cfg.Size
	row := Row{ID: FigFUSE, Figure: fmt.Sprintf("FUSE path: sequential read %s from memory", human(size)), Unit: UnitGBps}
	data := r.largeData()
	dst := r.scratchBuf()
	mem := blobstore.NewMemory()
	const name = "file"
	if _, err := mem.Put(ctx, name, data, blobstore.PutOptions{}); err != nil {
		row.Err = err
		return row
	}
	var ref *goFuseMount
	reference := strategy{
		name: "go-fuse fuse.Server, fs.MemRegularFile",
		prepare: func() error {
			clear(dst)
			dir, err := r.newDir("mnt-gofuse")
			if err != nil {
				return err
			}
			ref, err = mountGoFuse(dir, data)
			return err
		},
		run: func(ctx context.Context) error {
			return readFileInto(ctx, filepath.Join(ref.Dir(), name), dst)
		},
		check: func(context.Context) error {
			err := ref.Close()
			if verr := verify(dst, data); verr != nil {
				return verr
			}
			return err
		},
	}
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		return r.withInProcess(mem, func(dir string) (time.Duration, error) {
			clear(dst)
			r.settle()
			start := time.Now()
			if err := readFileInto(ctx, filepath.Join(dir, name), dst); err != nil {
				return 0, err
			}
			d := time.Since(start)
			return d, verify(dst, data)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "reference", gbps(size), []strategy{reference}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	row = r.fill(row, out, func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }, "")
	row.Note = "informational (no target in the issue); blobfs served in-process with default options over blobstore.NewMemory, " +
		"against go-fuse's fuse.Server serving the same bytes from an fs.MemRegularFile, both with 1 MiB requests"
	return row
}

// memory: peak RSS of a `blobfs mount --foreground` process over a local
// directory while a file of MemorySize is streamed through it, against
// --block-cache-mb plus 64 MiB.
func (r *runner) memory(ctx context.Context) Row {
	size, cacheMB := r.cfg.MemorySize, r.cfg.BlockCacheMB
	limitMB := float64(cacheMB + 64)
	row := Row{ID: FigMemory, Figure: fmt.Sprintf("peak RSS streaming %s, --block-cache-mb %d", human(size), cacheMB), Unit: UnitMiB,
		Baseline: limitMB, BaselineName: "--block-cache-mb + 64 MiB", Target: Target{Max: 1}}
	local, err := r.newDir("local")
	if err != nil {
		row.Err = err
		return row
	}
	defer os.RemoveAll(local)
	const name = "big.bin"
	if err := writeRepeated(filepath.Join(local, name), size, randomBytes(min(size, 64*MiB), 5)); err != nil {
		row.Err = err
		return row
	}
	dir, err := r.newDir("mnt-memory")
	if err != nil {
		row.Err = err
		return row
	}
	cache, err := r.newDir("cache-memory")
	if err != nil {
		row.Err = err
		return row
	}
	defer os.RemoveAll(cache)
	argv := append([]string{r.cfg.BlobfsBin, "mount", "--foreground"}, r.cfg.BlobfsArgs...)
	argv = append(argv, "--local-dir", local, "--cache-dir", cache, "--log-level", "warn",
		"--block-cache-mb", fmt.Sprint(cacheMB), dir)
	m, err := startProc(ctx, dir, argv, nil, []string{r.cfg.BlobfsBin, "unmount", dir})
	if err != nil {
		row.Err = err
		return row
	}
	defer m.Close()
	before, _ := procStatus(m.Pid(), "VmRSS:")

	// Sample the server's resident set while streaming, for the note;
	// the figure itself is the kernel's high-water mark.
	stopSampling := sampleRSS(m.Pid())
	r.settle()
	start := time.Now()
	n, err := streamFile(ctx, filepath.Join(dir, name))
	d := time.Since(start)
	sampled := stopSampling()
	if err == nil && n != size {
		err = fmt.Errorf("streamed %d bytes, want %d", n, size)
	}
	if err != nil {
		row.Err = err
		return row
	}
	peak, err := peakRSS(m.Pid())
	if err != nil {
		row.Err = err
		return row
	}
	if err := m.Close(); err != nil {
		row.Err = err
		return row
	}
	row.Blobfs = float64(peak) / MiB
	r.detail("%-13s %-7s blobfs VmHWM %.0f MiB; sampled VmRSS max %.0f MiB, %.0f MiB before streaming; %s at %s",
		row.ID, "", row.Blobfs, float64(sampled)/MiB, float64(before)/MiB, human(size), mbps(size)(d))
	row.Note = fmt.Sprintf("VmHWM of the blobfs process (and any children) over a --local-dir store; RSS was %.0f MiB before streaming, sampled maximum %.0f MiB; streamed at %s",
		float64(before)/MiB, float64(sampled)/MiB, mbps(size)(d))
	return row
}

// writeRepeated writes a file of size bytes made of chunk repeated.
func writeRepeated(path string, size int64, chunk []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	for left := size; left > 0; {
		n := min(left, int64(len(chunk)))
		if _, err := f.Write(chunk[:n]); err != nil {
			f.Close()
			return err
		}
		left -= n
	}
	return f.Close()
}

// streamFile reads path to its end in 1 MiB requests and returns the
// number of bytes.
func streamFile(ctx context.Context, path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, MiB)
	var total int64
	for i := 0; ; i++ {
		if i%256 == 0 && ctx.Err() != nil {
			return total, ctx.Err()
		}
		n, err := f.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// createLatency is the fake store's latency in faultyCreate: Azure's order
// of magnitude for one small request.
const createLatency = 5 * time.Millisecond

// faultyCreate: create, write and close Config.SmallFiles small files
// through blobfs over the fake store with createLatency a request, until
// durable, against one Put per file, serially. On Azurite a Put takes about
// a millisecond, and the FUSE round trips of a create (lookup, create,
// write, flush, release) then weigh as much as the store; at a real
// store's latency they should not.
func (r *runner) faultyCreate(ctx context.Context) Row {
	n, size := r.cfg.SmallFiles, r.cfg.SmallFileSize
	row := Row{ID: FigFaultyCreate, Figure: fmt.Sprintf("create %d × %s files until durable (fake store: %v a request)", n, human(int64(size)), createLatency), Unit: UnitFilesS, Target: Target{Min: 0.9}}
	mem := blobstore.NewMemory()
	store := blobstore.NewFaulty(mem, blobstore.FaultOptions{Seed: 1, Latency: createLatency})
	content := randomBytes(int64(size), 6)
	clean := func(prefix string) {
		for i := range n {
			mem.Delete(context.Background(), fmt.Sprintf("%s/f%05d", prefix, i), blobstore.Conditions{})
		}
		mem.Delete(context.Background(), prefix, blobstore.Conditions{})
	}
	var prefix string
	baseline := strategy{
		name:    "Put × N, serially",
		prepare: func() error { prefix = fmt.Sprintf("direct-%d", r.unique()); return nil },
		run: func(ctx context.Context) error {
			for i := range n {
				if _, err := store.Put(ctx, fmt.Sprintf("%s/f%05d", prefix, i), content, blobstore.PutOptions{}); err != nil {
					return err
				}
			}
			return nil
		},
		check: func(ctx context.Context) error { clean(prefix); return nil },
	}
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		dir := fmt.Sprintf("blobfs-%d", r.unique())
		defer clean(dir)
		return r.withInProcess(store, func(mnt string) (time.Duration, error) {
			if err := os.Mkdir(filepath.Join(mnt, dir), 0o755); err != nil {
				return 0, err
			}
			r.settle()
			before := mem.Requests()
			start := time.Now()
			for i := range n {
				if err := writeFileFrom(ctx, filepath.Join(mnt, dir, fmt.Sprintf("f%05d", i)), content); err != nil {
					return 0, err
				}
			}
			d := time.Since(start)
			used := mem.Requests()
			for op, k := range before {
				used[op] -= k
			}
			r.detail("%-13s blobfs's store requests for %d files: %v", FigFaultyCreate, n, used)
			for i := range n {
				if _, err := mem.Stat(ctx, fmt.Sprintf("%s/f%05d", dir, i)); err != nil {
					return 0, fmt.Errorf("f%05d not in the store after its close: %w", i, err)
				}
			}
			return d, nil
		})
	}}}
	out, err := r.compare(ctx, row.ID, "direct", filesPerSec(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "direct ")
}

// logWrite and logFsyncEvery shape faulty-log: the size of each append,
// and how much is appended between two fsyncs.
const (
	logWrite      = 64 << 10
	logFsyncEvery = 2 * MiB
)

// faultyLog: append half of Config.FaultySize through blobfs over the
// fake in logWrite writes, fsync every logFsyncEvery and close, against
// the best a client of the store can do at the same points of
// durability: stage what was written since the last one as one block and
// commit the list, naming the blocks committed before. Before blobfs kept
// committed blocks (fusefs/upload/stream.go's "Carrying on"), each fsync uploaded
// the whole file again.
func (r *runner) faultyLog(ctx context.Context) Row {
	size := r.cfg.FaultySize / 2
	row := Row{ID: FigFaultyLog, Figure: fmt.Sprintf("append %s in %s writes, fsync every %s, until durable (%s)", human(size), human(logWrite), human(logFsyncEvery), r.faultyLabel()), Unit: UnitMBps, Target: Target{Min: 0.9}}
	data := randomBytes(size, 7)
	mem, store := r.faultyStore()
	check := func(ctx context.Context, name string) error {
		defer mem.Delete(context.Background(), name, blobstore.Conditions{})
		got := make([]byte, size)
		if n, err := mem.ReadAt(ctx, name, got, 0, ""); int64(n) != size || err != nil && err != io.EOF {
			return fmt.Errorf("%s: read %d bytes: %v", name, n, err)
		}
		return verify(got, data)
	}
	var name string
	baseline := strategy{
		name:    "StageBlock of each fsync's bytes + commit",
		prepare: func() error { name = fmt.Sprintf("direct-%d.log", r.unique()); return nil },
		run: func(ctx context.Context) error {
			nonce, h := blobstore.NewBlockNonce(), md5.New()
			var ids []string
			for off := int64(0); off < size; off += logFsyncEvery {
				part := data[off:min(off+logFsyncEvery, size)]
				id := blobstore.BlockID(nonce, len(ids))
				if err := store.StageBlock(ctx, name, id, part); err != nil {
					return err
				}
				ids = append(ids, id)
				h.Write(part)
				if _, err := store.CommitBlocks(ctx, name, ids, blobstore.PutOptions{ContentMD5: h.Sum(nil)}); err != nil {
					return err
				}
			}
			return nil
		},
		check: func(ctx context.Context) error { return check(ctx, name) },
	}
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		name := fmt.Sprintf("blobfs-%d.log", r.unique())
		return r.withInProcess(store, func(mnt string) (time.Duration, error) {
			r.settle()
			before := mem.Requests()
			start := time.Now()
			if err := appendAndFsync(filepath.Join(mnt, name), data, logWrite, logFsyncEvery); err != nil {
				return 0, err
			}
			d := time.Since(start)
			used := mem.Requests()
			for op, k := range before {
				used[op] -= k
			}
			r.detail("%-13s blobfs's store requests for %d fsyncs: %v", FigFaultyLog, (size+logFsyncEvery-1)/logFsyncEvery, used)
			return d, check(ctx, name)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "direct", mbps(size), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, throughput(size), "direct ")
}

// appendAndFsync writes data to a new file at path in writes of chunk
// bytes, fsyncs it after every every bytes, and closes it.
func appendAndFsync(path string, data []byte, chunk, every int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	for off := 0; off < len(data); off += chunk {
		if _, err := f.Write(data[off:min(off+chunk, len(data))]); err != nil {
			f.Close()
			return err
		}
		if end := off + chunk; end%every == 0 || end >= len(data) {
			if err := f.Sync(); err != nil {
				f.Close()
				return err
			}
		}
	}
	return f.Close()
}
