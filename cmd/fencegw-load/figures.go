package main

// The one table of figures: -figures FILE measures, in one invocation on
// one commit, what every doc quotes (fenced writes beside the fasthttp
// ceiling, the bare httputil.ReverseProxy, nginx, HAProxy, Caddy and the
// upstream directly; one lone client's added p50; grants beside etcd's lock
// acquisitions; memory per resource), writes the raw numbers to FILE
// (docs/figures.json) and renders them into the marked blocks of README.md
// and docs/benchmarks.md. TestDocsQuoteOnlyTheFigures fails when a doc
// quotes a figure that is not in the table, or a block is not its rendering.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
)

// figureSetups are the setups of the one table, in its order.
var figureSetups = []string{"direct", "fasthttp", "bare-proxy", "gateway", "nginx", "haproxy", "caddy"}

// Figures is docs/figures.json.
type Figures struct {
	Commit  string    `json:"commit"`
	At      time.Time `json:"at"`
	Command string    `json:"command"`
	Machine string    `json:"machine"`
	Writers int       `json:"writers"`
	Writes  []Figure  `json:"writes"`
	Grants  []Figure  `json:"grants"`
	// GrantSeconds is how long the grants, and etcd's acquisitions, were
	// measured (each).
	GrantSeconds float64 `json:"grant_seconds,omitempty"`
	// AnonBytesPerResource is how much the gateway's anonymous memory grew
	// per fresh resource granted (-figures-resources of them).
	AnonBytesPerResource float64 `json:"anon_bytes_per_resource"`
	Resources            int     `json:"resources"`
	// RoundCPURatios are the gateway's server CPU per write ÷ the fasthttp
	// ceiling's, round by round (roundRatios): the spread the quotient of
	// the whole run hides.
	RoundCPURatios []float64 `json:"round_cpu_ratios,omitempty"`
	// Rounds is -rounds; RoundSeconds each setup's slice of a round.
	Rounds       int     `json:"rounds,omitempty"`
	RoundSeconds float64 `json:"round_seconds,omitempty"`
}

// grantTime says how long the grants were measured, if the run recorded it.
func grantTime(seconds float64) string {
	if seconds <= 0 {
		return ""
	}
	return ", " + strconv.FormatFloat(seconds, 'f', -1, 64) + " s each"
}

// Figure is one row: a setup's rate (req/s or grants/s), latencies in µs,
// server CPU per request in µs (0: not measured), and for writes the p50
// that one lone client sees added over the upstream directly.
type Figure struct {
	Setup       string  `json:"setup"`
	PerSecond   float64 `json:"per_second"`
	P50US       float64 `json:"p50_us"`
	P99US       float64 `json:"p99_us"`
	ServerCPUUS float64 `json:"server_cpu_us"`
	LoneAddedUS float64 `json:"lone_p50_added_us,omitempty"`
}

func runFigures(ctx context.Context, o options, args []string, out io.Writer) error {
	if o.etcdLocks == "" {
		return errors.New("-figures needs -etcd-locks (grants are quoted beside etcd's)")
	}
	if err := staleBuild(buildRevision(), headRevision(), codeChanged); err != nil {
		return err
	}
	f := Figures{At: time.Now().UTC(), Command: "fencegw-load " + strings.Join(args, " "), Writers: o.concurrency, Machine: machine()}
	f.Commit = commit()
	w := o
	w.setups = figureSetups
	fmt.Fprintf(out, "== writes, %d writers\n", w.concurrency)
	setups, results, err := measureWrites(ctx, w, out)
	if err != nil {
		return err
	}
	printWrites(out, setups, results)
	rows := writeRows(setups, results)
	f.RoundCPURatios = roundRatios(results["gateway"], results["fasthttp"])
	f.Rounds, f.RoundSeconds = w.rounds, (w.duration / time.Duration(w.rounds)).Seconds()
	lone := w
	lone.concurrency = 1
	fmt.Fprintln(out, "== writes, 1 writer")
	lsetups, lresults, err := measureWrites(ctx, lone, out)
	if err != nil {
		return err
	}
	printWrites(out, lsetups, lresults)
	lrows := map[string]writeRow{}
	for _, r := range writeRows(lsetups, lresults) {
		lrows[r.setup] = r
	}
	for _, r := range rows {
		if r.errors > 0 || lrows[r.setup].errors > 0 {
			return fmt.Errorf("%s: writes failed", r.setup)
		}
		f.Writes = append(f.Writes, Figure{Setup: r.setup, PerSecond: r.rate, P50US: µs(r.sum.P50), P99US: µs(r.sum.P99), ServerCPUUS: r.server,
			LoneAddedUS: µs(lrows[r.setup].sum.P50 - lrows["direct"].sum.P50)})
	}
	fmt.Fprintln(out, "== grants")
	grants := o
	grants.grants = true
	grants.duration = o.grantsDuration
	f.GrantSeconds = o.grantsDuration.Seconds()
	g, err := measureGrants(ctx, grants, out)
	if err != nil {
		return err
	}
	if g.etcdErr != nil {
		return g.etcdErr
	}
	if g.etcd.Errors > 0 {
		// A figure beside a peer that failed some acquisitions is not
		// the peer's honest rate: measure again.
		return fmt.Errorf("%d etcd acquisitions failed; first: %s", g.etcd.Errors, g.etcd.FirstError)
	}
	if g.gateway.Errors > 0 {
		return fmt.Errorf("%d grants failed; first: %w", g.gateway.Errors, g.gateway.FirstErr)
	}
	f.Grants = []Figure{
		{Setup: "gateway", PerSecond: g.gateway.PerSecond(), P50US: µs(g.gateway.Latency.P50), P99US: µs(g.gateway.Latency.P99), ServerCPUUS: µs(g.gatewayCPU)},
		{Setup: "etcd", PerSecond: g.etcd.PerSecond, P50US: g.etcd.P50US, P99US: g.etcd.P99US, ServerCPUUS: µs(g.etcd.ServerCPU)},
	}
	f.AnonBytesPerResource, f.Resources = g.anonPerResource, int(g.anonResources)
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.figures, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(out, "wrote "+o.figures)
	fmt.Fprintln(out, f.Render())
	if !rendersDocs(o.figures) {
		fmt.Fprintln(out, "not rendered into "+strings.Join(figureDocs, " and ")+": "+o.figures+" is not docs/figures.json, whose numbers they quote (a trial run)")
		return nil
	}
	for _, doc := range figureDocs {
		if err := f.renderInto(doc); err != nil {
			return err
		}
		fmt.Fprintln(out, "rendered into "+doc)
	}
	return nil
}

func µs(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rendersDocs reports whether a run that wrote its figures to path renders
// them into figureDocs: only when path is the repository's own
// docs/figures.json, whose numbers the docs must quote (TestDocsQuoteOnlyTheFigures).
// A run that writes them elsewhere is a trial, and leaves the docs as they are.
func rendersDocs(path string) bool {
	a, err := os.Stat(path)
	if err != nil {
		return false
	}
	b, err := os.Stat(filepath.Join("docs", "figures.json"))
	return err == nil && os.SameFile(a, b)
}

// figureDocs are the docs that hold the rendered table, relative to the
// repository's root.
var figureDocs = []string{"README.md", "docs/benchmarks.md"}

// The rendered table stands between these lines in each of figureDocs.
const (
	figuresBegin = "<!-- figures: rendered from docs/figures.json by fencegw-load -figures; do not edit -->"
	figuresEnd   = "<!-- /figures -->"
)

func (f Figures) renderInto(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text, err := replaceBlock(string(b), f.Render())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// replaceBlock puts block between the markers of text.
func replaceBlock(text, block string) (string, error) {
	i := strings.Index(text, figuresBegin)
	j := strings.Index(text, figuresEnd)
	if i < 0 || j < i {
		return "", errors.New("no figures block (" + figuresBegin + " … " + figuresEnd + ")")
	}
	return text[:i+len(figuresBegin)] + "\n" + block + text[j:], nil
}

// blockOf returns what stands between the markers of text.
func blockOf(text string) (string, bool) {
	i := strings.Index(text, figuresBegin)
	j := strings.Index(text, figuresEnd)
	if i < 0 || j < i {
		return "", false
	}
	return text[i+len(figuresBegin)+1 : j], true
}

var setupLabels = map[string]string{
	"direct":     "the upstream directly",
	"fasthttp":   "`fasthttp`: a bare fasthttp reverse proxy, no fence (the ceiling of a Go proxy)",
	"bare-proxy": "a bare `httputil.ReverseProxy`",
	"gateway":    "**fencegw**, a fenced write (embedded store)",
	"nginx":      "nginx",
	"haproxy":    "HAProxy",
	"caddy":      "Caddy",
}

// Render is the table as markdown, the same for the same figures.
func (f Figures) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "One run of `%s` on build %s, %s UTC, %s.\n\n", f.Command, f.Commit, f.At.Format("2006-01-02 15:04"), f.Machine)
	by := map[string]Figure{}
	for _, w := range f.Writes {
		by[w.Setup] = w
	}
	ratio := func(a, b float64) string {
		if a <= 0 || b <= 0 {
			return ""
		}
		return fmtRatio(a / b)
	}
	fmt.Fprintf(&b, "| fenced writes, %d writers, %s | req/s | p50 µs | p99 µs | server CPU µs/req | ÷ fasthttp: req/s, CPU | ÷ nginx: req/s, CPU | 1 client: p50 added over direct, µs |\n", f.Writers, "256 B bodies")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, w := range f.Writes {
		cpu, rf, rn := "—", "", ""
		if w.ServerCPUUS > 0 {
			cpu = fmtFloat(w.ServerCPUUS, 1)
		}
		if w.Setup != "direct" {
			rf = ratio(w.PerSecond, by["fasthttp"].PerSecond) + ", " + ratio(w.ServerCPUUS, by["fasthttp"].ServerCPUUS)
			rn = ratio(w.PerSecond, by["nginx"].PerSecond) + ", " + ratio(w.ServerCPUUS, by["nginx"].ServerCPUUS)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", setupLabels[w.Setup], fmtFloat(w.PerSecond, 0), fmtFloat(w.P50US, 0), fmtFloat(w.P99US, 0),
			cpu, rf, rn, fmtFloat(w.LoneAddedUS, 0))
	}
	if len(f.RoundCPURatios) > 1 {
		ratios := make([]string, len(f.RoundCPURatios))
		for i, r := range f.RoundCPURatios {
			ratios[i] = fmtRatio(r)
		}
		sorted := slices.Sorted(slices.Values(f.RoundCPURatios))
		fmt.Fprintf(&b, "\nRound by round (%d rounds, each setup %s s a round, the setups in turn), fencegw's server CPU per write ÷ the ceiling's: %s (median %s).\n",
			len(ratios), strconv.FormatFloat(f.RoundSeconds, 'f', -1, 64), strings.Join(ratios, ", "), fmtRatio(median(sorted)))
	}
	b.WriteString("\n| grants, 64 acquirers on fresh resources" + grantTime(f.GrantSeconds) + " | grants/s | p50 µs | p99 µs | server CPU µs/grant |\n|---|---:|---:|---:|---:|\n")
	labels := map[string]string{"gateway": "**fencegw** grants through HTTP (embedded store)", "etcd": "etcd lock acquisitions (LeaseGrant + put-if-absent, one member)"}
	for _, g := range f.Grants {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", labels[g.Setup], fmtFloat(g.PerSecond, 0), fmtFloat(g.P50US, 0), fmtFloat(g.P99US, 0), fmtFloat(g.ServerCPUUS, 1))
	}
	if len(f.Grants) == 2 {
		fmt.Fprintf(&b, "\nfencegw's grants ÷ etcd's acquisitions: **%s**. The gateway's anonymous memory grew by %s B per fresh resource granted (%s MB per million), over %s resources.\n",
			ratio(f.Grants[0].PerSecond, f.Grants[1].PerSecond), fmtFloat(f.AnonBytesPerResource, 0), fmtFloat(f.AnonBytesPerResource, 0), fmtFloat(float64(f.Resources), 0))
	}
	return b.String()
}

// median is the median of sorted, which is not empty.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// fmtFloat formats v with prec decimals and thousands separators.
func fmtFloat(v float64, prec int) string {
	s := strconv.FormatFloat(v, 'f', prec, 64)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, _ := strings.Cut(s, ".")
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	if frac != "" {
		whole += "." + frac
	}
	return sign + whole
}

func fmtRatio(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }

// figureNumbers are every number the rendered table shows, as shown.
func (f Figures) figureNumbers() map[string]bool {
	out := map[string]bool{}
	for _, m := range numberPattern.FindAllString(f.Render(), -1) {
		out[m] = true
	}
	return out
}

var numberPattern = regexp.MustCompile(`[0-9][0-9,]*(?:\.[0-9]+)?`)

// commit names the checked-out commit, marked dirty if the tree differs.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if err := exec.Command("git", "diff", "--quiet", "HEAD", "--", ".", ":!docs/figures.json", ":!README.md", ":!docs/benchmarks.md").Run(); err != nil {
		c += " (with uncommitted changes)"
	}
	return c
}

// staleBuild refuses a table whose gateway is not the checked-out code:
// the gateway the table measures is this program's own (fencegw-load
// -serve gateway), built from the revision built, while the table is named
// after the tree's head. A head that differs from built in documents only
// (codeChanged false) runs the same code. Either revision unknown (a
// program built without it, as by go run; no git) is let through.
func staleBuild(built, head string, codeChanged func(from, to string) bool) error {
	if built == "" || head == "" || built == head || !codeChanged(built, head) {
		return nil
	}
	return fmt.Errorf("this fencegw-load was built from %.12s, and the code at the tree's head %.12s differs: the table would measure the older gateway under the newer name; rebuild it (go build -o /tmp/fencegw-load ./cmd/fencegw-load) and run it again", built, head)
}

// codeChanged reports whether anything but the documents differs between
// two commits (or git cannot tell).
func codeChanged(from, to string) bool {
	return exec.Command("git", "diff", "--quiet", from, to, "--", ":(top)", ":(top,exclude)*.md", ":(top,exclude)docs/figures.json").Run() != nil
}

// buildRevision is the commit this program was built from, "" if unknown.
func buildRevision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

// headRevision is the checked-out commit, "" if unknown.
func headRevision() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// machine describes this machine in a few words.
func machine() string {
	var model string
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = ", load average " + strings.Fields(string(b))[0] + " at the end"
	}
	return fmt.Sprintf("%d CPUs (%s), GOMAXPROCS=%d%s", runtime.NumCPU(), model, runtime.GOMAXPROCS(0), load)
}
