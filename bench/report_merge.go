package bench

import (
	"fmt"
	"slices"
)

// Merge returns one report of two runs of the same build and
// configuration but different figures: a full `make bench` runs the
// random-read and write-back figures in a second blobfs-bench, on a fresh
// Azurite. It keeps earlier's machine (with later's load average at the
// end), start and clients, and adds later's clients and details. A figure
// in both takes later's row; rows are in run order (FigureIDs), so that a
// report reads the same however its figures were split between runs.
// Neither argument is modified.
func Merge(earlier, later *Report) (*Report, error) {
	if err := earlier.Accepts(later.Config); err != nil {
		return nil, err
	}
	if a, b := earlier.Machine.Blobfs, later.Machine.Blobfs; a != b {
		return nil, fmt.Errorf("bench: merge: blobfs %q and %q: one report describes one build", a, b)
	}
	m := &Report{
		Machine: earlier.Machine,
		Config:  earlier.Config,
		Clients: slices.Clone(earlier.Clients),
		Details: append(slices.Clone(earlier.Details), later.Details...),
		Started: earlier.Started,
		Elapsed: earlier.Elapsed + later.Elapsed,
	}
	m.Machine.LoadEnd = later.Machine.LoadEnd
	m.Config.Figures = nil
	for _, id := range FigureIDs() {
		if slices.Contains(earlier.Config.Figures, id) || slices.Contains(later.Config.Figures, id) {
			m.Config.Figures = append(m.Config.Figures, id)
		}
	}
	for _, cl := range later.Clients {
		switch i := slices.IndexFunc(m.Clients, func(c ClientStatus) bool { return c.Name == cl.Name }); {
		case i < 0:
			m.Clients = append(m.Clients, cl)
		case m.Clients[i].Path == "":
			m.Clients[i] = cl // installed since
		}
	}
	m.Rows = slices.Clone(earlier.Rows)
	for _, row := range later.Rows {
		if i := slices.IndexFunc(m.Rows, func(r Row) bool { return r.ID == row.ID }); i >= 0 {
			m.Rows[i] = row
		} else {
			m.Rows = append(m.Rows, row)
		}
	}
	// A figure this version does not know (a report from another one)
	// goes last, in the order it came.
	order := func(id string) int {
		if i := slices.Index(FigureIDs(), id); i >= 0 {
			return i
		}
		return len(FigureIDs())
	}
	slices.SortStableFunc(m.Rows, func(a, b Row) int { return order(a.ID) - order(b.ID) })
	return m, nil
}

// Accepts tells whether rows measured under cfg can join r's: the report
// has one description of sizes and method above all its rows, so they must
// be the same; only the figures may differ. blobfs-bench asks before a run
// that will be merged, not after it.
func (r *Report) Accepts(cfg Config) error {
	a, b := r.Config, cfg
	for _, d := range []struct {
		what string
		a, b any
	}{
		{"reps", a.Reps, b.Reps},
		{"size", a.Size, b.Size},
		{"small files", a.SmallFiles, b.SmallFiles},
		{"small file size", a.SmallFileSize, b.SmallFileSize},
		{"faulty size", a.FaultySize, b.FaultySize},
		{"faulty latency", a.FaultyLatency, b.FaultyLatency},
		{"faulty bandwidth", a.FaultyBandwidth, b.FaultyBandwidth},
		{"memory size", a.MemorySize, b.MemorySize},
		{"block cache MB", a.BlockCacheMB, b.BlockCacheMB},
		{"mounts", a.Mounts, b.Mounts},
		{"mount file size", a.MountFileSize, b.MountFileSize},
		{"few strategies", a.FewStrategies, b.FewStrategies},
		{"drop caches", a.DropCaches, b.DropCaches},
		{"in-process", a.InProcess, b.InProcess},
		{"blobfs args", fmt.Sprint(a.BlobfsArgs), fmt.Sprint(b.BlobfsArgs)},
		{"compare args", fmt.Sprint(a.CompareArgs), fmt.Sprint(b.CompareArgs)},
	} {
		if d.a != d.b {
			return fmt.Errorf("bench: merge: %s %v in the report, %v in this run: a report's rows share one configuration", d.what, d.a, d.b)
		}
	}
	return nil
}
