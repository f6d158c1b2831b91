package bench

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// splitSample is sampleReport as .ci/bench.sh makes it: a first run, and a
// second that adds seq-read-warm and write-back and measures small-list
// again (successfully this time), on a machine by then busier, with rclone
// and the variant found.
func splitSample() (earlier, later *Report) {
	earlier, later = sampleReport(), sampleReport()
	pick := func(r *Report, ids ...string) {
		var rows []Row
		for _, row := range r.Rows {
			for _, id := range ids {
				if row.ID == id {
					rows = append(rows, row)
				}
			}
		}
		r.Rows, r.Config.Figures = rows, ids
	}
	pick(earlier, FigSeqRead, FigSmallList, FigMemory)
	earlier.Clients = []ClientStatus{{Name: "blobfuse2", Path: "/usr/bin/blobfuse2"}, {Name: "rclone"}}
	earlier.Details = []string{"first"}
	earlier.Elapsed = 10 * time.Minute

	pick(later, FigSeqReadWarm, FigSmallList, FigWriteBack)
	later.Rows[1] = Row{ID: FigSmallList, Figure: "cold list + stat of 1000 files (Azurite)", Unit: UnitFilesS,
		Blobfs: 3000, Baseline: 5000, BaselineName: "SDK ListBlobsFlat", Target: Target{Min: 0.9}}
	later.Machine.LoadStart, later.Machine.LoadEnd = "3.00 2.00 1.00", "5.60 3.00 2.00"
	later.Details = []string{"second"}
	later.Elapsed = 5 * time.Minute
	later.Started = earlier.Started.Add(11 * time.Minute)
	return earlier, later
}

func TestMergeReports(t *testing.T) {
	earlier, later := splitSample()
	m, err := Merge(earlier, later)
	if err != nil {
		t.Fatal(err)
	}

	var ids []string
	for _, row := range m.Rows {
		ids = append(ids, row.ID)
	}
	if want := []string{FigSeqRead, FigSeqReadWarm, FigSmallList, FigWriteBack, FigMemory}; !reflect.DeepEqual(ids, want) {
		t.Errorf("rows %q, want both runs' in run order %q", ids, want)
	}
	if !reflect.DeepEqual(m.Config.Figures, ids) {
		t.Errorf("figures %q, want %q", m.Config.Figures, ids)
	}
	if row, _ := m.Row(FigSmallList); row.Err != nil || row.Blobfs != 3000 {
		t.Errorf("small-list: %+v, want the second run's measurement", row)
	}
	for _, id := range []string{FigSeqRead, FigMemory} {
		got, _ := m.Row(id)
		if want, _ := earlier.Row(id); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v, want the first run's row", id, got)
		}
	}

	wantMachine := earlier.Machine
	wantMachine.LoadEnd = later.Machine.LoadEnd // the load at the end of both
	if m.Machine != wantMachine {
		t.Errorf("machine %+v, want the first run's, ending with the second's load: %+v", m.Machine, wantMachine)
	}
	if !m.Started.Equal(earlier.Started) || m.Elapsed != 15*time.Minute {
		t.Errorf("started %v, took %v; want %v, 15m0s", m.Started, m.Elapsed, earlier.Started)
	}
	if want := []string{"first", "second"}; !reflect.DeepEqual(m.Details, want) {
		t.Errorf("details %q, want %q", m.Details, want)
	}
	wantClients := []ClientStatus{{Name: "blobfuse2", Path: "/usr/bin/blobfuse2"}, {Name: "rclone", Path: "/usr/bin/rclone"},
		{Name: variantName, Path: "bin/blobfs"}}
	if !reflect.DeepEqual(m.Clients, wantClients) {
		t.Errorf("clients %+v, want %+v", m.Clients, wantClients)
	}

	// Neither input was changed.
	e2, l2 := splitSample()
	if !reflect.DeepEqual(earlier, e2) || !reflect.DeepEqual(later, l2) {
		t.Error("Merge modified its arguments")
	}
}

// TestMergeRefusesOtherRuns: rows measured with other sizes, or by another
// build, cannot join a report whose header describes one of each.
func TestMergeRefusesOtherRuns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Report)
		want   string
	}{
		{"quick run", func(r *Report) { r.Config.Size = 64 * MiB }, "size"},
		{"other build", func(r *Report) { r.Machine.Blobfs = "blobfs 0.4.0-def456" }, "one build"},
		{"other mount flags", func(r *Report) { r.Config.BlobfsArgs = []string{"--readahead-blocks=32"} }, "blobfs args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			earlier, later := splitSample()
			tc.change(later)
			_, err := Merge(earlier, later)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("merged with error %v, want one naming %q", err, tc.want)
			}
		})
	}
	// Empty and absent mount flags are the same run (strings.Fields("")
	// against a report.json read back).
	earlier, later := splitSample()
	earlier.Config.BlobfsArgs, later.Config.BlobfsArgs = nil, []string{}
	if _, err := Merge(earlier, later); err != nil {
		t.Errorf("no flags against empty flags: %v", err)
	}
}
