package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The variant -compare-args measures beside blobfs, as Run names it.
const variantName = "blobfs --posix-attrs=false"

// sampleReport has the kinds of rows a report holds: a target missed with
// one client measured and one failed, a row without a baseline, a failed
// figure with the SDK's many-line error, a memory figure (target at
// most), and a row with a -compare-args variant above the baseline. Its
// ratios are exact in binary (560/700 is the double nearest 0.8), so that
// the TSV can be written out by hand.
func sampleReport() *Report {
	return &Report{
		Machine: Machine{NProc: 2, CPU: "Test CPU @ 2.0GHz", Kernel: "6.1.0", Go: "go1.26.8", Blobfs: "blobfs 0.4.0-abc123",
			Azurite: "Azurite-Blob/3.34.0", LoadStart: "0.50 0.40 0.30", LoadEnd: "1.90 1.00 0.50"},
		Config: Config{
			Figures: []string{FigSeqRead, FigSeqReadWarm, FigSmallList, FigWriteBack, FigMemory},
			Reps:    3, Size: GiB, SmallFiles: 1000, SmallFileSize: 4 * KiB,
			FaultySize: 256 * MiB, FaultyLatency: 20 * time.Millisecond, FaultyBandwidth: 32 * MiB,
			MemorySize: 4 * GiB, BlockCacheMB: 256, Mounts: 50, MountFileSize: 128 * MiB,
			Others: true, DropCaches: true, FreshAzurite: "./.ci/azurite.sh stop && ./.ci/azurite.sh start",
			CompareArgs: []string{"--posix-attrs=false"},
		},
		Clients: []ClientStatus{{Name: "blobfuse2", Path: "/usr/bin/blobfuse2"}, {Name: "rclone", Path: "/usr/bin/rclone"},
			{Name: variantName, Path: "bin/blobfs"}},
		Rows: []Row{
			{ID: FigSeqRead, Figure: "sequential read 1 GiB (Azurite)", Unit: UnitMBps, Blobfs: 560, Baseline: 700,
				BaselineName: "SDK DownloadBuffer 8 MiB × 16", Target: Target{Min: 0.9},
				Others: map[string]float64{"blobfuse2": 350, "rclone": 0}, Note: "rclone: mount failed"},
			{ID: FigSeqReadWarm, Figure: "sequential read 1 GiB, warm mount (Azurite)", Unit: UnitMBps, Blobfs: 820,
				Others: map[string]float64{"blobfuse2": 300}},
			{ID: FigSmallList, Figure: "cold list + stat of 1000 files (Azurite)", Unit: UnitFilesS, Target: Target{Min: 0.9},
				Err: errors.New("list blobs:\n--------\nRESPONSE 503: Server Busy\n<?xml version=\"1.0\"?><Error/>\n--------")},
			{ID: FigWriteBack, Figure: "close of a 1 GiB file, --write-back", Unit: UnitMBps, Blobfs: 276, Baseline: 120,
				BaselineName: "the durable default", Others: map[string]float64{variantName: 240}},
			{ID: FigMemory, Figure: "peak RSS streaming 4 GiB", Unit: UnitMiB, Blobfs: 256, Baseline: 320,
				BaselineName: "--block-cache-mb\t+ 64 MiB", Target: Target{Max: 1}},
		},
		Details: []string{"seq-read blobfs rep 1: 1.92s", "seq-read SDK rep 1: 1.53s"},
		Started: time.Date(2026, 12, 7, 1, 25, 0, 123456789, time.UTC),
		Elapsed: 9*time.Minute + 12345*time.Millisecond,
	}
}

// TestReportJSONRoundTrip: report.json holds every field of the run that
// the other files are generated from, and reads back to the same report;
// the account key is not in it.
func TestReportJSONRoundTrip(t *testing.T) {
	in := sampleReport()
	in.Config.Key = "the-account-key"
	in.Config.Endpoint = "http://127.0.0.1:10099/devstoreaccount1"
	in.Config.Log = os.Stderr
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("the-account-key")) {
		t.Errorf("report.json holds the account key:\n%s", b)
	}
	var out Report
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	want := sampleReport() // what was measured, without where and how to connect
	if !reflect.DeepEqual(&out, want) {
		t.Errorf("read back:\n%#v\nwant:\n%#v", out, *want)
	}
}

// TestReportJSONDerived: the ratio and whether the target was met are in
// report.json for its readers, null where the table shows a dash.
func TestReportJSONDerived(t *testing.T) {
	b, err := json.Marshal(sampleReport())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []struct {
			ID    string
			Ratio *float64
			Met   *bool
			Error string
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	show := func(ratio *float64, met *bool) string {
		s := "ratio null"
		if ratio != nil {
			s = "ratio " + number(*ratio)
		}
		if met == nil {
			return s + ", met null"
		}
		return s + ", met " + yesNo(*met)
	}
	want := map[string]string{
		FigSeqRead:     "ratio 0.8, met no",
		FigSeqReadWarm: "ratio null, met null",
		FigSmallList:   "ratio null, met null",
		FigWriteBack:   "ratio 2.3, met null",
		FigMemory:      "ratio 0.8, met yes",
	}
	for _, row := range doc.Rows {
		if got := show(row.Ratio, row.Met); got != want[row.ID] {
			t.Errorf("%s: %s, want %s", row.ID, got, want[row.ID])
		}
	}
	if len(doc.Rows) != len(want) {
		t.Errorf("%d rows, want %d", len(doc.Rows), len(want))
	}
	if e := doc.Rows[2].Error; !strings.HasPrefix(e, "list blobs:") || !strings.Contains(e, "RESPONSE 503") {
		t.Errorf("small-list's error %q, want the error's text", e)
	}
}

// TestReportJSONOtherFormat: a report.json of another format is refused,
// not read with its fields misunderstood.
func TestReportJSONOtherFormat(t *testing.T) {
	b, err := json.Marshal(sampleReport())
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"format":1`), []byte(`"format":2`), 1)
	var r Report
	if err := json.Unmarshal(b, &r); err == nil || !strings.Contains(err.Error(), "format 2") {
		t.Errorf("format 2 read with error %v, want a refusal", err)
	}
}

func TestReportTSV(t *testing.T) {
	var b strings.Builder
	if err := sampleReport().TSV(&b); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"id\tclient\tvalue\tunit\tbaseline\tbaseline_name\tratio\ttarget_min\ttarget_max\tmet\terror",
		"seq-read\tblobfs\t560\tMB/s\t700\tSDK DownloadBuffer 8 MiB × 16\t0.8\t0.9\t\tno\t",
		"seq-read\tblobfuse2\t350\tMB/s\t700\tSDK DownloadBuffer 8 MiB × 16\t0.5\t0.9\t\t\t",
		"seq-read\trclone\t\tMB/s\t700\tSDK DownloadBuffer 8 MiB × 16\t\t0.9\t\t\tfailed",
		"seq-read-warm\tblobfs\t820\tMB/s\t\t\t\t\t\t\t",
		"seq-read-warm\tblobfuse2\t300\tMB/s\t\t\t\t\t\t\t",
		"small-list\tblobfs\t\tfiles/s\t\t\t\t0.9\t\t\tlist blobs: RESPONSE 503: Server Busy",
		"write-back\tblobfs\t276\tMB/s\t120\tthe durable default\t2.3\t\t\t\t",
		"write-back\tblobfs --posix-attrs=false\t240\tMB/s\t120\tthe durable default\t2\t\t\t\t",
		// The tab in the baseline's name would have shifted the columns.
		"memory\tblobfs\t256\tMiB\t320\t--block-cache-mb + 64 MiB\t0.8\t\t1\tyes\t",
	}
	got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("report.tsv:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, line := range got {
		if n := strings.Count(line, "\t"); n != 10 {
			t.Errorf("line %d has %d tabs, want 10: %q", i+1, n, line)
		}
	}
}

// TestReportDir: WriteReportDir writes the four files, report.md is the
// Markdown, and ReadReportDir reads the report back.
func TestReportDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bench-report")
	in := sampleReport()
	if err := WriteReportDir(dir, in); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{ReportJSONFile, ReportMarkdownFile, ReportSVGFile, ReportTSVFile}; !reflect.DeepEqual(names, want) {
		t.Errorf("the directory holds %q, want %q (and no temporary file)", names, want)
	}
	var md strings.Builder
	if err := in.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, ReportMarkdownFile)); err != nil || string(b) != md.String() {
		t.Errorf("report.md (%v):\n%s\nwant:\n%s", err, b, md.String())
	}
	out, err := ReadReportDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("read back:\n%#v\nwant:\n%#v", *out, *in)
	}
}
