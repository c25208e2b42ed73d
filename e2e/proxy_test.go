package e2e

import (
	"bytes"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What a forwarded write carries: the gateway's token and resource, its own
// X-Forwarded-*, the upstream's Host, the path and query below the upstream;
// never the lease secret, client copies of fencing headers or hop-by-hop
// headers.
func TestForwardedRequestHeaders(t *testing.T) {
	up := newUpstream(t)
	g := startEmbedded(t, map[string]string{"svc": up.URL + "/base"}, options{})
	l := acquire(t, g.URL, "inventory/SKU-001", "w", 5*time.Second)

	got := do(t, "PATCH", g.URL+"/v1/proxy/svc/a/b%20c?x=1&y=two", "payload",
		"Fencing-Lease", l.LeaseID,
		"Fencing-Token", "424242",
		"Fencing-Resource", "someone-else",
		"X-Forwarded-For", "6.6.6.6",
		"X-Forwarded-Proto", "gopher",
		"Forwarded", "for=6.6.6.6",
		"Connection", "X-Drop-Me",
		"X-Drop-Me", "secret",
		"X-Keep", "kept",
	)
	if got.Status != http.StatusOK {
		t.Fatalf("write: %d %s", got.Status, got.Body)
	}
	seen := up.seen()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	a := seen[0]
	upURL, _ := url.Parse(up.URL)
	checks := []struct{ name, got, want string }{
		{"method", a.Method, "PATCH"},
		{"path", a.Path, "/base/a/b%20c?x=1&y=two"},
		{"host", a.Host, upURL.Host},
		{"Fencing-Token", a.Header.Get("Fencing-Token"), strconv.FormatInt(l.Token, 10)},
		{"Fencing-Resource", a.Header.Get("Fencing-Resource"), "inventory/SKU-001"},
		{"Fencing-Lease", a.Header.Get("Fencing-Lease"), ""},
		{"X-Forwarded-For", a.Header.Get("X-Forwarded-For"), "127.0.0.1"},
		{"X-Forwarded-Proto", a.Header.Get("X-Forwarded-Proto"), "http"},
		{"Forwarded", a.Header.Get("Forwarded"), ""},
		{"X-Drop-Me", a.Header.Get("X-Drop-Me"), ""},
		{"X-Keep", a.Header.Get("X-Keep"), "kept"},
		{"body", a.Body, "payload"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	if v := a.Header.Values("Fencing-Token"); len(v) != 1 {
		t.Errorf("Fencing-Token values: %q", v)
	}
	if strings.Contains(string(got.Body), l.LeaseID) {
		t.Error("the answer echoes the lease id")
	}
}

// Bad input gets a 4xx problem naming what is wrong, and nothing is
// granted or forwarded.
func TestBadInput(t *testing.T) {
	up := newUpstream(t)
	g := startEmbedded(t, map[string]string{"svc": up.URL}, options{maxBody: 1024})
	l := acquire(t, g.URL, "bad-input", "w", 5*time.Second)

	cases := []struct {
		name   string
		method string
		path   string
		body   any
		header []string
		status int
		code   string
		field  string
	}{
		{"empty body", "POST", "/v1/leases", "", nil, 400, "invalid_request", "body"},
		{"not json", "POST", "/v1/leases", "{nope", nil, 400, "invalid_request", "body"},
		{"ttl as string", "POST", "/v1/leases", `{"resource":"r","ttl_ms":"5"}`, nil, 400, "invalid_request", "ttl_ms"},
		{"ttl too short", "POST", "/v1/leases", `{"resource":"r","ttl_ms":99}`, nil, 400, "invalid_request", "ttl_ms"},
		{"ttl too long", "POST", "/v1/leases", `{"resource":"r","ttl_ms":3600001}`, nil, 400, "invalid_request", "ttl_ms"},
		{"ttl huge", "POST", "/v1/leases", `{"resource":"r","ttl_ms":9223372036854775807}`, nil, 400, "invalid_request", "ttl_ms"},
		{"ttl negative", "POST", "/v1/leases", `{"resource":"r","ttl_ms":-5}`, nil, 400, "invalid_request", "ttl_ms"},
		{"wait too long", "POST", "/v1/leases", `{"resource":"r","ttl_ms":1000,"wait_ms":60001}`, nil, 400, "invalid_request", "wait_ms"},
		{"resource missing", "POST", "/v1/leases", `{"ttl_ms":1000}`, nil, 400, "invalid_request", "resource"},
		{"resource chars", "POST", "/v1/leases", `{"resource":"a b","ttl_ms":1000}`, nil, 400, "invalid_request", "resource"},
		{"resource script", "POST", "/v1/leases", `{"resource":"<script>","ttl_ms":1000}`, nil, 400, "invalid_request", "resource"},
		{"resource too long", "POST", "/v1/leases", `{"resource":"` + strings.Repeat("x", 257) + `","ttl_ms":1000}`, nil, 400, "invalid_request", "resource"},
		{"holder too long", "POST", "/v1/leases", `{"resource":"r","holder":"` + strings.Repeat("h", 129) + `","ttl_ms":1000}`, nil, 400, "invalid_request", "holder"},
		{"wrong media type", "POST", "/v1/leases", "resource=r", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "unsupported_media_type", "Content-Type"},
		{"control body too large", "POST", "/v1/leases", `{"resource":"r","holder":"` + strings.Repeat("h", 70<<10) + `","ttl_ms":1000}`, nil, 413, "body_too_large", ""},
		{"renew ttl too short", "POST", "/v1/leases/" + l.LeaseID + "/renew", `{"ttl_ms":5}`, nil, 400, "invalid_request", "ttl_ms"},
		{"bad resource in path", "GET", "/v1/resources/a%20b", nil, nil, 400, "invalid_request", "resource"},
		{"limit too big", "GET", "/v1/rejections?limit=1001", nil, nil, 400, "invalid_request", "limit"},
		{"limit not a number", "GET", "/v1/rejections?limit=x", nil, nil, 400, "invalid_request", "limit"},
		{"since not a time", "GET", "/v1/rejections?since=yesterday", nil, nil, 400, "invalid_request", "since"},
		{"bad cursor", "GET", "/v1/rejections?cursor=abc", nil, nil, 400, "invalid_request", "cursor"},
		{"unknown upstream", "POST", "/v1/proxy/nope/x", "b", []string{"Fencing-Lease", l.LeaseID}, 404, "unknown_upstream", ""},
		{"missing lease", "POST", "/v1/proxy/svc/x", "b", nil, 400, "missing_lease", ""},
		{"dot segments", "POST", "/v1/proxy/svc/a/%2e%2e/admin", "b", []string{"Fencing-Lease", l.LeaseID}, 400, "invalid_request", "path"},
		{"write body too large", "POST", "/v1/proxy/svc/x", strings.Repeat("b", 2048), []string{"Fencing-Lease", l.LeaseID}, 413, "body_too_large", ""},
		{"unknown endpoint", "GET", "/v1/nope", nil, nil, 404, "not_found", ""},
		{"wrong method", "PUT", "/v1/leases", "{}", nil, 405, "method_not_allowed", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := do(t, c.method, g.URL+c.path, c.body, c.header...)
			wantProblem(t, got, c.status, c.code)
			if got.Problem.Field != c.field {
				t.Errorf("field %q, want %q (%s)", got.Problem.Field, c.field, got.Body)
			}
			if got.Problem.Detail == "" && c.status != 405 {
				t.Errorf("no detail: %s", got.Body)
			}
		})
	}
	if n := len(up.seen()); n != 0 {
		t.Fatalf("bad input reached the upstream %d times", n)
	}
	// Nothing half-written: the resource still has only the one grant.
	if l2 := acquire(t, g.URL, "r", "w", time.Second); l2.Token != 1 {
		t.Fatalf("a refused acquire left a token behind: %d", l2.Token)
	}
}

// A write body larger than the limit without Content-Length (chunked) is cut
// off and never reaches the upstream complete.
func TestChunkedWriteTooLarge(t *testing.T) {
	up := newUpstream(t)
	g := startEmbedded(t, map[string]string{"svc": up.URL}, options{maxBody: 1024})
	l := acquire(t, g.URL, "chunked", "w", 5*time.Second)
	req, _ := http.NewRequest("POST", g.URL+"/v1/proxy/svc/x", struct{ *bytes.Reader }{bytes.NewReader(make([]byte, 4096))})
	req.Header.Set("Fencing-Lease", l.LeaseID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge && resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, a := range up.seen() {
		if len(a.Body) > 1024 {
			t.Fatalf("upstream got %d bytes", len(a.Body))
		}
	}
}

// An upstream that does not answer within the forward timeout: 504, and the
// resource stays closed to grants for the drain period, because that write
// may still land.
func TestUpstreamTimeoutDrains(t *testing.T) {
	up := newUpstream(t)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	up.setHold(func(arrival) {
		select {
		case <-stop:
		case <-time.After(2 * time.Second):
		}
	})
	g := startEmbedded(t, map[string]string{"svc": up.URL}, options{forwardTimeout: 200 * time.Millisecond, drainPeriod: 1500 * time.Millisecond, grantWait: 300 * time.Millisecond})
	l := acquire(t, g.URL, "slow-upstream", "A", 5*time.Second)
	got := write(t, g.URL, "svc", "/x", l, "maybe")
	wantProblem(t, got, http.StatusGatewayTimeout, "upstream_timeout")
	if r := do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil); r.Status != http.StatusNoContent {
		t.Fatalf("release: %d", r.Status)
	}
	busy := do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "slow-upstream", "holder": "B", "ttl_ms": 1000})
	wantProblem(t, busy, http.StatusServiceUnavailable, "fence_busy")
	if busy.Header.Get("Retry-After") == "" {
		t.Fatal("fence_busy without Retry-After")
	}
	// Once the drain period is over, grants go through again.
	b := do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "slow-upstream", "holder": "B", "ttl_ms": 1000, "wait_ms": 3000})
	if b.Status != http.StatusCreated {
		t.Fatalf("grant after drain: %d %s", b.Status, b.Body)
	}
}

// An upstream that cannot be reached: 502, and no drain (nothing was sent).
func TestUpstreamUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	g := startEmbedded(t, map[string]string{"dead": dead}, options{grantWait: 200 * time.Millisecond})
	l := acquire(t, g.URL, "dead-upstream", "A", 5*time.Second)
	bad := write(t, g.URL, "dead", "/x", l, "x")
	wantProblem(t, bad, http.StatusBadGateway, "upstream_unreachable")
	if !strings.Contains(string(bad.Body), `"instance":"/v1/proxy/dead/x"`) {
		t.Fatalf("instance should be the client's path: %s", bad.Body)
	}
	do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil)
	if b := do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "dead-upstream", "holder": "B", "ttl_ms": 1000}); b.Status != http.StatusCreated {
		t.Fatalf("grant after a refused connection: %d %s", b.Status, b.Body)
	}
}

// The rejection log: newest first, filters, pagination without gaps.
func TestRejectionLogPagination(t *testing.T) {
	up := newUpstream(t)
	g := startEmbedded(t, map[string]string{"svc": up.URL}, options{})
	acquire(t, g.URL, "other", "O", time.Second)
	before := time.Now()
	// 25 incidents: each under a lease of its own, released before its
	// write (repeats under one lease would be counted on one entry).
	for range 25 {
		a := acquire(t, g.URL, "pages", "A", time.Minute)
		do(t, "DELETE", g.URL+"/v1/leases/"+a.LeaseID, nil)
		wantProblem(t, write(t, g.URL, "svc", "/x", a, "x"), http.StatusConflict, "lease_released")
	}
	seen := map[int64]bool{}
	var last int64 = 1 << 62
	cursor := ""
	pages := 0
	for {
		q := "?resource=pages&limit=10"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		page := rejections(t, g.URL, q)
		pages++
		for _, it := range page.Items {
			if it.ID >= last || seen[it.ID] {
				t.Fatalf("not strictly newest first: %d after %d", it.ID, last)
			}
			last, seen[it.ID] = it.ID, true
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if len(seen) != 25 || pages != 3 {
		t.Fatalf("%d items over %d pages, want 25 over 3", len(seen), pages)
	}
	if got := rejections(t, g.URL, "?resource=other"); len(got.Items) != 0 {
		t.Fatalf("filter leaked: %+v", got)
	}
	future := url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if got := rejections(t, g.URL, "?since="+future); len(got.Items) != 0 {
		t.Fatalf("since filter: %+v", got)
	}
	past := url.QueryEscape(before.Add(-time.Second).UTC().Format(time.RFC3339Nano))
	if got := rejections(t, g.URL, "?since="+past+"&limit=1000"); len(got.Items) != 25 {
		t.Fatalf("since filter: %d items", len(got.Items))
	}
}
