package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/blobfs/blobfs/mountopt"
)

// TestDocs keeps README.md and docs/*.md true to the code: the links
// resolve, the make targets exist, the reference tables list exactly the
// flags the commands register, the commands shown use flags that exist,
// and the README's first screen gives a fresh machine exactly two
// commands. A flag added without its row in docs/reference.md fails here.
func TestDocs(t *testing.T) {
	docs := readDocs(t)
	t.Run("Links", func(t *testing.T) { checkLinks(t, docs) })
	t.Run("MakeTargets", func(t *testing.T) { checkMakeTargets(t, docs) })
	t.Run("FlagTables", func(t *testing.T) { checkFlagTables(t, docs) })
	t.Run("CommandFlags", func(t *testing.T) { checkCommandFlags(t, docs) })
	t.Run("FirstScreen", func(t *testing.T) { checkFirstScreen(t, docs) })
	t.Run("InstallPath", checkInstallPath)
	t.Run("Metrics", func(t *testing.T) { checkMetrics(t, docs) })
}

// repoRoot is where README.md is: go test runs in the package directory.
const repoRoot = "../.."

// mdFile is a Markdown file split into what the checks need.
type mdFile struct {
	path     string     // relative to repoRoot
	lines    []string   // the whole file
	prose    []string   // lines outside fenced code blocks (index = line)
	code     []codeText // command-like text: fenced lines and inline code spans
	headings []string   // heading texts, outside fenced blocks, in order
}

// codeText is a fenced line or an inline code span, and its line number.
type codeText struct {
	line int
	text string
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

func readDocs(t *testing.T) []*mdFile {
	t.Helper()
	paths := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(more) == 0 {
		t.Fatal("no docs/*.md: the README links its depth there")
	}
	for _, p := range more {
		rel, _ := filepath.Rel(repoRoot, p)
		paths = append(paths, rel)
	}
	var out []*mdFile
	for _, p := range paths {
		out = append(out, parseMarkdown(t, p))
	}
	return out
}

func parseMarkdown(t *testing.T, path string) *mdFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	f := &mdFile{path: path, lines: strings.Split(string(b), "\n")}
	fenced := false
	for i, l := range f.lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			f.prose = append(f.prose, "")
			continue
		}
		if fenced {
			f.prose = append(f.prose, "")
			f.code = append(f.code, codeText{i + 1, l})
			continue
		}
		f.prose = append(f.prose, l)
		if h, ok := heading(l); ok {
			f.headings = append(f.headings, h)
		}
		for _, m := range codeSpan.FindAllStringSubmatch(l, -1) {
			f.code = append(f.code, codeText{i + 1, m[1]})
		}
	}
	return f
}

// heading returns the text of an ATX heading line.
func heading(l string) (string, bool) {
	n := len(l) - len(strings.TrimLeft(l, "#"))
	if n == 0 || n > 6 || len(l) == n || l[n] != ' ' {
		return "", false
	}
	return strings.TrimSpace(l[n:]), true
}

// anchors are the ids GitHub gives a file's headings: lower case, letters,
// digits, '-' and '_' kept, spaces made '-', the rest dropped; a repeated
// id gets -1, -2…
func (f *mdFile) anchors() map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, h := range f.headings {
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			seen[id]++
			id = id + "-" + strconv.Itoa(n)
		} else {
			seen[id] = 1
		}
		ids[id] = true
	}
	return ids
}

var (
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	scheme = regexp.MustCompile(`^[a-z]+:`)
)

func checkLinks(t *testing.T, docs []*mdFile) {
	byPath := map[string]*mdFile{}
	for _, f := range docs {
		byPath[f.path] = f
	}
	n := 0
	for _, f := range docs {
		for i, l := range f.prose {
			for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
				target := m[1]
				if scheme.MatchString(target) {
					continue // https:, mailto:
				}
				n++
				where := f.path + ":" + strconv.Itoa(i+1)
				file, frag, _ := strings.Cut(target, "#")
				dest := f.path
				if file != "" {
					dest = filepath.Clean(filepath.Join(filepath.Dir(f.path), file))
					if _, err := os.Stat(filepath.Join(repoRoot, dest)); err != nil {
						t.Errorf("%s: link %s: %s does not exist", where, target, dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				g := byPath[dest]
				if g == nil {
					if !strings.HasSuffix(dest, ".md") {
						t.Errorf("%s: link %s: an anchor into a file that is not Markdown", where, target)
						continue
					}
					g = parseMarkdown(t, dest)
				}
				if !g.anchors()[frag] {
					t.Errorf("%s: link %s: %s has no heading #%s", where, target, dest, frag)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("found only %d relative links: the link parser is broken", n)
	}
}

// makefileTargets are the rules of the Makefile (not its variables).
func makefileTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	rule := regexp.MustCompile(`^([A-Za-z0-9_-]+(?:\s+[A-Za-z0-9_-]+)*)\s*:([^=]|$)`)
	for _, l := range strings.Split(string(b), "\n") {
		if m := rule.FindStringSubmatch(l); m != nil {
			for _, name := range strings.Fields(m[1]) {
				targets[name] = true
			}
		}
	}
	return targets
}

var makeCall = regexp.MustCompile(`(?:^|[\s;&|(])make((?:\s+[^\s#;&|)]+)+)`)

func checkMakeTargets(t *testing.T, docs []*mdFile) {
	targets := makefileTargets(t)
	n := 0
	for _, f := range docs {
		for _, c := range f.code {
			for _, m := range makeCall.FindAllStringSubmatch(c.text, -1) {
				for _, arg := range strings.Fields(m[1]) {
					if strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") {
						continue // an option or a variable
					}
					n++
					if !targets[arg] {
						t.Errorf("%s:%d: `make %s`: the Makefile has no target %s", f.path, c.line, arg, arg)
					}
					break // what follows is variables and comments
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("found only %d make commands: the parser is broken", n)
	}
}

// commandFlags returns each command's flags (mount, csi, ...) as the
// command tree declares them.
func commandFlags() map[string]*pflag.FlagSet {
	sets := map[string]*pflag.FlagSet{}
	for _, c := range newRootCommand().Commands() {
		sets[c.Name()] = c.Flags()
	}
	return sets
}

func docByPath(t *testing.T, docs []*mdFile, path string) *mdFile {
	t.Helper()
	for _, f := range docs {
		if f.path == path {
			return f
		}
	}
	t.Fatalf("%s is missing", path)
	return nil
}

// tableFirstColumns returns the first cell of every body row of the tables
// in the section whose heading is title.
func tableFirstColumns(t *testing.T, f *mdFile, title string) []string {
	t.Helper()
	in, found := false, false
	var cells []string
	for _, l := range f.prose {
		if h, ok := heading(l); ok {
			in = h == title
			found = found || in
			continue
		}
		if !in || !strings.HasPrefix(l, "|") {
			continue
		}
		cell := strings.TrimSpace(strings.Split(l, "|")[1])
		if strings.Trim(cell, "-: ") == "" {
			continue // the separator row
		}
		cells = append(cells, cell)
	}
	if !found {
		t.Fatalf("%s: no section %q", f.path, title)
	}
	if len(cells) < 2 {
		t.Fatalf("%s, %q: no table (the header row and at least one row)", f.path, title)
	}
	return cells[1:] // past the header row
}

var flagInCode = regexp.MustCompile("`--([a-z0-9-]+)`")

func checkFlagTables(t *testing.T, docs []*mdFile) {
	ref := docByPath(t, docs, "docs/reference.md")
	sets := commandFlags()
	for _, cmd := range []string{"mount", "csi", "registrar", "keeper"} {
		title := "`blobfs " + cmd + "` flags"
		if cmd == "mount" {
			title += " (also `mount.blobfs -o` options)"
		}
		documented := map[string]bool{}
		for _, cell := range tableFirstColumns(t, ref, title) {
			for _, m := range flagInCode.FindAllStringSubmatch(cell, -1) {
				documented[m[1]] = true
				if sets[cmd].Lookup(m[1]) == nil {
					t.Errorf("docs/reference.md, %q: --%s is not a flag of blobfs %s", title, m[1], cmd)
				}
			}
		}
		sets[cmd].VisitAll(func(fl *pflag.Flag) {
			if !documented[fl.Name] {
				t.Errorf("blobfs %s --%s has no row in docs/reference.md, %q", cmd, fl.Name, title)
			}
		})
	}
	// The CSI mount options are exactly the options of mountopt's table
	// that CSI volumes may set (named, or by an alias), and each is a
	// blobfs mount flag.
	documented := map[string]bool{}
	for _, cell := range tableFirstColumns(t, ref, "Mount options of CSI volumes") {
		for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
			o := mountopt.Lookup(strings.ReplaceAll(m[1], "_", "-"))
			if o == nil || !o.CSI {
				t.Errorf("docs/reference.md, mount options of CSI volumes: %s is not a mount option CSI volumes may set (mountopt.Table)", m[1])
				continue
			}
			documented[o.Name] = true
			if sets["mount"].Lookup(o.Name) == nil {
				t.Errorf("docs/reference.md, mount options of CSI volumes: %s is not a blobfs mount flag", m[1])
			}
		}
	}
	for _, o := range mountopt.Table {
		if o.CSI && !documented[o.Name] {
			t.Errorf("mount option %s, which CSI volumes may set, has no row in docs/reference.md, \"Mount options of CSI volumes\"", o.Name)
		}
	}
}

// checkCommandFlags: a command shown in the docs (`blobfs mount --x …`)
// uses only flags its command has.
func checkCommandFlags(t *testing.T, docs []*mdFile) {
	sets := commandFlags()
	cmdLine := regexp.MustCompile(`(?:^|[\s/])blobfs (mount|csi|registrar|keeper)\b([^#|;]*)`)
	flagArg := regexp.MustCompile(`(?:^|\s)--([a-z0-9-]+)`)
	n := 0
	for _, f := range docs {
		for _, c := range f.code {
			for _, m := range cmdLine.FindAllStringSubmatch(c.text, -1) {
				for _, a := range flagArg.FindAllStringSubmatch(m[2], -1) {
					n++
					if sets[m[1]].Lookup(a[1]) == nil {
						t.Errorf("%s:%d: %q: --%s is not a flag of blobfs %s", f.path, c.line, strings.TrimSpace(m[0]), a[1], m[1])
					}
				}
			}
		}
	}
	if n < 5 {
		t.Errorf("found only %d flags in commands: the parser is broken", n)
	}
}

// checkFirstScreen: the README's first code block, within its first 25
// lines, is exactly the two commands for a fresh machine.
func checkFirstScreen(t *testing.T, docs []*mdFile) {
	readme := docByPath(t, docs, "README.md")
	start := -1
	for i, l := range readme.lines {
		if strings.HasPrefix(l, "```") {
			start = i
			break
		}
	}
	if start < 0 || start >= 25 {
		t.Fatalf("README.md: the first code block opens at line %d; want it within the first 25 lines", start+1)
	}
	var cmds []string
	for _, l := range readme.lines[start+1:] {
		if strings.HasPrefix(l, "```") {
			break
		}
		if c, _, _ := strings.Cut(l, "#"); strings.TrimSpace(c) != "" {
			cmds = append(cmds, strings.Join(strings.Fields(c), " "))
		}
	}
	if want := []string{"make demo", "make test"}; !slices.Equal(cmds, want) {
		t.Errorf("README.md: the first code block has %q; want exactly %q", cmds, want)
	}
}

// checkInstallPath: the systemd unit runs blobfs from where `make install`
// puts it (SBINDIR), and that is /sbin, where mount(8) finds mount.blobfs.
func checkInstallPath(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^SBINDIR\s*\?=\s*(\S+)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no SBINDIR ?= default")
	}
	sbin := string(m[1])
	if sbin != "/sbin" {
		t.Errorf("Makefile: SBINDIR %s; mount(8) looks for mount.blobfs in /sbin", sbin)
	}
	unit, err := os.ReadFile(filepath.Join(repoRoot, "deploy/systemd/blobfs@.service"))
	if err != nil {
		t.Fatal(err)
	}
	var bins []string
	for _, e := range regexp.MustCompile(`(?m)^Exec\w*=-?(\S*blobfs)\s`).FindAllSubmatch(unit, -1) {
		bins = append(bins, string(e[1]))
	}
	if len(bins) == 0 {
		t.Fatal("blobfs@.service: no Exec line runs blobfs")
	}
	for _, b := range bins {
		if b != sbin+"/blobfs" {
			t.Errorf("blobfs@.service runs %s; make install puts blobfs in %s/blobfs", b, sbin)
		}
	}
}

var (
	// A metric's name where the code defines it: an Opts Name or a Desc.
	metricDefined = regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(blobfs_[a-z0-9_]+)"`)
	metricInCode  = regexp.MustCompile("`(blobfs_[a-z0-9_]+)`")
	metricInExpr  = regexp.MustCompile(`blobfs_[a-z0-9_]+`)
)

// checkMetrics: the metrics table of docs/reference.md names exactly the
// metrics the code defines, and the Grafana dashboard in deploy/ uses only
// those (a renamed metric would leave a panel empty).
func checkMetrics(t *testing.T, docs []*mdFile) {
	defined := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.Contains(path, "/bench/") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricDefined.FindAllSubmatch(b, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 10 {
		t.Fatalf("found only %d metric definitions in the code: %v", len(defined), defined)
	}
	documented := map[string]bool{}
	for _, cell := range tableFirstColumns(t, docByPath(t, docs, "docs/reference.md"), "Metrics") {
		for _, m := range metricInCode.FindAllStringSubmatch(cell, -1) {
			documented[m[1]] = true
		}
	}
	for name := range defined {
		if !documented[name] {
			t.Errorf("metric %s is not in the table of docs/reference.md#metrics", name)
		}
	}
	for name := range documented {
		if !defined[name] {
			t.Errorf("docs/reference.md#metrics lists %s, which no code defines", name)
		}
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/blobfs-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/blobfs-dashboard.json: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, name := range metricInExpr.FindAllString(q.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && defined[b] {
						base = b
					}
				}
				if !defined[base] {
					t.Errorf("dashboard panel %q queries %s, which no code defines", p.Title, name)
				}
			}
		}
	}
}
