package bench

import (
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// The chart (report.svg) shows each figure as a group of horizontal bars,
// one per client, each the client's value over the figure's baseline: the
// ratio the table reports. The scale is linear from 0, so that a bar's
// length is its ratio and the line at 1 is the baseline; it ends at the
// largest ratio or target, but at most at chartMaxRatio, so that one
// outlier (a cached read 20 times a local file's) does not flatten every
// other bar: a longer bar is cut there and labelled with its ratio. The
// target is a dashed mark across its group. Colours are fixed per client
// name, so that two runs' charts read alike.
//
// A figure that failed, or has no baseline, is listed in words where its
// bars would be, never drawn as a zero; so is a client that failed.

const (
	chartWidth    = 980.0
	chartLabelX   = 12.0  // figure labels
	chartPlotX    = 250.0 // where bars start: ratio 0
	chartPlotW    = 560.0 // up to the axis's end
	chartTop      = 118.0 // the first group
	chartBarH     = 14.0
	chartBarPitch = 19.0
	chartLineH    = 15.0 // a line of a figure's label
	chartGroupGap = 14.0
	chartMaxRatio = 4.0
)

// clientColours are the fixed colours of the clients blobfs-bench knows;
// any other client (a -compare-args variant) takes one of chartPalette by
// a hash of its name.
var clientColours = map[string]string{
	blobfsName:  "#1f77b4",
	"blobfuse2": "#ff7f0e",
	"rclone":    "#2ca02c",
}

var chartPalette = []string{"#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func clientColour(name string) string {
	if c, ok := clientColours[name]; ok {
		return c
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return chartPalette[h.Sum32()%uint32(len(chartPalette))]
}

// chartBar is one client's bar in a figure's group, or, when missing is
// set, the words drawn in its place.
type chartBar struct {
	client  string
	value   float64 // in the row's unit
	ratio   float64
	missing string
}

// chartGroup is one figure: its bars, or, when listed is set, the words
// that say why it has none.
type chartGroup struct {
	row    Row
	bars   []chartBar
	listed string
	labels []chartLabel // the lines beside it: id, values, target
	y, h   float64
}

// chartLabel is a line of text with its SVG presentation attributes.
type chartLabel struct{ text, attrs string }

const (
	chartIDAttrs    = `font-weight="bold"`
	chartNoteAttrs  = `fill="#444" font-size="11"`
	chartUnmetAttrs = `fill="#c00" font-size="11"`
	// A white outline under the words in the plot keeps them readable
	// where they cross the line at 1 or a target.
	chartHaloAttrs = `stroke="#fff" stroke-width="3" paint-order="stroke"`
)

// SVG writes the report as a chart: a standalone SVG document.
func (r *Report) SVG(w io.Writer) error {
	groups := r.chartGroups()
	axisMax := chartAxisMax(groups)
	x := func(ratio float64) float64 { return chartPlotX + math.Min(ratio, axisMax)/axisMax*chartPlotW }

	y := chartTop
	for i := range groups {
		g := &groups[i]
		g.y = y
		g.h = math.Max(float64(len(g.labels))*chartLineH, float64(max(len(g.bars), 1))*chartBarPitch)
		y += g.h + chartGroupGap
	}
	bottom := y - chartGroupGap + 8
	height := bottom + 28

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#fff"/>`+"\n")
	m := r.Machine
	build := m.Blobfs // `blobfs --version`: "blobfs 0.1.0-2293705"
	if build == "" {
		build = "blobfs (version unknown)"
	}
	text(&b, chartLabelX, 22, `font-size="16" font-weight="bold"`,
		fmt.Sprintf("blobfs benchmark, %s", r.Started.UTC().Format("2006-01-02 15:04 UTC")))
	text(&b, chartLabelX, 40, `fill="#444"`, fmt.Sprintf("%d CPUs; %s; Azurite %s; load average %s at start, %s at end; run took %v",
		m.NProc, build, orDash(m.Azurite), orDash(m.LoadStart), orDash(m.LoadEnd), r.Elapsed.Round(time.Second)))
	text(&b, chartLabelX, 56, `fill="#444"`,
		"Each bar: the client's figure / the baseline (the table's ratio). Red dashes: the target (≥ at least, ≤ at most).")
	r.chartLegend(&b, 76)

	// The axis: a grid line and a label every step, the line at 1 darker.
	step := 0.25
	if axisMax > 2 {
		step = 0.5
	}
	for v := 0.0; v <= axisMax+1e-9; v += step {
		if math.Abs(v-1) < 1e-9 {
			continue
		}
		fmt.Fprintf(&b, `<line x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#ddd"/>`+"\n", x(v), chartTop-8, x(v), bottom)
		text(&b, x(v), chartTop-12, `text-anchor="middle" fill="#666" font-size="11"`, trimFloat(v))
	}
	fmt.Fprintf(&b, `<line class="one" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#222" stroke-width="1.5"><title>ratio 1: the baseline</title></line>`+"\n",
		x(1), chartTop-8, x(1), bottom)
	text(&b, x(1), chartTop-12, `text-anchor="middle" font-size="11" font-weight="bold"`, "1 = baseline")
	text(&b, chartPlotX+chartPlotW, bottom+18, `text-anchor="end" fill="#666" font-size="11"`,
		fmt.Sprintf("ratio to the baseline (axis ends at %s)", trimFloat(axisMax)))

	for i, g := range groups {
		if i > 0 {
			fmt.Fprintf(&b, `<line x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#eee"/>`+"\n",
				chartLabelX, g.y-chartGroupGap/2, chartWidth-chartLabelX, g.y-chartGroupGap/2)
		}
		fmt.Fprintf(&b, `<g class="figure" data-figure="%s">`+"\n", esc(g.row.ID))
		fmt.Fprintf(&b, "<title>%s</title>\n", esc(g.row.Figure))
		for j, l := range g.labels {
			text(&b, chartLabelX, g.y+11+float64(j)*chartLineH, l.attrs, l.text)
		}
		if g.listed != "" {
			fill := "#666"
			if g.row.Err != nil {
				fill = "#c00"
			}
			text(&b, chartPlotX+4, g.y+11, fmt.Sprintf(`class="listed" fill="%s" font-style="italic" %s`, fill, chartHaloAttrs), g.listed)
		}
		for j, bar := range g.bars {
			by := g.y + float64(j)*chartBarPitch
			if bar.missing != "" {
				text(&b, chartPlotX+4, by+11, `fill="#666" font-style="italic" `+chartHaloAttrs, bar.client+": "+bar.missing)
				continue
			}
			width := math.Max(x(bar.ratio)-chartPlotX, 1) // a tiny ratio still shows
			fmt.Fprintf(&b, `<rect class="bar" data-figure="%s" data-client="%s" x="%.2f" y="%.2f" width="%.2f" height="%.0f" fill="%s"><title>%s</title></rect>`+"\n",
				esc(g.row.ID), esc(bar.client), chartPlotX, by, width, chartBarH, clientColour(bar.client),
				esc(fmt.Sprintf("%s, %s: %s, %.2f × the baseline %s (%s)", g.row.ID, bar.client, formatValue(bar.value, g.row.Unit),
					bar.ratio, formatValue(g.row.Baseline, g.row.Unit), g.row.BaselineName)))
			label := fmt.Sprintf("%s %.2f", bar.client, bar.ratio)
			if bar.ratio > axisMax {
				label = fmt.Sprintf("%s %.2f (cut at %s)", bar.client, bar.ratio, trimFloat(axisMax))
			}
			text(&b, chartPlotX+width+4, by+11, chartHaloAttrs+` font-size="11"`, label)
		}
		if t := g.row.Target; g.listed == "" && (t.Min > 0 || t.Max > 0) {
			tx := x(math.Max(t.Min, t.Max))
			fmt.Fprintf(&b, `<line class="target" x1="%.2f" y1="%.2f" x2="%.2f" y2="%.2f" stroke="#d62728" stroke-width="2" stroke-dasharray="4 2"><title>target %s</title></line>`+"\n",
				tx, g.y-3, tx, g.y+g.h, esc(t.String()))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// chartGroups lays out each row: its labels, and its bars or why it has
// none.
func (r *Report) chartGroups() []chartGroup {
	var groups []chartGroup
	for _, row := range r.Rows {
		g := chartGroup{row: row, labels: []chartLabel{{row.ID, chartIDAttrs}}}
		switch {
		case row.Err != nil:
			g.listed = "error: " + shorten(oneLine(row.Err), 110)
		case row.Baseline == 0:
			parts := []string{"blobfs " + formatValue(row.Blobfs, row.Unit)}
			for _, name := range r.otherNames(row) {
				if v := row.Others[name]; v == 0 {
					parts = append(parts, name+" failed")
				} else {
					parts = append(parts, name+" "+formatValue(v, row.Unit))
				}
			}
			g.listed = shorten("no baseline (informational): "+strings.Join(parts, "; "), 110)
		default:
			g.labels = append(g.labels, chartLabel{fmt.Sprintf("%s vs %s", formatValue(row.Blobfs, row.Unit), formatValue(row.Baseline, row.Unit)), chartNoteAttrs})
			g.bars = append(g.bars, barOf(blobfsName, row.Blobfs, row.Baseline))
			for _, name := range r.otherNames(row) {
				g.bars = append(g.bars, barOf(name, row.Others[name], row.Baseline))
			}
		}
		switch met, ok := row.Met(); {
		case ok && met:
			g.labels = append(g.labels, chartLabel{"target " + row.Target.String() + ": met", chartNoteAttrs})
		case ok:
			g.labels = append(g.labels, chartLabel{"target " + row.Target.String() + ": not met", chartUnmetAttrs})
		case row.Err == nil && (row.Target.Min > 0 || row.Target.Max > 0):
			g.labels = append(g.labels, chartLabel{"target " + row.Target.String(), chartNoteAttrs})
		}
		groups = append(groups, g)
	}
	return groups
}

func barOf(client string, value, baseline float64) chartBar {
	bar := chartBar{client: client, value: value, ratio: value / baseline}
	switch {
	case value == 0:
		bar.missing = "failed"
	case !finitePositive(bar.ratio):
		bar.missing = fmt.Sprintf("no ratio (%g)", value)
	}
	return bar
}

// chartAxisMax is where the axis ends: past the largest ratio and target
// and 1, rounded up to a grid step, at most chartMaxRatio.
func chartAxisMax(groups []chartGroup) float64 {
	top := 1.0
	for _, g := range groups {
		top = math.Max(top, math.Max(g.row.Target.Min, g.row.Target.Max))
		for _, bar := range g.bars {
			if bar.missing == "" {
				top = math.Max(top, bar.ratio)
			}
		}
	}
	step := 0.25
	if top > 2 {
		step = 0.5
	}
	return math.Min(math.Ceil(top*1.05/step)*step, chartMaxRatio)
}

// chartLegend names each client beside its colour; a client that is not
// installed is named without one.
func (r *Report) chartLegend(b *strings.Builder, y float64) {
	names := []string{blobfsName}
	var absent []string
	for _, cl := range r.Clients {
		if cl.Path == "" {
			absent = append(absent, cl.Name)
		} else {
			names = append(names, cl.Name)
		}
	}
	for _, row := range r.Rows {
		for _, name := range r.otherNames(row) {
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	x := chartLabelX
	for _, name := range names {
		fmt.Fprintf(b, `<rect class="legend" x="%.2f" y="%.2f" width="12" height="12" fill="%s"/>`+"\n", x, y-10, clientColour(name))
		text(b, x+16, y, "", name)
		x += 16 + 7*float64(len(name)) + 18
	}
	if len(absent) > 0 {
		text(b, x, y, `fill="#666"`, "not installed: "+strings.Join(absent, ", "))
	}
}

func text(b *strings.Builder, x, y float64, attrs, s string) {
	fmt.Fprintf(b, `<text x="%.2f" y="%.2f" %s>%s</text>`+"\n", x, y, attrs, esc(s))
}

func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// trimFloat writes a grid value without trailing zeros: 0.5, 1, 1.25.
func trimFloat(v float64) string { return fmt.Sprintf("%g", math.Round(v*1e4)/1e4) }

func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// finitePositive tells whether v can be drawn as a bar's length.
func finitePositive(v float64) bool { return v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) }
