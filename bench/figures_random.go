package bench

// The random-read figures: 4 KiB preads at random offsets of one large
// blob, from several threads at once, as `fio --rw=randread --bs=4k
// --numjobs=4` does, through a blobfs mount with a disk cache.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"golang.org/x/sync/errgroup"
)

const (
	randJobs     = 4 // threads reading at once
	randReadSize = 4096
	// Reads per thread: cold reads cost a round trip to the store each,
	// warm ones a disk read; each figure takes a few seconds.
	randPerJobCold = 1000
	randPerJobWarm = 20000
)

// randOffsets are the offsets each job reads, the same for every side of a
// figure: 4 KiB-aligned, anywhere in a blob of size bytes.
func randOffsets(size int64, perJob int) [][]int64 {
	offs := make([][]int64, randJobs)
	for j := range offs {
		rng := rand.New(rand.NewPCG(uint64(j), 42))
		offs[j] = make([]int64, perJob)
		for i := range offs[j] {
			offs[j][i] = rng.Int64N(size/randReadSize) * randReadSize
		}
	}
	return offs
}

// randomReads reads offs (one list per job, each job on a descriptor of
// its own) from the file at path and checks every read against want.
func randomReads(ctx context.Context, path string, offs [][]int64, want []byte) (time.Duration, error) {
	files := make([]*os.File, len(offs))
	for j := range files {
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		files[j] = f
	}
	start := time.Now()
	g, ctx := errgroup.WithContext(ctx)
	for j, f := range files {
		g.Go(func() error {
			buf := make([]byte, randReadSize)
			for _, off := range offs[j] {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				n, err := f.ReadAt(buf, off)
				if err != nil && err != io.EOF {
					return fmt.Errorf("pread at %d: %w", off, err)
				}
				if !bytes.Equal(buf[:n], want[off:min(off+randReadSize, int64(len(want)))]) {
					return fmt.Errorf("pread at %d: wrong content", off)
				}
			}
			return nil
		})
	}
	err := g.Wait()
	return time.Since(start), err
}

// randDiskCacheArgs are the blobfs flags of the random-read figures: a
// read-only mount with a disk cache that holds the blob with room to spare
// (files of up to a quarter of it are fetched whole).
func (r *runner) randDiskCacheArgs() []string {
	return []string{"--read-only", "--disk-cache-mb", fmt.Sprint(max(4*r.cfg.Size>>20, 1024))}
}

func iops(n int) func(time.Duration) string {
	return func(d time.Duration) string { return formatValue(float64(n)/d.Seconds(), UnitIOPS) }
}

// randRead: random 4 KiB reads on a fresh mount (cold: nothing cached),
// against the SDK doing the same reads as 4 KiB ranged GETs from as many
// threads. blobfs answers the first reads with 64 KiB ranged GETs while it
// fetches the whole file into its disk cache behind them.
func (r *runner) randRead(ctx context.Context) Row {
	size := r.cfg.Size
	n := randJobs * randPerJobCold
	row := Row{ID: FigRandRead, Figure: fmt.Sprintf("random 4 KiB reads of %s, %d threads, cold (Azurite)", human(size), randJobs), Unit: UnitIOPS, Target: Target{Min: 1}}
	data := r.largeData()
	name := fmt.Sprintf("rand-%d.bin", r.unique())
	if err := r.az.uploadFast(ctx, name, data); err != nil {
		row.Err = fmt.Errorf("upload %s: %w", name, err)
		return row
	}
	defer r.az.delete(context.Background(), name)
	offs := randOffsets(size, randPerJobCold)
	b := r.az.client.NewBlobClient(name)
	baseline := strategy{
		name: fmt.Sprintf("4 KiB ranged GETs, %d threads", randJobs),
		run: func(ctx context.Context) error {
			g, ctx := errgroup.WithContext(ctx)
			for j := range offs {
				g.Go(func() error {
					buf := make([]byte, randReadSize)
					for _, off := range offs[j] {
						resp, err := b.DownloadStream(ctx, &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: randReadSize}})
						if err != nil {
							return err
						}
						_, err = io.ReadFull(resp.Body, buf)
						resp.Body.Close()
						if err != nil {
							return err
						}
						if !bytes.Equal(buf, data[off:off+randReadSize]) {
							return fmt.Errorf("GET at %d: wrong content", off)
						}
					}
					return nil
				})
			}
			return g.Wait()
		},
	}
	blobfs := blobfsVariant(&r.cfg, r.az, blobfsName, r.randDiskCacheArgs())
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		return r.withMount(ctx, blobfs, func(dir string) (time.Duration, error) {
			r.settle()
			return randomReads(ctx, joinPath(dir, name), offs, data)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "SDK", iops(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "SDK ")
}

// randReadWarm: the reads of randRead once the file is whole in the disk
// cache (read through once, untimed) and the page cache dropped, against
// the same reads of a copy of the file on the local disk. On the read-only
// mount the file is opened with FUSE passthrough: the kernel reads the
// cache file itself.
func (r *runner) randReadWarm(ctx context.Context) Row {
	size := r.cfg.Size
	n := randJobs * randPerJobWarm
	row := Row{ID: FigRandReadWarm, Figure: fmt.Sprintf("random 4 KiB reads of %s, %d threads, file in the disk cache (Azurite)", human(size), randJobs), Unit: UnitIOPS, Target: Target{Min: 0.9}}
	data := r.largeData()
	name, local, cleanup, err := r.blobAndLocalCopy(ctx, "rand-warm", data)
	if err != nil {
		row.Err = err
		return row
	}
	defer cleanup()
	offs := randOffsets(size, randPerJobWarm)
	baseline := strategy{
		name:    "the same reads of a local file",
		prepare: func() error { r.settle(); return nil },
		run: func(ctx context.Context) error {
			_, err := randomReads(ctx, local, offs, data)
			return err
		},
	}
	blobfs := blobfsVariant(&r.cfg, r.az, blobfsName, r.randDiskCacheArgs())
	contenders := []side{{name: blobfsName, run: func(ctx context.Context) (time.Duration, error) {
		return r.withMount(ctx, blobfs, func(dir string) (time.Duration, error) {
			path := joinPath(dir, name)
			if _, err := r.timedRead(ctx, path, r.scratchBuf(), data); err != nil {
				return 0, err
			}
			r.settle()
			return randomReads(ctx, path, offs, data)
		})
	}}}
	out, err := r.compare(ctx, row.ID, "local", iops(n), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	return r.fill(row, out, rate(n), "")
}

// seqReadCached: a sequential read of a file whole in the disk cache, page
// cache dropped, against the same read of a copy on the local disk. On a
// read-only mount the open is FUSE passthrough; the read-write mount's
// time (reads through blobfs from the cache file) is in the details.
func (r *runner) seqReadCached(ctx context.Context) Row {
	size := r.cfg.Size
	row := Row{ID: FigSeqReadCached, Figure: fmt.Sprintf("sequential re-read %s, file in the disk cache (Azurite)", human(size)), Unit: UnitMBps, Target: Target{Min: 0.9}}
	data := r.largeData()
	name, local, cleanup, err := r.blobAndLocalCopy(ctx, "cached", data)
	if err != nil {
		row.Err = err
		return row
	}
	defer cleanup()
	dst := r.scratchBuf()
	baseline := strategy{
		name: "the same read of a local file",
		run: func(ctx context.Context) error {
			_, err := r.timedRead(ctx, local, dst, data)
			return err
		},
	}
	reread := func(c client) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			return r.withMount(ctx, c, func(dir string) (time.Duration, error) {
				path := joinPath(dir, name)
				if _, err := r.timedRead(ctx, path, dst, data); err != nil {
					return 0, err
				}
				// The first handle's release reaches blobfs after
				// close: until then the file is not passthrough.
				time.Sleep(500 * time.Millisecond)
				return r.timedRead(ctx, path, dst, data)
			})
		}
	}
	readWrite := []string{"--disk-cache-mb", fmt.Sprint(max(4*size>>20, 1024))}
	contenders := []side{
		{name: blobfsName, run: reread(blobfsVariant(&r.cfg, r.az, blobfsName, r.randDiskCacheArgs()))},
		{name: "blobfs read-write (no passthrough)", optional: true, run: reread(blobfsVariant(&r.cfg, r.az, "blobfs-rw", readWrite))},
	}
	out, err := r.compare(ctx, row.ID, "local", mbps(size), []strategy{baseline}, contenders)
	if err != nil {
		row.Err = err
		return row
	}
	if d, ok := out.times["blobfs read-write (no passthrough)"]; ok {
		r.detail("%s: without passthrough (read-write mount, reads from the cache file through blobfs) %.0f MB/s, %.2f × the local file",
			row.ID, throughput(size)(d), out.baselineTime.Seconds()/d.Seconds())
	}
	return r.fill(row, out, throughput(size), "")
}

// blobAndLocalCopy uploads data as a new blob and writes the same bytes to
// a local file, for figures that compare a read through blobfs with the
// same read of a local file. cleanup deletes both.
func (r *runner) blobAndLocalCopy(ctx context.Context, prefix string, data []byte) (name, local string, cleanup func(), err error) {
	name = fmt.Sprintf("%s-%d.bin", prefix, r.unique())
	if err := r.az.uploadFast(ctx, name, data); err != nil {
		return "", "", nil, fmt.Errorf("upload %s: %w", name, err)
	}
	local = filepath.Join(r.work, name)
	if err := os.WriteFile(local, data, 0o644); err != nil {
		r.az.delete(context.Background(), name)
		return "", "", nil, err
	}
	return name, local, func() {
		r.az.delete(context.Background(), name)
		os.Remove(local)
	}, nil
}
