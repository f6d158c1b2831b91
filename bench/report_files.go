package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A report directory (blobfs-bench -report-dir, make bench) holds one
// report in four files, all generated from the Report:
//
//   - report.json: the whole run, machine-readable; the one file read back
//     (ReadReportDir), to merge a later run into it or to compare runs.
//   - report.tsv: one line per figure and client, for a spreadsheet or awk.
//   - report.md: the Markdown of Report.Markdown.
//   - report.svg: the chart of Report.SVG.
const (
	ReportJSONFile     = "report.json"
	ReportTSVFile      = "report.tsv"
	ReportMarkdownFile = "report.md"
	ReportSVGFile      = "report.svg"
)

// reportFormat is report.json's version; a reader refuses any other, since
// a field read under the wrong meaning would compare runs wrongly.
const reportFormat = 1

// reportJSON is report.json's layout. Ratio and met are derived from the
// other fields: written for readers of the file, ignored when read.
type reportJSON struct {
	Format  int            `json:"format"`
	Started time.Time      `json:"started"`
	Elapsed string         `json:"elapsed"`
	Machine Machine        `json:"machine"`
	Config  configJSON     `json:"config"`
	Clients []ClientStatus `json:"clients"`
	Rows    []rowJSON      `json:"rows"`
	Details []string       `json:"details,omitempty"`
}

// configJSON is the part of a Config that says what was measured: sizes,
// repetitions, method. The endpoint, the key (a secret), the work
// directory and the binary's path are left out: they say where, not what.
type configJSON struct {
	Figures         []string `json:"figures"`
	Reps            int      `json:"reps"`
	Size            int64    `json:"size"`
	SmallFiles      int      `json:"small_files"`
	SmallFileSize   int      `json:"small_file_size"`
	FaultySize      int64    `json:"faulty_size"`
	FaultyLatency   string   `json:"faulty_latency"`
	FaultyBandwidth int64    `json:"faulty_bandwidth"`
	MemorySize      int64    `json:"memory_size"`
	BlockCacheMB    int64    `json:"block_cache_mb"`
	Mounts          int      `json:"mounts"`
	MountFileSize   int64    `json:"mount_file_size"`
	FewStrategies   bool     `json:"few_strategies"`
	Others          bool     `json:"others"`
	DropCaches      bool     `json:"drop_caches"`
	InProcess       bool     `json:"in_process"`
	FreshAzurite    string   `json:"fresh_azurite,omitempty"`
	BlobfsArgs      []string `json:"blobfs_args,omitempty"`
	CompareArgs     []string `json:"compare_args,omitempty"`
}

type rowJSON struct {
	ID           string             `json:"id"`
	Figure       string             `json:"figure"`
	Unit         string             `json:"unit"`
	Blobfs       float64            `json:"blobfs"`
	Baseline     float64            `json:"baseline"`
	BaselineName string             `json:"baseline_name"`
	Ratio        *float64           `json:"ratio"` // null: no baseline, or failed
	Target       targetJSON         `json:"target"`
	Met          *bool              `json:"met"` // null: informational, or failed
	Others       map[string]float64 `json:"others,omitempty"`
	Note         string             `json:"note,omitempty"`
	Error        string             `json:"error,omitempty"`
}

type targetJSON struct {
	Min float64 `json:"min,omitempty"`
	Max float64 `json:"max,omitempty"`
}

// MarshalJSON writes report.json's layout.
func (r *Report) MarshalJSON() ([]byte, error) {
	c := r.Config
	out := reportJSON{
		Format:  reportFormat,
		Started: r.Started.UTC(),
		Elapsed: r.Elapsed.String(),
		Machine: r.Machine,
		Config: configJSON{
			Figures: c.Figures, Reps: c.Reps, Size: c.Size, SmallFiles: c.SmallFiles, SmallFileSize: c.SmallFileSize,
			FaultySize: c.FaultySize, FaultyLatency: c.FaultyLatency.String(), FaultyBandwidth: c.FaultyBandwidth,
			MemorySize: c.MemorySize, BlockCacheMB: c.BlockCacheMB, Mounts: c.Mounts, MountFileSize: c.MountFileSize,
			FewStrategies: c.FewStrategies, Others: c.Others, DropCaches: c.DropCaches, InProcess: c.InProcess,
			FreshAzurite: c.FreshAzurite, BlobfsArgs: c.BlobfsArgs, CompareArgs: c.CompareArgs,
		},
		Clients: r.Clients,
		Rows:    make([]rowJSON, 0, len(r.Rows)),
		Details: r.Details,
	}
	for _, row := range r.Rows {
		rj := rowJSON{
			ID: row.ID, Figure: row.Figure, Unit: row.Unit, Blobfs: row.Blobfs, Baseline: row.Baseline,
			BaselineName: row.BaselineName, Target: targetJSON(row.Target), Others: row.Others, Note: row.Note,
		}
		if row.Err != nil {
			rj.Error = row.Err.Error()
		} else if row.Baseline != 0 {
			q := row.Ratio()
			rj.Ratio = &q
		}
		if met, ok := row.Met(); ok {
			rj.Met = &met
		}
		out.Rows = append(out.Rows, rj)
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads report.json's layout. A row's error comes back as
// its text only.
func (r *Report) UnmarshalJSON(b []byte) error {
	var in reportJSON
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	if in.Format != reportFormat {
		return fmt.Errorf("report format %d: this blobfs-bench reads format %d", in.Format, reportFormat)
	}
	elapsed, err := time.ParseDuration(in.Elapsed)
	if err != nil {
		return fmt.Errorf("report elapsed: %w", err)
	}
	c := in.Config
	latency, err := time.ParseDuration(c.FaultyLatency)
	if err != nil {
		return fmt.Errorf("report config faulty_latency: %w", err)
	}
	*r = Report{
		Machine: in.Machine,
		Config: Config{
			Figures: c.Figures, Reps: c.Reps, Size: c.Size, SmallFiles: c.SmallFiles, SmallFileSize: c.SmallFileSize,
			FaultySize: c.FaultySize, FaultyLatency: latency, FaultyBandwidth: c.FaultyBandwidth,
			MemorySize: c.MemorySize, BlockCacheMB: c.BlockCacheMB, Mounts: c.Mounts, MountFileSize: c.MountFileSize,
			FewStrategies: c.FewStrategies, Others: c.Others, DropCaches: c.DropCaches, InProcess: c.InProcess,
			FreshAzurite: c.FreshAzurite, BlobfsArgs: c.BlobfsArgs, CompareArgs: c.CompareArgs,
		},
		Clients: in.Clients,
		Details: in.Details,
		Started: in.Started,
		Elapsed: elapsed,
	}
	for _, rj := range in.Rows {
		row := Row{
			ID: rj.ID, Figure: rj.Figure, Unit: rj.Unit, Blobfs: rj.Blobfs, Baseline: rj.Baseline,
			BaselineName: rj.BaselineName, Target: Target(rj.Target), Others: rj.Others, Note: rj.Note,
		}
		if rj.Error != "" {
			row.Err = errors.New(rj.Error)
		}
		r.Rows = append(r.Rows, row)
	}
	return nil
}

// TSV writes one line per figure and client after a header line: blobfs
// first, then the other clients in the report's order. A value is empty
// when it was not measured (the error column says why); a ratio is empty
// without a baseline. Numbers are written in full, for comparing runs.
func (r *Report) TSV(w io.Writer) error {
	var b strings.Builder
	b.WriteString("id\tclient\tvalue\tunit\tbaseline\tbaseline_name\tratio\ttarget_min\ttarget_max\tmet\terror\n")
	line := func(row Row, client, value, ratio, met, errText string) {
		fields := []string{row.ID, client, value, row.Unit, number(row.Baseline), row.BaselineName, ratio,
			number(row.Target.Min), number(row.Target.Max), met, errText}
		for i, f := range fields {
			fields[i] = strings.Join(strings.FieldsFunc(f, func(c rune) bool { return c == '\t' || c == '\n' || c == '\r' }), " ")
		}
		b.WriteString(strings.Join(fields, "\t") + "\n")
	}
	for _, row := range r.Rows {
		switch met, applicable := row.Met(); {
		case row.Err != nil:
			line(row, blobfsName, "", "", "", oneLine(row.Err))
		case !applicable:
			line(row, blobfsName, number(row.Blobfs), ratioOf(row.Blobfs, row.Baseline), "", "")
		default:
			line(row, blobfsName, number(row.Blobfs), ratioOf(row.Blobfs, row.Baseline), yesNo(met), "")
		}
		for _, name := range r.otherNames(row) {
			if v := row.Others[name]; v == 0 {
				line(row, name, "", "", "", "failed")
			} else {
				line(row, name, number(v), ratioOf(v, row.Baseline), "", "")
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// otherNames returns the other clients measured on row: in the report's
// client order, then any the report does not list, by name.
func (r *Report) otherNames(row Row) []string {
	var names []string
	for _, cl := range r.Clients {
		if _, ok := row.Others[cl.Name]; ok {
			names = append(names, cl.Name)
		}
	}
	var unlisted []string
	for name := range row.Others {
		if !slices.Contains(names, name) {
			unlisted = append(unlisted, name)
		}
	}
	slices.Sort(unlisted)
	return append(names, unlisted...)
}

// number writes v exactly, and 0 as empty: in a Row, 0 means "none".
func number(v float64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func ratioOf(v, baseline float64) string {
	if baseline == 0 {
		return ""
	}
	return number(v / baseline)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteReportDir writes the report's four files into dir, creating it.
// Each file is replaced whole (a temporary file renamed over it), so that
// an interrupted write never leaves a truncated report.json for a later
// run to merge into.
func WriteReportDir(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	jsonOf := func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{ReportJSONFile, jsonOf},
		{ReportTSVFile, r.TSV},
		{ReportMarkdownFile, r.Markdown},
		{ReportSVGFile, r.SVG},
	} {
		if err := replaceFile(filepath.Join(dir, f.name), f.write); err != nil {
			return fmt.Errorf("report %s: %w", f.name, err)
		}
	}
	return nil
}

// ReadReportDir reads the report.json of a report directory.
func ReadReportDir(dir string) (*Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, ReportJSONFile))
	if err != nil {
		return nil, err
	}
	r := new(Report)
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ReportJSONFile), err)
	}
	return r, nil
}

// replaceFile writes path through a temporary file beside it, synced
// before it is renamed over path.
func replaceFile(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	err = write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file 0600; a report is for anyone to read.
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
