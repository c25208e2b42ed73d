package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

func TestParseRoute(t *testing.T) {
	for _, spec := range []string{
		"statements/accounts/{acct}/**=stmt:acct:{acct}",
		"inventory/**=inventory/*",
		"svc/=root",
		"svc/a/*/b/{x}=r:{x}:end",
		"svc/q=a=b", // the last '=' splits: pattern /q=a, resource b
		"svc/{a}/{b}={a}{b}",
		"svc/**=*",
	} {
		r, err := ParseRoute(spec)
		if err != nil || r.String() != spec {
			t.Errorf("ParseRoute(%q) = %v, %v", spec, r, err)
		}
	}
	for _, spec := range []string{
		"", "svc", "/a=b", "svc/a", "svc/**/x=r", "svc/{a}/{a}=r", "svc/{1a}=r", "svc/{}=r", "svc/a{b}=r",
		"svc/%2e=r", "svc/../x=r", "svc/a b=r", "svc/a,b=r", "svc/a\\b=r", "svc/x=", "svc/x={y}", "svc/{x}=r{x",
		"svc/x=r x", "svc/x=r*x", "svc/{a}/{b}/{c}/{d}/{e}/{f}/{g}/{h}/{i}=r",
	} {
		if r, err := ParseRoute(spec); err == nil {
			t.Errorf("ParseRoute(%q) = %+v, want an error", spec, r)
		}
	}
}

func TestRouteAllows(t *testing.T) {
	acct := mustRoute(t, "statements/accounts/{acct}/**=stmt:acct:{acct}")
	inv := mustRoute(t, "inventory/items/*/stock=inventory/*")
	pair := mustRoute(t, "svc/{a}/x/{b}=p:{b}:{a}")
	for _, tc := range []struct {
		r        *Route
		path     string
		resource string
		want     bool
	}{
		{acct, "/accounts/88213/lines", "stmt:acct:88213", true},
		{acct, "/accounts/88213", "stmt:acct:88213", true},
		{acct, "/accounts/88213/", "stmt:acct:88213", true},
		{acct, "/accounts/88213/lines", "stmt:acct:88214", false},
		{acct, "/accounts/88213/lines", "stmt:acct:882", false},
		{acct, "/accounts/88213/lines", "stmt:acct:882130", false},
		{acct, "/accounts/%38%38213/lines", "stmt:acct:88213", true},
		{acct, "/acc%6funts/88213", "stmt:acct:88213", true},
		{acct, "/accounts//lines", "stmt:acct:", false},
		{acct, "/accounts", "stmt:acct:", false},
		{acct, "/other/88213", "stmt:acct:88213", false},
		{acct, "/accounts/a%2Fb/x", "stmt:acct:a/b", false}, // an encoded '/' is never captured
		{inv, "/items/SKU-1/stock", "inventory/SKU-1", true},
		{inv, "/items/SKU-1/stock", "inventory/", true},
		{inv, "/items/SKU-1/stock", "inventoryX", false},
		{inv, "/items//stock", "inventory/x", false},
		{inv, "/items/SKU-1/stock/more", "inventory/x", false},
		{pair, "/1/x/2", "p:2:1", true},
		{pair, "/1/x/2", "p:1:2", false},
	} {
		if got := tc.r.Allows(tc.path, tc.resource); got != tc.want {
			t.Errorf("%s Allows(%q, %q) = %v", tc.r, tc.path, tc.resource, got)
		}
	}
}

func mustRoute(t testing.TB, spec string) *Route {
	t.Helper()
	r, err := ParseRoute(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The check of a write that passes costs no allocation.
func TestRouteCheckAllocs(t *testing.T) {
	table := newRouteTable([]*Route{mustRoute(t, "statements/accounts/{acct}/**=stmt:acct:{acct}"), mustRoute(t, "statements/admin/**=ops:*")})
	n := testing.AllocsPerRun(100, func() {
		if table.check("statements", "/accounts/88213/lines", "stmt:acct:88213", 1) != nil ||
			table.check("free", "/x", "r", 1) != nil {
			t.Fatal("refused")
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

// refAllows is an independent reading of the route rules: split the
// pattern and the path, match them recursively, build the resource the
// template names and compare.
func refAllows(spec, raw, resource string) bool {
	_, rest, _ := strings.Cut(spec, "/")
	eq := strings.LastIndexByte(rest, '=')
	pattern, tmpl := strings.Split(rest[:eq], "/"), rest[eq+1:]
	path := strings.Split(strings.TrimPrefix(raw, "/"), "/")
	caps := map[string]string{}
	for i, p := range pattern {
		if p == "**" {
			break
		}
		if i >= len(path) {
			return false
		}
		seg, err := url.PathUnescape(path[i])
		if err != nil {
			return false
		}
		switch {
		case p == "*":
			if seg == "" {
				return false
			}
		case strings.HasPrefix(p, "{"):
			if seg == "" || strings.Contains(seg, "/") {
				return false
			}
			caps[p[1:len(p)-1]] = seg
		default:
			if seg != p {
				return false
			}
		}
		if i == len(pattern)-1 && len(path) != len(pattern) {
			return false
		}
	}
	prefix := strings.HasSuffix(tmpl, "*")
	tmpl = strings.TrimSuffix(tmpl, "*")
	for name, v := range caps {
		tmpl = strings.ReplaceAll(tmpl, "{"+name+"}", v)
	}
	if prefix {
		return strings.HasPrefix(resource, tmpl)
	}
	return resource == tmpl
}

// The route parser never panics, and what it accepts matches exactly as
// the independent reading above does, on any path the path rule lets
// through.
func FuzzRoute(f *testing.F) {
	f.Add("statements/accounts/{acct}/**=stmt:acct:{acct}", "/accounts/88213/lines", "stmt:acct:88213")
	f.Add("inventory/items/*/stock=inventory/*", "/items/x/stock", "inventory/x")
	f.Add("svc/{a}/x/{b}=p:{b}:{a}", "/1/x/2", "p:2:1")
	f.Add("svc/{a}=r:{a}", "/a%2Fb", "r:a/b")
	f.Add("svc/=root", "/", "root")
	f.Fuzz(func(t *testing.T, spec, raw, resource string) {
		r, err := ParseRoute(spec)
		if err != nil {
			return
		}
		if r.String() != spec {
			t.Fatalf("String() = %q, spec %q", r, spec)
		}
		if strings.Contains(spec, "{") && strings.Count(spec, "{") != strings.Count(spec, "}") {
			return // braces inside a literal are refused; a template with stray ones too
		}
		if _, err := checkProxyPath(raw); err != nil || !strings.HasPrefix(raw, "/") {
			return
		}
		if got, want := r.Allows(raw, resource), refAllows(spec, raw, resource); got != want {
			t.Fatalf("%s Allows(%q, %q) = %v, the reference says %v", spec, raw, resource, got, want)
		}
	})
}

// With the upstream bound to the resource its path
// names, a live lease on res:b cannot write to res:a's path: 403
// resource_mismatch, recorded with the presenting lease's facts, nothing
// forwarded. The owner of res:a still writes there.
func TestRouteRefusesALeaseForAnotherResource(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{Routes: []*Route{mustRoute(t, "svc/rec/{res}/**={res}")}}, false)
	a, b := tg.lease(t, "res:a"), tg.lease(t, "res:b")
	write := func(lease, path string) (*http.Response, problem, string) {
		return tg.rawAnswer(t, post("/v1/proxy/svc"+path, "Host: gw\r\nFencing-Lease: "+lease+"\r\n", "x"))
	}
	if resp, _, body := write(a, "/rec/res:a/x"); resp.StatusCode != 200 {
		t.Fatalf("the owner's write: %d %s", resp.StatusCode, body)
	}
	for _, path := range []string{"/rec/res:a/x", "/rec/res%3Aa/x", "/rec/res:a", "/other", "/", "/rec/res:b%2F..%2Fres:a/x"} {
		resp, p, body := write(b, path)
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("thief to %s: %d %s", path, resp.StatusCode, body)
		}
		if resp.StatusCode == http.StatusForbidden && (p.Code != tokens.CodeResourceMismatch || p.Resource != "res:b") {
			t.Fatalf("thief to %s: %s", path, body)
		}
	}
	if got := up.seen(); len(got) != 1 || got[0].Path != "/rec/res:a/x" {
		t.Fatalf("upstream got %+v", got)
	}
	rejs, err := tg.svc.Rejections(t.Context(), tokens.RejectionQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	// One lease's refusals with one code are one entry, counting them.
	var refused int64
	for _, r := range rejs {
		refused += r.Repeats
	}
	if refused != 5 {
		t.Fatalf("%d refusals recorded, want 5: %+v", refused, rejs)
	}
	for _, r := range rejs {
		if r.Code != tokens.CodeResourceMismatch || r.Resource != "res:b" || r.Token != 1 || r.CurrentToken != 1 || r.Upstream != "svc" {
			t.Fatalf("rejection %+v", r)
		}
	}
	// The thief's lease still works where its route takes it, and the
	// refusals held no lock: res:a can be granted again at once.
	if resp, _, body := write(b, "/rec/res:b/y"); resp.StatusCode != 200 {
		t.Fatalf("the thief's own write: %d %s", resp.StatusCode, body)
	}
	if _, err := tg.svc.Release(t.Context(), a, ""); err != nil {
		t.Fatal(err)
	}
	tg.lease(t, "res:a")
}

func BenchmarkRouteCheck(b *testing.B) {
	table := newRouteTable([]*Route{mustRoute(b, "statements/accounts/{acct}/**=stmt:acct:{acct}"), mustRoute(b, "statements/admin/**=ops:*")})
	b.ReportAllocs()
	for b.Loop() {
		if table.check("statements", "/accounts/88213/lines", "stmt:acct:88213", 1) != nil {
			b.Fatal("refused")
		}
	}
}

// HEAD is served wherever GET is, with GET's status and header and no body
// (RFC 9110 9.1; load balancers probe /healthz with it), the live stream
// included, which then holds nothing open. A 405 names the methods the
// endpoint takes in Allow (RFC 9110 15.5.6), the proxy's CONNECT refusal
// too.
func TestHeadAndAllow(t *testing.T) {
	tg := startFraming(t, "http://127.0.0.1:1", Config{}, false)
	c := &http.Client{Timeout: 10 * time.Second}
	base := "http://" + tg.addr
	for _, path := range []string{"/healthz", "/readyz", "/v1/resources/r1", "/v1/rejections", "/metrics", "/v1/rejections/stream"} {
		get, err := c.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = get.Body.Close()
		head, err := c.Head(base + path)
		if err != nil {
			t.Fatalf("HEAD %s: %v", path, err)
		}
		_ = head.Body.Close()
		if head.StatusCode != get.StatusCode || head.Header.Get("Content-Type") != get.Header.Get("Content-Type") {
			t.Errorf("HEAD %s: %d %q; GET: %d %q", path, head.StatusCode, head.Header.Get("Content-Type"), get.StatusCode, get.Header.Get("Content-Type"))
		}
	}
	for _, tc := range []struct{ method, path, allow string }{
		{"PUT", "/healthz", "GET, HEAD"},
		{"HEAD", "/v1/leases", "POST"},
		{"GET", "/v1/leases/fl_x/renew", "POST"},
		{"POST", "/v1/leases/fl_x", "GET, HEAD, DELETE"},
		{"OPTIONS", "/v1/leases", "POST"},
		{"CONNECT", "/v1/proxy/svc/x", proxyMethods},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, nil)
		if tc.method == "CONNECT" {
			req.URL.Opaque = tc.path
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}
}
