package bench

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Units of Row values.
const (
	UnitMBps   = "MB/s" // 10^6 bytes per second
	UnitGBps   = "GB/s" // 10^9 bytes per second
	UnitFilesS = "files/s"
	UnitIOPS   = "IOPS" // reads per second
	UnitMiB    = "MiB"
)

// Target is what a figure's ratio (blobfs / baseline) must meet: at least
// Min when Min > 0, at most Max when Max > 0. The zero Target is
// informational.
type Target struct{ Min, Max float64 }

func (t Target) String() string {
	switch {
	case t.Min > 0:
		return fmt.Sprintf("≥ %.2f", t.Min)
	case t.Max > 0:
		return fmt.Sprintf("≤ %.2f", t.Max)
	}
	return "—"
}

// Row is one figure's result.
type Row struct {
	ID     string // a figure id (FigSeqRead...)
	Figure string // what was measured, for people
	Unit   string
	// Blobfs and Baseline are in Unit. For throughputs and rates higher
	// is better; for memory the baseline is the allowed maximum.
	Blobfs, Baseline float64
	// BaselineName says what the baseline is: the SDK strategy that won,
	// the reference server, the memory limit.
	BaselineName string
	Target       Target
	// Others holds the other FUSE clients' results (same Unit), keyed by
	// client name; a client that was not measured on this figure is
	// absent.
	Others map[string]float64
	// Note is a remark shown under the table.
	Note string
	// Err is set when the figure could not be measured.
	Err error
}

// Ratio is Blobfs / Baseline (0 when there is no baseline).
func (r Row) Ratio() float64 {
	if r.Baseline == 0 {
		return 0
	}
	return r.Blobfs / r.Baseline
}

// Met tells whether the ratio meets the target; ok is false for an
// informational figure or a failed one.
func (r Row) Met() (met, ok bool) {
	if r.Err != nil || r.Baseline == 0 {
		return false, false
	}
	switch q := r.Ratio(); {
	case r.Target.Min > 0:
		return q >= r.Target.Min, true
	case r.Target.Max > 0:
		return q <= r.Target.Max, true
	}
	return false, false
}

// Machine describes where the run happened.
type Machine struct {
	NProc   int    `json:"nproc"`
	CPU     string `json:"cpu"`
	Kernel  string `json:"kernel"`
	Go      string `json:"go"`      // the toolchain that built the harness
	Blobfs  string `json:"blobfs"`  // `blobfs --version`
	Azurite string `json:"azurite"` // the Server header of the endpoint
	// LoadStart and LoadEnd are /proc/loadavg at start and end: how busy
	// the machine was.
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

// ClientStatus tells whether another FUSE client was found.
type ClientStatus struct {
	Name string `json:"name"`
	Path string `json:"path"` // empty: not installed
}

// Report is a run's result.
type Report struct {
	Machine Machine
	Config  Config
	Clients []ClientStatus // the other FUSE clients, installed or not
	Rows    []Row
	// Details lists every timing behind the table: each SDK strategy
	// tried, each repetition.
	Details []string
	Started time.Time
	Elapsed time.Duration
}

// Err joins the errors of the figures that failed.
func (r *Report) Err() error {
	var errs []error
	for _, row := range r.Rows {
		if row.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", row.ID, row.Err))
		}
	}
	return errors.Join(errs...)
}

// Row returns the row of figure id.
func (r *Report) Row(id string) (Row, bool) {
	for _, row := range r.Rows {
		if row.ID == id {
			return row, true
		}
	}
	return Row{}, false
}

func formatValue(v float64, unit string) string {
	switch unit {
	case UnitGBps:
		return fmt.Sprintf("%.2f %s", v, unit)
	case UnitMiB:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	if v < 10 {
		return fmt.Sprintf("%.1f %s", v, unit)
	}
	return fmt.Sprintf("%.0f %s", v, unit)
}

// Markdown writes the machine description, the table and the details.
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## blobfs benchmark, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "- machine: %d CPUs, %s; kernel %s; %s\n", m.NProc, m.CPU, m.Kernel, m.Go)
	fmt.Fprintf(&b, "- blobfs: %s; Azurite: %s\n", orDash(m.Blobfs), orDash(m.Azurite))
	fmt.Fprintf(&b, "- load average at start: %s; at end: %s\n", m.LoadStart, m.LoadEnd)
	c := r.Config
	fmt.Fprintf(&b, "- sizes: large file %s, %d small files of %s, faulty file %s (latency %v, %s/s per stream), memory file %s with --block-cache-mb %d\n",
		human(c.Size), c.SmallFiles, human(int64(c.SmallFileSize)), human(c.FaultySize), c.FaultyLatency, human(c.FaultyBandwidth), human(c.MemorySize), c.BlockCacheMB)
	fmt.Fprintf(&b, "- method: the fastest SDK strategy of one exploration round is the baseline; then best of %d interleaved repetitions per side (fresh mount each); page cache dropped before timed phases: %v; ratio = blobfs / baseline; run took %v\n",
		c.Reps, c.DropCaches, r.Elapsed.Round(time.Second))
	if c.FreshAzurite != "" {
		b.WriteString("- a fresh Azurite for each Azurite figure (`-fresh-azurite`)\n")
	}
	if c.InProcess {
		b.WriteString("- **diagnostic run**: the Azurite figures' blobfs mount was served in-process, not by the blobfs binary\n")
	}
	if len(c.BlobfsArgs) > 0 {
		fmt.Fprintf(&b, "- extra blobfs mount flags: %s\n", strings.Join(c.BlobfsArgs, " "))
	}
	b.WriteString("\n| figure | blobfs | baseline | ratio | target | met? |")
	for _, cl := range r.Clients {
		fmt.Fprintf(&b, " %s |", cl.Name)
	}
	b.WriteString("\n|---|---:|---:|---:|:---:|:---:|")
	for range r.Clients {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, row := range r.Rows {
		if row.Err != nil {
			fmt.Fprintf(&b, "| %s | error: %s | | | %s | **error** |", row.Figure, oneLine(row.Err), row.Target)
		} else {
			met := "—"
			if ok, applicable := row.Met(); applicable {
				met = "yes"
				if !ok {
					met = "**no**"
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s (%s) | %.2f | %s | %s |", row.Figure, formatValue(row.Blobfs, row.Unit),
				formatValue(row.Baseline, row.Unit), row.BaselineName, row.Ratio(), row.Target, met)
		}
		for _, cl := range r.Clients {
			v, measured := row.Others[cl.Name]
			switch {
			case cl.Path == "":
				b.WriteString(" not installed |")
			case !measured:
				b.WriteString(" — |")
			case v == 0:
				b.WriteString(" failed |")
			case row.Baseline > 0:
				fmt.Fprintf(&b, " %s (%.2f) |", formatValue(v, row.Unit), v/row.Baseline)
			default:
				fmt.Fprintf(&b, " %s |", formatValue(v, row.Unit))
			}
		}
		b.WriteString("\n")
	}
	var notes []string
	for _, row := range r.Rows {
		if row.Note != "" {
			notes = append(notes, fmt.Sprintf("- %s: %s", row.ID, row.Note))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\nNotes:\n" + strings.Join(notes, "\n") + "\n")
	}
	if len(r.Details) > 0 {
		b.WriteString("\n<details><summary>every timing</summary>\n\n```\n")
		b.WriteString(strings.Join(r.Details, "\n"))
		b.WriteString("\n```\n</details>\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// oneLine squeezes an error into a table cell: the SDK's errors span many
// lines, with rulers of dashes and the whole XML body.
func oneLine(err error) string {
	var parts []string
	for _, line := range strings.Split(err.Error(), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.Trim(line, "-") == "" || strings.HasPrefix(line, "<") {
			continue
		}
		parts = append(parts, line)
	}
	s := strings.ReplaceAll(strings.Join(parts, " "), "|", "/")
	if r := []rune(s); len(r) > 240 {
		s = string(r[:240]) + "…"
	}
	return s
}

// human prints a byte count in binary units.
func human(n int64) string {
	switch {
	case n >= GiB && n%GiB == 0:
		return fmt.Sprintf("%d GiB", n/GiB)
	case n >= MiB && n%MiB == 0:
		return fmt.Sprintf("%d MiB", n/MiB)
	case n >= KiB && n%KiB == 0:
		return fmt.Sprintf("%d KiB", n/KiB)
	}
	return fmt.Sprintf("%d B", n)
}

// describeMachine fills in what can be known without the run.
func describeMachine(cfg *Config) Machine {
	endpoint := ""
	if cfg.needsAzurite() {
		endpoint = cfg.Endpoint
	}
	return machineOf(cfg.BlobfsBin, endpoint)
}

// machineOf describes this machine, the blobfs binary at blobfsBin and the
// Azurite at endpoint (either may be empty: not asked).
func machineOf(blobfsBin, endpoint string) Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if blobfsBin != "" {
		if out, err := exec.Command(blobfsBin, "--version").Output(); err == nil {
			m.Blobfs = strings.TrimSpace(string(out))
		}
	}
	if endpoint != "" {
		// Any request gets an answer with the server's name and version.
		hc := &http.Client{Timeout: 5 * time.Second}
		if resp, err := hc.Get(endpoint + "?comp=list"); err == nil {
			m.Azurite = resp.Header.Get("Server")
			resp.Body.Close()
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
