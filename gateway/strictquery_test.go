package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// The query parameters checkQuery allows are the spec's.
func TestQueryParamsAreTheSpecs(t *testing.T) {
	ops, err := specQuery()
	if err != nil {
		t.Fatal(err)
	}
	for op, want := range map[string][]string{
		"GET /v1/rejections":           {"resource", "since", "limit", "cursor"},
		"GET /v1/rejections/stream":    {"after", "resource", "holder", "code"},
		"POST /v1/leases":              nil,
		"GET /v1/leases/{lease_id}":    nil,
		"DELETE /v1/leases/{lease_id}": nil,
	} {
		got, ok := ops[op]
		if !ok || !slices.Equal(got, want) {
			t.Errorf("%s: query parameters %q (in the spec: %v), want %q", op, got, ok, want)
		}
	}
}

// Every control call takes only the query parameters the spec gives it:
// another, or one given twice, is 400 invalid_request naming it, through
// the real server (the router, the acquire past it, the live stream).
func TestControlQueriesAreStrict(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	base := "http://" + tg.addr
	do := func(method, target, body string) (int, problem) {
		t.Helper()
		req, err := http.NewRequest(method, base+target, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.Header.Get("Content-Type") == "text/event-stream" {
			return resp.StatusCode, problem{}
		}
		data, _ := io.ReadAll(resp.Body)
		var p problem
		_ = json.Unmarshal(data, &p)
		return resp.StatusCode, p
	}
	acquire := `{"resource":"q1","holder":"w","ttl_ms":60000}`
	for _, c := range []struct{ method, target, body, field, detail string }{
		{"GET", "/v1/rejections?resorce=q1", "", "resorce", "its parameters: resource, since, limit, cursor"},
		{"GET", "/v1/rejections?resource=q1&resource=q2", "", "resource", "given twice"},
		{"HEAD", "/v1/rejections?Limit=5", "", "", ""}, // a HEAD's answer has no body: the status says it
		{"GET", "/v1/leases/fl_x?verbose=1", "", "verbose", "it takes none"},
		{"POST", "/v1/leases?wait_ms=5000", acquire, "wait_ms", "it takes none"},
		{"GET", "/v1/resources/q1?%zz=1", "", "query", "malformed"},
		{"GET", "/v1/rejections?=q1", "", "query", "without a name"},
		{"GET", "/v1/rejections/stream?resorce=q1", "", "resorce", "its parameters: after, resource, holder, code"},
	} {
		status, p := do(c.method, c.target, c.body)
		if status != http.StatusBadRequest || c.field != "" && (p.Code != "invalid_request" || p.Field != c.field || !strings.Contains(p.Detail, c.detail)) {
			t.Errorf("%s %s: %d %+v, want 400 invalid_request, field %s, detail with %q", c.method, c.target, status, p, c.field, c.detail)
		}
	}
	for _, c := range []struct {
		method, target, body string
		status               int
	}{
		{"POST", "/v1/leases", acquire, http.StatusCreated},
		{"GET", "/v1/rejections?resource=q1&limit=5&since=2026-01-01T00:00:00Z", "", http.StatusOK},
		{"GET", "/v1/rejections?", "", http.StatusOK},
		{"GET", "/v1/resources/q1", "", http.StatusOK},
	} {
		if status, p := do(c.method, c.target, c.body); status != c.status {
			t.Errorf("%s %s: %d %+v, want %d", c.method, c.target, status, p, c.status)
		}
	}
}

// FuzzCheckQuery holds checkQuery to net/url's own reading of a query
// (url.ParseQuery): of a query it parses, checkQuery refuses exactly those
// with a name the call does not declare, an empty one, or one given more
// than once; it never panics on anything.
func FuzzCheckQuery(f *testing.F) {
	for _, s := range []string{
		"resource=a", "resource=a&resource=b", "resorce=a", "=x", "%zz=1", "limit=%zz",
		"limit=1&&since=x", "resource%3D=x", "re%73ource=a", "limit", "limit&limit", "a;b=c", "+resource=a",
	} {
		f.Add(s)
	}
	declared := []string{"resource", "since", "limit", "cursor"}
	f.Fuzz(func(t *testing.T, raw string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/v1/rejections", RawQuery: raw}}
		err := checkQuery(r, "/v1/rejections")
		values, perr := url.ParseQuery(raw)
		if perr != nil {
			return // checkQuery may take or refuse it; it did not panic
		}
		want := false
		for name, vv := range values {
			want = want || name == "" || !slices.Contains(declared, name) || len(vv) > 1
		}
		if (err != nil) != want {
			t.Fatalf("checkQuery(%q) = %v; url.ParseQuery reads %q, want a refusal: %v", raw, err, values, want)
		}
	})
}
