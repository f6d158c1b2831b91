package bench

// The write-back figures: blobfs --write-back against blobfs's durable
// default, each writing the same data through a fresh mount. The row is how
// soon close returns; the details say how soon the data is in the store.

import (
	"context"
	"fmt"
	"os"
	"time"
)

// wbTimes are one repetition's times from the first write: until the last
// close returned, and until the store held everything.
type wbTimes struct{ closed, durable time.Duration }

// writeBackCompare runs write (which writes through the mount at dir) and
// waits for durable on a fresh mount of each mode, Config.Reps times in
// alternating order, and fills row with the best close times.
func (r *runner) writeBackCompare(ctx context.Context, row Row, value func(time.Duration) float64, write func(ctx context.Context, dir string, rep int) error, durable func(ctx context.Context, rep int) (bool, error), cleanup func(rep int)) Row {
	modes := []struct {
		name string
		c    client
	}{
		{"durable", blobfsVariant(&r.cfg, r.az, "blobfs-durable", nil)},
		{"write-back", blobfsVariant(&r.cfg, r.az, blobfsName, []string{"--write-back"})},
	}
	best := map[string]wbTimes{}
	storeCPU := r.storeCPUMeter(row.ID)
	for rep := 1; rep <= r.cfg.Reps; rep++ {
		order := []int{0, 1}
		if rep%2 == 0 {
			order = []int{1, 0}
		}
		for _, i := range order {
			m := modes[i]
			id := rep*2 + i
			var t wbTimes
			used := ""
			_, err := r.withMount(ctx, m.c, func(dir string) (time.Duration, error) {
				r.settle()
				cpu := storeCPU()
				start := time.Now()
				if err := write(ctx, dir, id); err != nil {
					return 0, err
				}
				t.closed = time.Since(start)
				if _, _, err := waitDurable(ctx, func(ctx context.Context) (bool, error) { return durable(ctx, id) }); err != nil {
					return 0, fmt.Errorf("after close: %w", err)
				}
				t.durable = time.Since(start)
				used = cpu(t.durable) // until durable: the uploads are the work
				return t.closed, nil
			})
			cleanup(id)
			if err != nil {
				row.Err = fmt.Errorf("%s: %w", m.name, err)
				return row
			}
			r.detail("%-13s rep %d  %-10s closed %8.3f s  durable %8.3f s%s", row.ID, rep, m.name, t.closed.Seconds(), t.durable.Seconds(), used)
			if b, ok := best[m.name]; !ok || t.closed < b.closed {
				best[m.name] = t
			}
		}
	}
	wb, dur := best["write-back"], best["durable"]
	row.Blobfs, row.Baseline = value(wb.closed), value(dur.closed)
	row.BaselineName = "blobfs durable, close = in the store"
	r.detail("%s: close %.3f s with --write-back, %.3f s durable (%.1f ×); in the store after %.3f s and %.3f s",
		row.ID, wb.closed.Seconds(), dur.closed.Seconds(), dur.closed.Seconds()/wb.closed.Seconds(), wb.durable.Seconds(), dur.durable.Seconds())
	return row
}

// writeBackLarge: one file of Config.Size.
func (r *runner) writeBackLarge(ctx context.Context) Row {
	size := r.cfg.Size
	row := Row{ID: FigWriteBack, Figure: fmt.Sprintf("close of a %s file with --write-back (Azurite)", human(size)), Unit: UnitMBps}
	data := r.largeData()
	name := func(id int) string { return fmt.Sprintf("wb-%d-%d.bin", r.seq.Load(), id) }
	return r.writeBackCompare(ctx, row, throughput(size),
		func(ctx context.Context, dir string, id int) error {
			return writeFileFrom(ctx, joinPath(dir, name(id)), data)
		},
		func(ctx context.Context, id int) (bool, error) {
			n, err := r.az.size(ctx, name(id))
			return n == size, err
		},
		func(id int) { r.az.delete(context.Background(), name(id)) })
}

// writeBackSmall: Config.SmallFiles files of Config.SmallFileSize.
func (r *runner) writeBackSmall(ctx context.Context) Row {
	n := r.cfg.SmallFiles
	row := Row{ID: FigWriteBackSmall, Figure: fmt.Sprintf("create and close %d × %s files with --write-back (Azurite)", n, human(int64(r.cfg.SmallFileSize))), Unit: UnitFilesS}
	content := randomBytes(int64(r.cfg.SmallFileSize), 9)
	dir := func(id int) string { return fmt.Sprintf("wb-small-%d-%d", r.seq.Load(), id) }
	return r.writeBackCompare(ctx, row, rate(n),
		func(ctx context.Context, mnt string, id int) error {
			if err := os.Mkdir(joinPath(mnt, dir(id)), 0o755); err != nil {
				return err
			}
			for i := range n {
				if err := writeFileFrom(ctx, joinPath(mnt, dir(id)+"/"+fmt.Sprintf("f%05d", i)), content); err != nil {
					return err
				}
			}
			return nil
		},
		func(ctx context.Context, id int) (bool, error) {
			c, err := r.az.count(ctx, dir(id)+"/")
			if err == nil && c < n {
				// A listing of 1000 blobs costs Azurite CPU that the
				// uploads being waited for need: not every 10 ms.
				time.Sleep(250 * time.Millisecond)
			}
			return c >= n, err
		},
		func(id int) { r.az.deleteUnder(context.Background(), dir(id)) })
}
