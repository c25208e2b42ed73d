package web

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fencegw/fencegw/tokens"
)

// fakeSource is an in-memory Source.
type fakeSource struct {
	now     time.Time
	rejs    []tokens.Rejection // oldest first; IDs increasing
	events  []tokens.Event     // oldest first
	leases  []tokens.Lease
	res     map[string]tokens.Resource
	calls   int
	callsMu sync.Mutex
}

func (f *fakeSource) Now() time.Time { return f.now }

func (f *fakeSource) Rejections(_ context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error) {
	f.callsMu.Lock()
	f.calls++
	f.callsMu.Unlock()
	var out []tokens.Rejection
	for i := len(f.rejs) - 1; i >= 0 && len(out) < q.Limit; i-- {
		r := f.rejs[i]
		if (q.Resource != "" && r.Resource != q.Resource) || (q.Before > 0 && r.ID >= q.Before) {
			continue
		}
		if !q.Since.IsZero() && r.At.Before(q.Since) {
			break
		}
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeSource) History(_ context.Context, resource string, limit int) ([]tokens.Event, error) {
	var out []tokens.Event
	for i := len(f.events) - 1; i >= 0 && len(out) < limit; i-- {
		if f.events[i].Resource == resource {
			out = append(out, f.events[i])
		}
	}
	return out, nil
}

func (f *fakeSource) CurrentLeases(context.Context, int) ([]tokens.Lease, error) {
	return f.leases, nil
}

func (f *fakeSource) Resource(_ context.Context, name string) (tokens.Resource, error) {
	if err := tokens.DefaultLimits.ValidateResource(name); err != nil {
		return tokens.Resource{}, err
	}
	r, ok := f.res[name]
	if !ok {
		return tokens.Resource{}, &tokens.Error{Kind: tokens.ErrNotFound}
	}
	return r, nil
}

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Result(), string(body)
}

// incident is the classic story on resource stmt:acct:88213.
func incident() *fakeSource {
	t0 := time.Date(2026, 3, 1, 0, 41, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	const res = "stmt:acct:88213"
	l34 := tokens.Lease{ID: "fl_secretsecretsecret34", Resource: res, Holder: "worker-5", Token: 34, GrantedAt: t0.Add(40 * time.Second), ExpiresAt: now.Add(20 * time.Second)}
	return &fakeSource{
		now: now,
		events: []tokens.Event{
			{At: t0, Resource: res, Kind: tokens.EventGranted, Token: 33, Holder: "worker-3", ExpiresAt: t0.Add(27 * time.Second)},
			{At: t0.Add(10 * time.Second), Resource: res, Kind: tokens.EventRenewed, Token: 33, Holder: "worker-3", ExpiresAt: t0.Add(37 * time.Second)},
			{At: t0.Add(40 * time.Second), Resource: res, Kind: tokens.EventGranted, Token: 34, Holder: "worker-5", ExpiresAt: l34.ExpiresAt},
		},
		rejs: []tokens.Rejection{
			{ID: 1, At: t0.Add(52 * time.Second), Resource: res, Code: tokens.CodeStaleToken, Token: 33, CurrentToken: 34, Holder: "<script>alert(1)</script>", Method: "POST", Upstream: "statements", Path: "/lines", LeaseEndedAt: t0.Add(37 * time.Second)},
			{ID: 2, At: t0.Add(53 * time.Second), Resource: res, Code: tokens.CodeStaleToken, Token: 33, CurrentToken: 34, Holder: "<script>alert(1)</script>", Method: "POST", Upstream: "statements", Path: "/lines", LeaseEndedAt: t0.Add(37 * time.Second)},
		},
		leases: []tokens.Lease{l34},
		res:    map[string]tokens.Resource{res: {Name: res, Token: 34, Lease: &l34, Now: now}},
	}
}

func TestOverviewEscapesAndHidesSecrets(t *testing.T) {
	src := incident()
	counts := NewCounts()
	counts.Accepted("stmt:acct:88213", 34)
	h := Handler(src, counts)
	resp, body := get(t, h, "/ui/?range=15m")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP %q", csp)
	}
	if strings.Contains(body, "<script>alert") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("holder not escaped:\n%s", body)
	}
	if strings.Contains(body, "fl_secret") {
		t.Fatal("a lease id reached the page")
	}
	if strings.Contains(body, "<script>") && !strings.Contains(body, `<script src="/ui/static/app.js" defer></script>`) {
		t.Fatal("inline script on the page")
	}
	for _, want := range []string{`href="/ui/resources/stmt:acct:88213"`, ">2</b>", "stale_token", "worker-5", `data-stream="/v1/rejections/stream"`, `data-after="2"`} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	_, js := get(t, h, "/ui/api/overview?range=15m")
	if strings.Contains(js, "fl_secret") || !strings.Contains(js, `"total":2`) {
		t.Fatalf("overview JSON: %s", js)
	}
}

func TestTimelineTellsTheStoryInOrder(t *testing.T) {
	h := Handler(incident(), NewCounts())
	resp, body := get(t, h, "/ui/resources/stmt%3Aacct%3A88213")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	// The account first, then the story newest first, the incident marked.
	want := []string{`id="account"`, "wrote with token", "15 s after its lease expired (00:41:37.000)", "worker-5</b> held the resource with token 34 (granted 00:41:40.000)",
		"2 times until 00:41:53.000; nothing reached the upstream",
		`class="step rejected incident"`, "00:41:52.000", "<b class=\"bad\">rejected</b>", "15 s after its lease ended", "×2 until 00:41:53.000",
		`class="step granted incident"`, "acquired token <b>34</b>", `class="step expired incident"`, "<b>expired</b>",
		`class="step renewed"`, "renewed token 33", `class="step granted incident"`, "acquired token <b>33</b>", "0 writes accepted under it"}
	at := 0
	for _, w := range want {
		i := strings.Index(body[at:], w)
		if i < 0 {
			t.Fatalf("timeline lacks %q after offset %d:\n%s", w, at, body)
		}
		at += i
	}
	if strings.Contains(body, "<script>alert") {
		t.Fatal("holder not escaped")
	}
	if resp, _ := get(t, h, "/ui/resources/nope"); resp.StatusCode != 404 {
		t.Fatalf("unknown resource: %d", resp.StatusCode)
	}
	if resp, _ := get(t, h, "/ui/resources/%3Cscript%3E"); resp.StatusCode != 400 {
		t.Fatalf("invalid resource: %d", resp.StatusCode)
	}
	_, js := get(t, h, "/ui/api/resources/stmt:acct:88213")
	kinds := []string{`"kind":"rejected"`, `"kind":"granted"`, `"kind":"expired"`, `"kind":"renewed"`, `"kind":"granted"`}
	at = 0
	for _, k := range kinds {
		i := strings.Index(js[at:], k)
		if i < 0 {
			t.Fatalf("timeline JSON lacks %s in order: %s", k, js)
		}
		at += i + len(k)
	}
	if strings.Contains(js, "fl_secret") {
		t.Fatal("lease id in JSON")
	}
}

func TestOverviewScanIsBounded(t *testing.T) {
	src := &fakeSource{now: time.Date(2026, 3, 1, 1, 0, 0, 0, time.UTC)}
	for i := range scanMax + 500 {
		src.rejs = append(src.rejs, tokens.Rejection{ID: int64(i + 1), At: src.now.Add(-time.Minute + time.Duration(i)*time.Millisecond), Resource: "r", Code: tokens.CodeStaleToken, Holder: "w"})
	}
	_, body := get(t, Handler(src, nil), "/ui/?range=15m")
	if !strings.Contains(body, `id="truncated"`) || !strings.Contains(body, ">10000</b>") {
		t.Fatal("no truncation notice")
	}
	if src.calls > scanMax/pageSize+3 {
		t.Fatalf("%d store reads for one overview", src.calls)
	}
}

func TestStaticAndGoto(t *testing.T) {
	h := Handler(incident(), nil)
	resp, body := get(t, h, "/ui/static/app.js")
	if resp.StatusCode != 200 || !strings.Contains(body, "EventSource") {
		t.Fatalf("app.js: %d", resp.StatusCode)
	}
	resp, _ = get(t, h, "/ui/resources/?name=inventory/SKU-001")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ui/resources/inventory%2FSKU-001" {
		t.Fatalf("goto: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestCounts(t *testing.T) {
	c := NewCounts()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for tok := int64(1); tok <= 12; tok++ {
				for range 100 {
					c.Accepted("a", tok)
				}
			}
		})
	}
	wg.Wait()
	got, err := c.Writes(t.Context(), "a", []int64{1, 12, 13})
	if err != nil || len(got) != 2 || got[1] != 800 || got[12] != 800 {
		t.Fatalf("Writes = %v, %v; want 800 for tokens 1 and 12", got, err)
	}
	if c.Totals().Accepted != 8*12*100 {
		t.Fatalf("total %d", c.Totals().Accepted)
	}
	var nilCounts *Counts
	nilCounts.Accepted("a", 1)
	nilCounts.Rejected(tokens.Rejection{})
}

func BenchmarkCountsAccepted(b *testing.B) {
	c := NewCounts()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Accepted("inventory/SKU-001", 42)
		}
	})
}

// A filter that cannot match anything is a 400 naming the parameter, on the
// page and in the JSON, not an empty result that looks like "no incidents".
func TestOverviewRefusesBadFilters(t *testing.T) {
	h := Handler(incident(), nil)
	for _, tc := range []struct{ query, field string }{
		{"range=7d", "range"},
		{"code=stale", "code"},
		{"resource=" + url.QueryEscape("a b"), "resource"},
		{"resource=" + strings.Repeat("r", 257), "resource"},
		{"holder=" + strings.Repeat("h", 129), "holder"},
		{"holder=%01", "holder"},
	} {
		resp, body := get(t, h, "/ui/api/overview?"+tc.query)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(body, `"code":"invalid_request"`) || !strings.Contains(body, tc.field) {
			t.Errorf("JSON ?%.40s: %d %s %s", tc.query, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		resp, body = get(t, h, "/ui/?"+tc.query)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, tc.field) {
			t.Errorf("page ?%.40s: %d", tc.query, resp.StatusCode)
		}
	}
	for _, q := range []string{"", "range=24h&code=lease_not_owned", "resource=stmt:acct:88213&holder=worker-3"} {
		if resp, body := get(t, h, "/ui/api/overview?"+q); resp.StatusCode != http.StatusOK {
			t.Errorf("?%s: %d %s", q, resp.StatusCode, body)
		}
	}
}

// The dashboard shows who presented a refused lease, and never
// emits invalid UTF-8, whatever an old record holds.
func TestDashboardShowsPrincipalAndValidUTF8(t *testing.T) {
	src := incident()
	src.rejs = append(src.rejs, tokens.Rejection{ID: 3, At: src.now.Add(-time.Second), Resource: "stmt:acct:88213", Code: tokens.CodeLeaseNotOwned,
		Token: 34, CurrentToken: 34, Holder: "worker-5\xff", Method: "PUT", Upstream: "statements", Path: "/lines/\xc0\xae\xe2\x82", Principal: "thief-key"})
	h := Handler(src, NewCounts())
	for _, path := range []string{"/ui/?range=15m", "/ui/resources/stmt:acct:88213", "/ui/api/overview?range=15m", "/ui/api/resources/stmt:acct:88213"} {
		resp, body := get(t, h, path)
		if resp.StatusCode != 200 || !utf8.ValidString(body) {
			t.Fatalf("%s: %d, valid UTF-8 %v:\n%s", path, resp.StatusCode, utf8.ValidString(body), body)
		}
		if !strings.Contains(body, "thief-key") && path != "/ui/api/overview?range=15m" { // its JSON has counts, not rows
			t.Errorf("%s does not name the key that presented the lease", path)
		}
	}
}

// A long story pages by timelineRows rows, newest first; routine runs fold.
func TestTimelinePagesAndFolds(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC)
	const res = "stmt:acct:1"
	src := &fakeSource{now: t0.Add(time.Hour), res: map[string]tokens.Resource{}}
	at := t0
	tok := int64(0)
	// 40 quick cycles by warm-up, then 60 incidents: a grant that expires,
	// the next grant, a stale write of the expired one.
	for range 40 {
		tok++
		src.events = append(src.events,
			tokens.Event{At: at, Resource: res, Kind: tokens.EventGranted, Token: tok, Holder: "warm-up", ExpiresAt: at.Add(time.Minute)},
			tokens.Event{At: at.Add(time.Millisecond), Resource: res, Kind: tokens.EventReleased, Token: tok, Holder: "warm-up"})
		at = at.Add(5 * time.Millisecond)
	}
	for i := range 60 {
		tok++
		src.events = append(src.events, tokens.Event{At: at, Resource: res, Kind: tokens.EventGranted, Token: tok, Holder: "worker-3", ExpiresAt: at.Add(time.Second)})
		at = at.Add(2 * time.Second)
		src.rejs = append(src.rejs, tokens.Rejection{ID: int64(i + 1), At: at, Resource: res, Code: tokens.CodeStaleToken, Token: tok, CurrentToken: tok + 1,
			Holder: "worker-3", Method: "POST", Upstream: "up", Path: "/x", LeaseEndedAt: at.Add(-time.Second)})
	}
	tok++
	src.events = append(src.events, tokens.Event{At: at.Add(-time.Second), Resource: res, Kind: tokens.EventGranted, Token: tok, Holder: "worker-5", ExpiresAt: at.Add(time.Hour)})
	src.res[res] = tokens.Resource{Name: res, Token: tok, Now: src.now}
	h := Handler(src, NewCounts())

	var first Timeline
	_, js := get(t, h, "/ui/api/resources/"+res)
	if err := json.Unmarshal([]byte(js), &first); err != nil {
		t.Fatal(err)
	}
	// 60 x (grant, expiry, stale write), the last grant, one folded run.
	if first.Rows != 60*3+1+1 || first.Pages != 4 || first.Page != 1 || len(first.Steps) != timelineRows {
		t.Fatalf("rows %d, pages %d, page %d, %d steps", first.Rows, first.Pages, first.Page, len(first.Steps))
	}
	if s, g := first.Steps[0], first.Steps[1]; s.Kind != StepRejected || s.Token != tok-1 || g.Kind != StepGranted || g.Holder != "worker-5" || !g.Incident {
		t.Fatalf("newest first: the first rows are %+v, %+v", s, g)
	}
	if a := first.Account; a.Token != tok-1 || a.CurrentHolder != "worker-5" || a.Incidents != 60 || a.After != time.Second {
		t.Fatalf("account %+v", a)
	}
	var last Timeline
	_, js = get(t, h, "/ui/api/resources/"+res+"?page=4")
	if err := json.Unmarshal([]byte(js), &last); err != nil {
		t.Fatal(err)
	}
	run := last.Steps[len(last.Steps)-1]
	if last.Page != 4 || run.Kind != StepRun || run.Run.Grants != 40 || run.Run.Releases != 40 || run.Run.FirstToken != 1 || run.Run.LastToken != 40 ||
		!slices.Equal(run.Run.Holders, []string{"warm-up"}) {
		t.Fatalf("the oldest row should fold the 40 warm-up cycles: %+v %+v", run, run.Run)
	}
	_, body := get(t, h, "/ui/resources/"+res+"?page=4")
	if !strings.Contains(body, "40 grants and 40 releases by <b class=\"holder\">warm-up</b>, tokens 1–40, 07:00:00.000–07:00:00.196") ||
		!strings.Contains(body, `rel="prev"`) || strings.Contains(body, `rel="next"`) {
		t.Fatalf("page 4 lacks the folded run or its links:\n%s", body)
	}
	if resp, _ := get(t, h, "/ui/resources/"+res+"?page=9"); resp.StatusCode != 200 {
		t.Fatalf("a page past the last: %d, want the last page", resp.StatusCode)
	}
	for _, bad := range []string{"0", "-1", "two"} {
		if resp, body := get(t, h, "/ui/api/resources/"+res+"?page="+bad); resp.StatusCode != 400 || !strings.Contains(body, "page") {
			t.Errorf("page=%s: %d %s, want 400 naming page", bad, resp.StatusCode, body)
		}
	}
}

// A would-be refusal of an observing upstream is marked as such on the
// overview and the timeline, in its own colour, saying nothing was
// blocked, with the write's trace id; a real refusal beside it is not.
func TestDashboardMarksWouldRefuse(t *testing.T) {
	src := incident()
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	src.rejs = append(src.rejs, tokens.Rejection{ID: 3, At: src.now.Add(-time.Second), Resource: "stmt:acct:88213", Code: tokens.CodeStaleToken,
		Token: 33, CurrentToken: 34, Holder: "worker-old", Method: "PUT", Upstream: "statements", Path: "/lines/9", WouldRefuse: true, TraceID: trace})
	h := Handler(src, NewCounts())
	for _, path := range []string{"/ui/?range=15m", "/ui/resources/stmt:acct:88213"} {
		resp, body := get(t, h, path)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		if !strings.Contains(body, "nothing was blocked") || !strings.Contains(body, `class="observed-note"`) {
			t.Errorf("%s does not mark the observed write as not blocked:\n%s", path, body)
		}
		if !strings.Contains(body, trace) {
			t.Errorf("%s does not show the write's trace id", path)
		}
		if strings.Count(body, "nothing was blocked") != 1 {
			t.Errorf("%s marks %d writes as not blocked, want only the observed one", path, strings.Count(body, "nothing was blocked"))
		}
	}
	if _, body := get(t, h, "/ui/?range=15m"); !strings.Contains(body, `<tr data-id="3" class="observed">`) {
		t.Error("the observed row has not its own colour")
	}
	if _, body := get(t, h, "/ui/api/resources/stmt:acct:88213"); !strings.Contains(body, `"would_refuse":true`) || !strings.Contains(body, `"trace_id":"`+trace+`"`) {
		t.Errorf("the timeline's JSON lacks would_refuse and trace_id:\n%s", body)
	}
}
