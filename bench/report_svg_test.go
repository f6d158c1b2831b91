package bench

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgChart is what the tests read of a chart: its bars, its lines by
// class, and all its text.
type svgChart struct {
	bars    map[[2]string]svgBar // by figure and client
	lines   map[string][]svgLine // by class
	text    string
	hasRoot bool
}

type svgBar struct{ x, width float64 }
type svgLine struct{ x1, x2 float64 }

// parseSVG reads the whole document with encoding/xml, failing the test
// if it is not well-formed XML or a bar or line has a coordinate that is
// not a number.
func parseSVG(t *testing.T, doc string) svgChart {
	t.Helper()
	c := svgChart{bars: map[[2]string]svgBar{}, lines: map[string][]svgLine{}}
	var text strings.Builder
	dec := xml.NewDecoder(strings.NewReader(doc))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("report.svg is not XML: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range tok.Attr {
				attr[a.Name.Local] = a.Value
			}
			num := func(name string) float64 {
				v, err := strconv.ParseFloat(attr[name], 64)
				if err != nil {
					t.Fatalf("<%s> %s=%q: %v", tok.Name.Local, name, attr[name], err)
				}
				return v
			}
			switch {
			case tok.Name.Local == "svg":
				c.hasRoot = tok.Name.Space == "http://www.w3.org/2000/svg"
			case tok.Name.Local == "rect" && attr["class"] == "bar":
				key := [2]string{attr["data-figure"], attr["data-client"]}
				if _, dup := c.bars[key]; dup {
					t.Errorf("two bars for %v", key)
				}
				c.bars[key] = svgBar{x: num("x"), width: num("width")}
			case tok.Name.Local == "line" && attr["class"] != "":
				c.lines[attr["class"]] = append(c.lines[attr["class"]], svgLine{x1: num("x1"), x2: num("x2")})
			}
		case xml.CharData:
			text.Write(tok)
			text.WriteString(" ")
		}
	}
	if !c.hasRoot {
		t.Fatal("report.svg has no <svg> element in the SVG namespace")
	}
	c.text = text.String()
	return c
}

func chartOf(t *testing.T, r *Report) svgChart {
	t.Helper()
	var b strings.Builder
	if err := r.SVG(&b); err != nil {
		t.Fatal(err)
	}
	return parseSVG(t, b.String())
}

// TestReportSVG: one bar per figure and client that has a ratio, each as
// long as its ratio on the scale the line at 1 sets; the targets marked
// there; a failed figure, one without a baseline and a failed client
// said in words, not drawn.
func TestReportSVG(t *testing.T) {
	rep := sampleReport()
	c := chartOf(t, rep)

	ones := c.lines["one"]
	if len(ones) != 1 || ones[0].x1 != ones[0].x2 {
		t.Fatalf("the line at 1: %v, want one vertical line", ones)
	}
	ratios := map[[2]string]float64{
		{FigSeqRead, "blobfs"}:      560.0 / 700,
		{FigSeqRead, "blobfuse2"}:   350.0 / 700,
		{FigWriteBack, "blobfs"}:    276.0 / 120,
		{FigWriteBack, variantName}: 240.0 / 120,
		{FigMemory, "blobfs"}:       256.0 / 320,
	}
	var got, want []string
	for k := range c.bars {
		got = append(got, k[0]+"/"+k[1])
	}
	for k := range ratios {
		want = append(want, k[0]+"/"+k[1])
	}
	slices.Sort(got)
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("bars %q, want %q", got, want)
	}
	for k, bar := range c.bars {
		if !(bar.width > 0) || math.IsInf(bar.width, 0) {
			t.Errorf("bar %v: width %v, want finite and positive", k, bar.width)
			continue
		}
		unit := ones[0].x1 - bar.x // the length of ratio 1
		if want := ratios[k] * unit; math.Abs(bar.width-want) > 0.02 {
			t.Errorf("bar %v: width %.2f, want %.2f for ratio %.2f", k, bar.width, want, ratios[k])
		}
	}

	// seq-read's target (at least 0.9) and memory's (at most 1).
	targets := c.lines["target"]
	if len(targets) != 2 {
		t.Fatalf("%d target marks, want 2 (seq-read, memory): %v", len(targets), targets)
	}
	bar := c.bars[[2]string{FigSeqRead, "blobfs"}]
	if want := bar.x + 0.9*(ones[0].x1-bar.x); math.Abs(targets[0].x1-want) > 0.02 {
		t.Errorf("seq-read's target at x %.2f, want %.2f (ratio 0.9)", targets[0].x1, want)
	}
	if math.Abs(targets[1].x1-ones[0].x1) > 0.02 {
		t.Errorf("memory's target at x %.2f, want the line at 1 (%.2f)", targets[1].x1, ones[0].x1)
	}

	for _, words := range []string{
		"error: list blobs: RESPONSE 503: Server Busy",
		"no baseline (informational): blobfs 820 MB/s; blobfuse2 300 MB/s",
		"rclone: failed",
		"target ≥ 0.90: not met",
		"target ≤ 1.00: met",
	} {
		if !strings.Contains(c.text, words) {
			t.Errorf("the chart does not say %q; its text:\n%s", words, c.text)
		}
	}
}

// TestReportSVGColours: a client's bars have one colour wherever they are,
// in this chart and in another run's with other clients, and different
// clients have different colours.
func TestReportSVGColours(t *testing.T) {
	fills := func(r *Report) map[string]string {
		var b strings.Builder
		if err := r.SVG(&b); err != nil {
			t.Fatal(err)
		}
		byClient := map[string]string{}
		dec := xml.NewDecoder(strings.NewReader(b.String()))
		for {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
				attr := map[string]string{}
				for _, a := range se.Attr {
					attr[a.Name.Local] = a.Value
				}
				if attr["class"] != "bar" {
					continue
				}
				client := attr["data-client"]
				if prev, ok := byClient[client]; ok && prev != attr["fill"] {
					t.Errorf("%s drawn in %s and %s", client, prev, attr["fill"])
				}
				byClient[client] = attr["fill"]
			}
		}
		return byClient
	}
	all := fills(sampleReport())
	seen := map[string]string{}
	for client, fill := range all {
		if other, ok := seen[fill]; ok {
			t.Errorf("%s and %s share the colour %s", client, other, fill)
		}
		seen[fill] = client
	}
	// Another run: blobfuse2 and the variant not measured, blobfs alone.
	alone := sampleReport()
	alone.Clients = nil
	for i := range alone.Rows {
		alone.Rows[i].Others = nil
	}
	if got := fills(alone)["blobfs"]; got != all["blobfs"] {
		t.Errorf("blobfs drawn in %s alone, in %s beside the others", got, all["blobfs"])
	}
}

// TestReportSVGCutsOutliers: a ratio past the axis's end is cut there and
// labelled with its value, so that the other bars keep a readable length.
func TestReportSVGCutsOutliers(t *testing.T) {
	rep := &Report{Rows: []Row{
		{ID: FigSeqReadCached, Unit: UnitMBps, Blobfs: 2000, Baseline: 100, BaselineName: "a local file"},
		{ID: FigSeqRead, Unit: UnitMBps, Blobfs: 50, Baseline: 100, BaselineName: "SDK"},
	}}
	c := chartOf(t, rep)
	one := c.lines["one"][0].x1
	cut, half := c.bars[[2]string{FigSeqReadCached, "blobfs"}], c.bars[[2]string{FigSeqRead, "blobfs"}]
	if want := (one - cut.x) * chartMaxRatio; math.Abs(cut.width-want) > 0.02 {
		t.Errorf("ratio 20 drawn %.2f long, want %.2f (cut at %v)", cut.width, want, chartMaxRatio)
	}
	if want := (one - half.x) * 0.5; math.Abs(half.width-want) > 0.02 {
		t.Errorf("ratio 0.5 drawn %.2f long, want %.2f", half.width, want)
	}
	if !strings.Contains(c.text, "blobfs 20.00 (cut at 4)") {
		t.Errorf("the cut bar is not labelled with its ratio; the chart's text:\n%s", c.text)
	}
}
