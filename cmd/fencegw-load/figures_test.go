package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
