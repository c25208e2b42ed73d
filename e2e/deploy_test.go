package e2e

// deploy/: the Grafana dashboard and the alert rules query only metrics
// that a real gateway exports.

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fencegw/fencegw/gateway"
)

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

// metricNames returns the metric names a PromQL expression selects (the
// identifiers that are not functions, aggregations, keywords, labels or
// Grafana variables).
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, "")
	e = promRanges.ReplaceAllString(e, "")
	e = promGrouping.ReplaceAllString(e, "")
	e = regexp.MustCompile(`\$\w+`).ReplaceAllString(e, "")
	e = regexp.MustCompile(`\b\d[\d.eE+-]*\b`).ReplaceAllString(e, "")
	var out []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || slices.Contains(promKeywords, strings.ToLower(m)) {
			continue
		}
		out = append(out, m)
	}
	return out
}

func TestMetricNamesOfPromQL(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le) (rate(fencegw_forward_duration_seconds_bucket{job=~"$job",x="a b(c)"}[$__rate_interval]))) / on(instance) up or abs(fencegw_holder_clock_offset_seconds) > 2`)
	want := []string{"fencegw_forward_duration_seconds_bucket", "up", "fencegw_holder_clock_offset_seconds"}
	if !slices.Equal(got, want) {
		t.Fatalf("metricNames = %q, want %q", got, want)
	}
}

// exported returns the metric names at base's /metrics, with their types.
func exported(t *testing.T, base string) map[string]string {
	t.Helper()
	a := do(t, "GET", base+"/metrics", nil)
	out := map[string]string{}
	for line := range strings.SplitSeq(string(a.Body), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = f[3]
		}
	}
	return out
}

// exists reports whether name is a series of one of the exported metrics.
func exists(types map[string]string, name string) bool {
	if _, ok := types[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if typ := types[base]; typ == "histogram" || typ == "summary" {
				return true
			}
		}
	}
	return false
}

func TestGrafanaDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	up := newUpstream(t)
	d := startDashboard(t, map[string]string{"up": up.URL})
	// Every kind of series present: a clock report, a forwarded write.
	if a := do(t, "POST", d.URL+"/v1/leases", map[string]any{"resource": "r:1", "holder": "w-1", "ttl_ms": 60000},
		gateway.HeaderClientTime, time.Now().UTC().Format(time.RFC3339Nano)); a.Status != 201 {
		t.Fatalf("acquire: %d %s", a.Status, a.Body)
	}
	types := exported(t, d.URL)

	raw, err := os.ReadFile("../deploy/grafana/fencegw.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			GridPos struct {
				X, Y, W, H int
			} `json:"gridPos"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("deploy/grafana/fencegw.json is not valid JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard lacks uid, title or panels")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if p.ID == 0 || ids[p.ID] || p.Type == "" || p.Title == "" || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %d %q: needs a unique id, a type, a title and a place on the 24-column grid", p.ID, p.Title)
		}
		ids[p.ID] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			queries++
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: query refIds must be unique and set", p.Title)
			}
			refs[q.RefID] = true
			for _, v := range regexp.MustCompile(`\$(\w+)`).FindAllStringSubmatch(q.Expr, -1) {
				if !vars[v[1]] {
					t.Errorf("panel %q uses $%s, which the dashboard does not define", p.Title, v[1])
				}
			}
			names := metricNames(q.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q selects no metric", p.Title, q.Expr)
			}
			for _, n := range names {
				if !exists(types, n) {
					t.Errorf("panel %q queries %s, which the gateway does not export", p.Title, n)
				}
			}
		}
	}

	raw, err = os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			for _, n := range metricNames(r.Expr) {
				if n != "up" && !exists(types, n) { // up is Prometheus's own
					t.Errorf("alert %s queries %s, which the gateway does not export", r.Alert, n)
				}
			}
		}
	}
	t.Logf("%d dashboard queries in %d panels and %d alert rules checked against %d exported metrics", queries, len(dash.Panels), alerts, len(types))
}
