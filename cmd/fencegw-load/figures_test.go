package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// quotedFigure is a figure as docs quote one: a rate, or a ratio ("0.84×";
// "5 × the session check" is arithmetic, not a figure).
var quotedFigure = regexp.MustCompile(`([0-9][0-9,]*(?:\.[0-9]+)?)(?:\s?(?:req/s|grants/s|acquisitions/s)|×)`)

// Every doc quotes its figures from the one table (docs/figures.json, one
// run of fencegw-load -figures on one commit): README.md and
// docs/benchmarks.md hold its rendering, byte for byte, and no rate or
// ratio quoted in README.md or docs/ is missing from it, except in a
// history table, marked as such (<!-- history --> … <!-- /history -->), and
// in code blocks.
func TestDocsQuoteOnlyTheFigures(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "docs", "figures.json"))
	if err != nil {
		t.Fatalf("the one table: %v (make it with fencegw-load -figures docs/figures.json: docs/benchmarks.md says how)", err)
	}
	var f Figures
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("docs/figures.json: %v", err)
	}
	if len(f.Writes) != len(figureSetups) || len(f.Grants) != 2 || f.Commit == "" {
		t.Fatalf("docs/figures.json is not a whole run: %d write rows (want %d), %d grant rows (want 2), commit %q", len(f.Writes), len(figureSetups), len(f.Grants), f.Commit)
	}
	want := f.Render()
	for _, doc := range figureDocs {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := blockOf(string(text))
		if !ok {
			t.Errorf("%s has no figures block", doc)
			continue
		}
		if got != want {
			t.Errorf("%s's figures block is not the rendering of docs/figures.json (run fencegw-load -figures again, or restore it)", doc)
		}
	}
	known := f.figureNumbers()
	paths, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	paths = append(paths, filepath.Join(root, "README.md"))
	for _, p := range paths {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range quotedFigures(string(text)) {
			if !known[q[1]] {
				t.Errorf("%s quotes %q, which is not in the one table (docs/figures.json); quote the table, or move it to a history table", strings.TrimPrefix(p, root+"/"), q[0])
			}
		}
	}
}

// quotedFigures finds the figures text quotes outside the figures block,
// history tables and code blocks.
func quotedFigures(text string) [][]string {
	var out [][]string
	skip := false
	inCode := false
	for line := range strings.SplitSeq(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			inCode = !inCode
			continue
		case trimmed == figuresBegin || trimmed == historyBegin:
			skip = true
			continue
		case trimmed == figuresEnd || trimmed == historyEnd:
			skip = false
			continue
		}
		if skip || inCode || strings.HasPrefix(line, "    ") {
			continue
		}
		out = append(out, quotedFigure.FindAllStringSubmatch(line, -1)...)
	}
	return out
}

const (
	historyBegin = "<!-- history -->"
	historyEnd   = "<!-- /history -->"
)

// The rendering is put between the markers, and found there again.
func TestFiguresBlockRoundTrip(t *testing.T) {
	f := Figures{Commit: "abc1234", Command: "fencegw-load -figures x", Writers: 32, Machine: "m",
		Writes: []Figure{{Setup: "direct", PerSecond: 15573.4, P50US: 1781}, {Setup: "fasthttp", PerSecond: 6905, ServerCPUUS: 84.9},
			{Setup: "gateway", PerSecond: 5611, ServerCPUUS: 148.1, LoneAddedUS: 61}, {Setup: "nginx", PerSecond: 7654, ServerCPUUS: 70.5}},
		Grants: []Figure{{Setup: "gateway", PerSecond: 8000, ServerCPUUS: 100}, {Setup: "etcd", PerSecond: 2000, ServerCPUUS: 400}}}
	text := "intro\n" + figuresBegin + "\nold\n" + figuresEnd + "\nafter 0.81× 15,573 req/s\n"
	text, err := replaceBlock(text, f.Render())
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := blockOf(text); !ok || got != f.Render() {
		t.Fatalf("block %q", got)
	}
	r := f.Render()
	for _, want := range []string{"| 15,573 |", "| 148.1 |", "0.81×, 1.74×", "**4.00×**", "0.73×, 2.10×"} {
		if !strings.Contains(r, want) {
			t.Errorf("rendering lacks %q:\n%s", want, r)
		}
	}
	known := f.figureNumbers()
	var missing []string
	for _, q := range quotedFigures(text) {
		if !known[q[1]] {
			missing = append(missing, q[0])
		}
	}
	if q := quotedFigures("5 × the session check, 64 × 100\n"); len(q) != 0 {
		t.Fatalf("arithmetic is not a quoted figure: %v", q)
	}
	if len(missing) != 0 || len(quotedFigures(text)) != 2 {
		t.Fatalf("quoted figures outside the block: %v missing; %v found", missing, quotedFigures(text))
	}
	if q := quotedFigures("x\n" + historyBegin + "\n| 9.99× |\n" + historyEnd + "\n```\n1.23×\n```\n    4.56×\n"); len(q) != 0 {
		t.Fatalf("history, code and indented blocks are not quotes: %v", q)
	}
}

// The gateway's CPU ÷ the ceiling's is taken round by round, from each
// round's slice of both, and rendered with its median; a setup without a
// process of its own, or with a round of no answers, gives none.
func TestRoundRatios(t *testing.T) {
	gw := &merged{rounds: []slice{{100, 3 * time.Millisecond}, {200, 5 * time.Millisecond}, {100, 2 * time.Millisecond}}}
	fh := &merged{rounds: []slice{{100, 2 * time.Millisecond}, {100, 2 * time.Millisecond}, {50, time.Millisecond}}}
	got := roundRatios(gw, fh)
	want := []float64{1.5, 1.25, 1}
	if len(got) != len(want) {
		t.Fatalf("roundRatios = %v, want %v", got, want)
	}
	for i := range want {
		if d := got[i] - want[i]; d > 1e-9 || d < -1e-9 {
			t.Fatalf("roundRatios = %v, want %v", got, want)
		}
	}
	inline := &merged{rounds: []slice{{100, 0}, {100, 0}, {100, 0}}}
	if r := roundRatios(inline, fh); r != nil {
		t.Errorf("an in-process setup: %v, want none", r)
	}
	if r := roundRatios(gw, &merged{rounds: fh.rounds[:2]}); r != nil {
		t.Errorf("rounds that do not pair: %v, want none", r)
	}
	if r := roundRatios(&merged{rounds: []slice{{0, time.Millisecond}, {1, time.Millisecond}, {1, time.Millisecond}}}, fh); r != nil {
		t.Errorf("a round with no answers: %v, want none", r)
	}
	f := Figures{Commit: "abc1234", Writers: 32, RoundCPURatios: got, Rounds: 3, RoundSeconds: 2}
	r := f.Render()
	if !strings.Contains(r, "Round by round (3 rounds, each setup 2 s a round, the setups in turn), fencegw's server CPU per write ÷ the ceiling's: 1.50×, 1.25×, 1.00× (median 1.25×).") {
		t.Errorf("rendering lacks the rounds:\n%s", r)
	}
	f.RoundCPURatios = []float64{1.2, 1.1, 1.4, 1.0}
	if r := f.Render(); !strings.Contains(r, "(median 1.15×)") {
		t.Errorf("an even number of rounds: the median is the mean of the middle two:\n%s", r)
	}
}

// A table is refused when the program was built from code other than the
// tree's head: the gateway it runs is its own build's.
func TestStaleBuildIsRefused(t *testing.T) {
	changed := func(from, to string) bool { return from != "docs-only" }
	for _, c := range []struct {
		built, head string
		refused     bool
	}{
		{"a1", "a1", false},
		{"", "a1", false},          // built without its revision (go run)
		{"a1", "", false},          // no git
		{"docs-only", "b2", false}, // the head differs in documents only
		{"a1", "b2", true},
	} {
		err := staleBuild(c.built, c.head, changed)
		if (err != nil) != c.refused {
			t.Errorf("built %q, head %q: %v; want refused %v", c.built, c.head, err, c.refused)
		}
	}
	// Against the repository itself: a commit is its own code, and a
	// commit git does not know is a change.
	if codeChanged("HEAD", "HEAD") {
		t.Error("the head differs from itself")
	}
	if !codeChanged("0000000000000000000000000000000000000000", "HEAD") {
		t.Error("an unknown commit is not taken for a change")
	}
}

// A run renders the docs only when it wrote the repository's own
// docs/figures.json (by any path to it): a run that writes its numbers
// elsewhere is a trial and leaves the docs as they are.
func TestOnlyTheDocsFiguresAreRendered(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"docs/figures.json", "trial.json"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root)
	for path, want := range map[string]bool{
		"docs/figures.json":                      true,
		"./docs/../docs/figures.json":            true,
		filepath.Join(root, "docs/figures.json"): true,
		"trial.json":                             false,
		filepath.Join(root, "trial.json"):        false,
		"docs/absent.json":                       false,
	} {
		if got := rendersDocs(path); got != want {
			t.Errorf("rendersDocs(%q) = %v, want %v", path, got, want)
		}
	}
}
