package e2e

// Security rules end to end, with API keys on: every rule has a test that
// checks what the client got and what reached (or did not reach) the
// upstream.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// The keys of the security tests' auth file.
const (
	keyWorkerA = "fgk_test-worker-a"
	keyWorkerB = "fgk_test-worker-b"
	keyViewer  = "fgk_test-viewer"
	keyAdmin   = "fgk_test-admin"
	keyLimited = "fgk_test-limited"
	keyBilling = "fgk_test-billing-only"
	keyCapped  = "fgk_test-capped"

	upstreamSecret = "Bearer upstream-secret-workers-never-see"
)

func securityAuthFile() string {
	return fmt.Sprintf(`
keys:
  - {name: worker-a, sha256: %s, role: worker}
  - {name: worker-b, sha256: %s, role: worker}
  - {name: viewer, sha256: %s, role: viewer}
  - {name: admin, sha256: %s, role: admin}
  - {name: limited, sha256: %s, role: worker, rate: 2, burst: 2}
  - {name: billing, sha256: %s, role: worker, resources: ["stmt:"], max_ttl_ms: 2000, max_leases: 1}
  - {name: capped, sha256: %s, role: worker, max_leases: 1}
upstreams:
  - upstream: statements
    headers: {Authorization: "%s"}
`, auth.Hash(keyWorkerA), auth.Hash(keyWorkerB), auth.Hash(keyViewer), auth.Hash(keyAdmin),
		auth.Hash(keyLimited), auth.Hash(keyBilling), auth.Hash(keyCapped), upstreamSecret)
}

type secureOptions struct {
	bodyTimeout time.Duration
	drainPeriod time.Duration
}

// startSecure runs a gateway with the security tests' auth file on the
// storage mode m.
func startSecure(t *testing.T, m storagemode.Config, ups map[string]string, o secureOptions) *gw {
	t.Helper()
	cfg, err := auth.Parse([]byte(securityAuthFile()))
	if err != nil {
		t.Fatalf("auth file: %v", err)
	}
	m.DrainPeriod = o.drainPeriod
	return startReplica(t, replica.Config{
		Mode:        m,
		Live:        gateway.Live{Upstreams: upstreamURLs(t, ups), Auth: cfg.Keys, UpstreamHeaders: cfg.UpstreamHeaders},
		BodyTimeout: o.bodyTimeout,
	})
}

func startSecureEmbedded(t *testing.T, ups map[string]string, o secureOptions) *gw {
	t.Helper()
	return startSecure(t, storagemode.Config{Data: t.TempDir()}, ups, o)
}

// secureModes are the three storage modes with authentication on.
var secureModes = []struct {
	name  string
	start func(t *testing.T, ups map[string]string) *gw
}{
	{"embedded", func(t *testing.T, ups map[string]string) *gw { return startSecureEmbedded(t, ups, secureOptions{}) }},
	{"postgres", func(t *testing.T, ups map[string]string) *gw {
		pgtest.Require(t)
		return startSecure(t, pgMode(t, storagemode.Config{Schema: pgtest.NewSchema(t)}, 0), ups, secureOptions{})
	}},
	{"postgres-redis", func(t *testing.T, ups map[string]string) *gw {
		pgtest.Require(t)
		requireRedis(t)
		schema := pgtest.NewSchema(t)
		cfg := storagemode.Config{Schema: schema, Redis: redisURL(), RedisPrefix: "fencegw-e2e-sec:" + schema + ":"}
		return startSecure(t, pgMode(t, cfg, 0), ups, secureOptions{})
	}},
}

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

func acquireAs(t testing.TB, base, key, resource string, ttl time.Duration) leaseJSON {
	t.Helper()
	a := do(t, "POST", base+"/v1/leases", map[string]any{"resource": resource, "holder": "h", "ttl_ms": ttl.Milliseconds()}, bearer(key)...)
	if a.Status != http.StatusCreated {
		t.Fatalf("acquire %s with key %s: %d %s", resource, key, a.Status, a.Body)
	}
	var l leaseJSON
	if err := json.Unmarshal(a.Body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func writeAs(t testing.TB, base, key, path string, l leaseJSON, body string, header ...string) answer {
	t.Helper()
	h := append([]string{gateway.HeaderLease, l.LeaseID}, bearer(key)...)
	return do(t, "POST", base+"/v1/proxy/statements"+path, body, append(h, header...)...)
}

// Wrong or missing keys get 401 with a challenge; roles and resource
// prefixes get 403; probes need no key.
func TestSecurityKeysAndRoles(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	acquireBody := map[string]any{"resource": "stmt:1", "ttl_ms": 5000}

	a := do(t, "POST", g.URL+"/v1/leases", acquireBody)
	wantProblem(t, a, http.StatusUnauthorized, "unauthorized")
	if ch := a.Header.Values("WWW-Authenticate"); !slices.Contains(ch, `Bearer realm="fencegw"`) {
		t.Fatalf("WWW-Authenticate = %q, want a Bearer challenge", ch)
	}
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases", acquireBody, bearer("fgk_wrong")...), http.StatusUnauthorized, "unauthorized")
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases", acquireBody, "Authorization", auth.Hash(keyWorkerA)), http.StatusUnauthorized, "unauthorized")
	for _, path := range []string{"/v1/rejections", "/v1/rejections/stream", "/metrics", "/ui/", "/v1/resources/stmt:1"} {
		wantProblem(t, do(t, "GET", g.URL+path, nil), http.StatusUnauthorized, "unauthorized")
	}
	// Probes stay open.
	for _, path := range []string{"/healthz", "/readyz"} {
		if a := do(t, "GET", g.URL+path, nil); a.Status != http.StatusOK {
			t.Fatalf("GET %s without a key: %d", path, a.Status)
		}
	}

	// A viewer reads but does not acquire or write.
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases", acquireBody, bearer(keyViewer)...), http.StatusForbidden, "forbidden")
	if a := do(t, "GET", g.URL+"/v1/rejections", nil, bearer(keyViewer)...); a.Status != http.StatusOK {
		t.Fatalf("viewer GET /v1/rejections: %d %s", a.Status, a.Body)
	}
	if a := do(t, "GET", g.URL+"/metrics", nil, bearer(keyViewer)...); a.Status != http.StatusOK {
		t.Fatalf("viewer GET /metrics: %d", a.Status)
	}
	l := acquireAs(t, g.URL, keyWorkerA, "stmt:1", 5*time.Second)
	wantProblem(t, writeAs(t, g.URL, keyViewer, "/x", l, "v"), http.StatusForbidden, "forbidden")

	// The dashboard: a browser gets a Basic challenge and sends the key as
	// the password.
	a = do(t, "GET", g.URL+"/ui/", nil)
	if ch := a.Header.Values("WWW-Authenticate"); !slices.ContainsFunc(ch, func(s string) bool { return strings.HasPrefix(s, "Basic ") }) {
		t.Fatalf("dashboard challenge %q, want Basic", ch)
	}
	req, _ := http.NewRequest("GET", g.URL+"/ui/", nil)
	req.SetBasicAuth("anyone", keyViewer)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard with Basic viewer key: %d", resp.StatusCode)
	}
	req.SetBasicAuth("anyone", "fgk_wrong")
	if resp, err = httpClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("dashboard with a wrong Basic key: %d", resp.StatusCode)
	}

	// Only admins revoke.
	for _, key := range []string{keyWorkerA, keyViewer} {
		wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/revoke", nil, bearer(key)...), http.StatusForbidden, "forbidden")
	}

	// Resource prefixes: billing may use stmt:* only, everywhere.
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "inventory/1", "ttl_ms": 1000}, bearer(keyBilling)...), http.StatusForbidden, "forbidden")
	wantProblem(t, do(t, "GET", g.URL+"/v1/resources/inventory%2F1", nil, bearer(keyBilling)...), http.StatusForbidden, "forbidden")
	if n := len(up.seen()); n != 0 {
		t.Fatalf("%d requests reached the upstream, want none", n)
	}
}

// A lease is bound to the key that acquired it: another key with its id
// cannot write (nothing forwarded, the refusal recorded), renew or release.
func TestSecurityLeaseBoundToPrincipal(t *testing.T) {
	for _, m := range secureModes {
		t.Run(m.name, func(t *testing.T) {
			up := newUpstream(t)
			g := m.start(t, map[string]string{"statements": up.URL})
			res := "stmt:bound:" + m.name
			l := acquireAs(t, g.URL, keyWorkerA, res, 10*time.Second)

			wantProblem(t, writeAs(t, g.URL, keyWorkerB, "/lines", l, "B with A's lease"), http.StatusForbidden, "lease_not_owned")
			wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/renew", map[string]any{"ttl_ms": 60000}, bearer(keyWorkerB)...), http.StatusForbidden, "lease_not_owned")
			wantProblem(t, do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil, bearer(keyWorkerB)...), http.StatusForbidden, "lease_not_owned")
			// Even an admin writes only with its own leases (it revokes instead).
			wantProblem(t, writeAs(t, g.URL, keyAdmin, "/lines", l, "admin with A's lease"), http.StatusForbidden, "lease_not_owned")
			if n := len(up.seen()); n != 0 {
				t.Fatalf("%d writes reached the upstream, want none", n)
			}
			var rej rejectionsJSON
			a := do(t, "GET", g.URL+"/v1/rejections?resource="+url.QueryEscape(res), nil, bearer(keyViewer)...)
			if err := json.Unmarshal(a.Body, &rej); err != nil {
				t.Fatalf("rejections: %d %s", a.Status, a.Body)
			}
			if len(rej.Items) != 2 || rej.Items[0].Code != "lease_not_owned" || rej.Items[0].Token != l.Token {
				t.Fatalf("rejections = %+v, want two lease_not_owned for token %d", rej.Items, l.Token)
			}

			// A's lease is untouched and works for A.
			var got leaseJSON
			a = do(t, "GET", g.URL+"/v1/leases/"+l.LeaseID, nil, bearer(keyWorkerA)...)
			if err := json.Unmarshal(a.Body, &got); err != nil || got.State != "current" || !got.ExpiresAt.Equal(l.ExpiresAt) {
				t.Fatalf("after B's attempts A's lease is %s (%v)", a.Body, err)
			}
			if a := writeAs(t, g.URL, keyWorkerA, "/lines", l, "A line"); a.Status != http.StatusOK {
				t.Fatalf("A's own write: %d %s", a.Status, a.Body)
			}
			if a := do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil, bearer(keyWorkerA)...); a.Status != http.StatusNoContent {
				t.Fatalf("A's release: %d %s", a.Status, a.Body)
			}
		})
	}
}

// An admin's revoke fences at once: the holder's next write is refused and
// never forwarded, the history names the admin, and the token goes on from
// where it was.
func TestSecurityRevoke(t *testing.T) {
	for _, m := range secureModes {
		t.Run(m.name, func(t *testing.T) {
			up := newUpstream(t)
			g := m.start(t, map[string]string{"statements": up.URL})
			res := "stmt:revoke:" + m.name
			l := acquireAs(t, g.URL, keyWorkerA, res, 30*time.Second)
			if a := writeAs(t, g.URL, keyWorkerA, "/lines", l, "before"); a.Status != http.StatusOK {
				t.Fatalf("write before revoke: %d %s", a.Status, a.Body)
			}
			a := do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/revoke", nil, bearer(keyAdmin)...)
			var rev leaseJSON
			if a.Status != http.StatusOK || json.Unmarshal(a.Body, &rev) != nil || rev.State != "released" || rev.Token != l.Token {
				t.Fatalf("revoke: %d %s", a.Status, a.Body)
			}
			wantProblem(t, writeAs(t, g.URL, keyWorkerA, "/lines", l, "after"), http.StatusConflict, "lease_released")
			wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/renew", nil, bearer(keyWorkerA)...), http.StatusConflict, "lease_lost")
			if n := len(up.seen()); n != 1 {
				t.Fatalf("%d writes reached the upstream, want only the one before the revoke", n)
			}
			hist, err := g.store.History(t.Context(), res, 0)
			revoked := slices.IndexFunc(hist, func(e tokens.Event) bool { return e.Kind == tokens.EventRevoked })
			if err != nil || revoked < 0 || hist[revoked].Actor != "admin" || hist[revoked].Token != l.Token {
				t.Fatalf("history = %+v, %v; want a revoked event by admin", hist, err)
			}
			if next := acquireAs(t, g.URL, keyWorkerB, res, time.Second); next.Token != l.Token+1 {
				t.Fatalf("token after revoke = %d, want %d", next.Token, l.Token+1)
			}
			wantProblem(t, do(t, "POST", g.URL+"/v1/leases/fl_unknown/revoke", nil, bearer(keyAdmin)...), http.StatusNotFound, "not_found")
		})
	}
}

// Tokens come only from grants: numbers a client sends, anywhere, change
// nothing the gateway stores or forwards.
func TestSecurityTokenInflation(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	res := "stmt:inflate"
	l := acquireAs(t, g.URL, keyWorkerA, res, 10*time.Second)
	for _, v := range []string{"9223372036854775807", "99999999999999999999999999", "-1", "0x7fffffff", "1e18", " 5", "00000000000000000002"} {
		a := writeAs(t, g.URL, keyWorkerA, "/lines", l, "w", gateway.HeaderToken, v, gateway.HeaderResource, "stmt:other")
		if a.Status != http.StatusOK {
			t.Fatalf("write with Fencing-Token %q: %d %s", v, a.Status, a.Body)
		}
	}
	for _, body := range []map[string]any{
		{"resource": res, "ttl_ms": 1000, "token": int64(1) << 62},
		{"resource": res, "ttl_ms": 1000, "token": -5},
		{"resource": res, "ttl_ms": "1e99"},
		{"resource": res, "ttl_ms": -1},
		{"resource": res, "ttl_ms": 1e30},
	} {
		a := do(t, "POST", g.URL+"/v1/leases", body, bearer(keyWorkerB)...)
		if a.Status == http.StatusCreated {
			t.Fatalf("acquire %v of a held resource succeeded: %s", body, a.Body)
		}
	}
	for _, ttl := range []any{"1e99", -1, 1e30, "0x10"} {
		a := do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/renew", map[string]any{"ttl_ms": ttl}, bearer(keyWorkerA)...)
		if a.Status != http.StatusBadRequest {
			t.Fatalf("renew with ttl_ms %v: %d %s, want 400", ttl, a.Status, a.Body)
		}
	}
	for _, a := range up.seen() {
		if a.Token != l.Token || a.Resource != res || len(a.Header.Values(gateway.HeaderToken)) != 1 {
			t.Fatalf("upstream saw token %v resource %q, want exactly %d for %s", a.Header.Values(gateway.HeaderToken), a.Resource, l.Token, res)
		}
	}
	var state struct{ Token int64 }
	a := do(t, "GET", g.URL+"/v1/resources/"+url.PathEscape(res), nil, bearer(keyViewer)...)
	if err := json.Unmarshal(a.Body, &state); err != nil || state.Token != l.Token {
		t.Fatalf("resource state %s, want token %d", a.Body, l.Token)
	}
	do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil, bearer(keyWorkerA)...)
	if next := acquireAs(t, g.URL, keyWorkerB, res, time.Second); next.Token != l.Token+1 {
		t.Fatalf("next token %d, want %d", next.Token, l.Token+1)
	}
}

// The upstream gets the gateway's credentials and forwarding facts, never
// the client's key or any client-sent Fencing-*, Forwarded or X-Forwarded-*.
func TestSecurityForwardedHeaders(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	l := acquireAs(t, g.URL, keyWorkerA, "stmt:headers", 10*time.Second)
	a := writeAs(t, g.URL, keyWorkerA, "/lines", l, "w",
		"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Host", "evil.example", "X-Forwarded-Proto", "https",
		"X-Forwarded-User", "root", "X-Real-Ip", "6.6.6.6", "Forwarded", "for=6.6.6.6;by=evil",
		"Fencing-Token", "999999", "Fencing-Extra", "x", "Proxy-Authorization", "Basic eA==",
		"Connection", "X-Forwarded-For, Fencing-Token, Fencing-Resource")
	if a.Status != http.StatusOK {
		t.Fatalf("write: %d %s", a.Status, a.Body)
	}
	seen := up.seen()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests", len(seen))
	}
	h := seen[0].Header
	want := map[string][]string{
		"Authorization":       {upstreamSecret},
		"X-Forwarded-For":     {"127.0.0.1"},
		"X-Forwarded-Proto":   {"http"},
		"Fencing-Token":       {fmt.Sprint(l.Token)},
		"Fencing-Resource":    {"stmt:headers"},
		"X-Forwarded-User":    nil,
		"X-Real-Ip":           nil,
		"Forwarded":           nil,
		"Fencing-Lease":       nil,
		"Fencing-Extra":       nil,
		"Proxy-Authorization": nil,
	}
	for k, v := range want {
		if got := h.Values(k); !slices.Equal(got, v) {
			t.Errorf("upstream header %s = %q, want %q", k, got, v)
		}
	}
	if host := h.Get("X-Forwarded-Host"); host == "evil.example" {
		t.Errorf("X-Forwarded-Host is the client's %q", host)
	}
	for _, v := range h {
		for _, s := range v {
			if strings.Contains(s, keyWorkerA) || strings.Contains(s, l.LeaseID) {
				t.Fatalf("a secret reached the upstream: %v", h)
			}
		}
	}
}

// rawRequest sends raw bytes to the gateway and returns all it answered
// until it closed the connection or a second passed.
func rawRequest(t *testing.T, base, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	out, _ := io.ReadAll(bufio.NewReader(c))
	return string(out)
}

// Smuggling: ambiguous or malformed framing never gets a second request to
// the upstream, and paths that could differ from what was checked are
// refused.
func TestSecuritySmugglingAndPaths(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	l := acquireAs(t, g.URL, keyWorkerA, "stmt:smuggle", 30*time.Second)
	head := func(path string) string {
		return "POST /v1/proxy/statements" + path + " HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + keyWorkerA + "\r\nFencing-Lease: " + l.LeaseID + "\r\n"
	}
	smuggled := head("/smuggled") + "Content-Length: 0\r\n\r\n"

	// Content-Length and Transfer-Encoding both: Go would frame by
	// Transfer-Encoding and drop Content-Length (RFC 9112 6.3); the gateway
	// refuses the request (400 naming both, nothing forwarded) and closes
	// the connection, so the bytes a front proxy might have framed by
	// Content-Length are never read as a request.
	body := "0\r\n\r\n" + smuggled
	out := rawRequest(t, g.URL, head("/first")+fmt.Sprintf("Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n", len(body))+body)
	if !strings.HasPrefix(out, "HTTP/1.1 400") || !strings.Contains(out, "Connection: close") || strings.Count(out, "HTTP/1.1 ") != 1 ||
		!strings.Contains(out, `"code":"invalid_request"`) || !strings.Contains(out, `"field":"Content-Length, Transfer-Encoding"`) {
		t.Fatalf("CL+TE answer:\n%s\nwant one 400 invalid_request naming both, with Connection: close", out)
	}
	// Malformed framing and paths: refused before anything is forwarded,
	// and never a second request from the same bytes.
	for name, raw := range map[string]string{
		"two lengths":        head("/two") + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd" + smuggled,
		"gzip,chunked":       head("/te") + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"space before colon": head("/sp") + "Content-Length : 4\r\n\r\nabcd" + smuggled,
		"NUL in a header":    head("/nul") + "X-A: a\x00b\r\nContent-Length: 0\r\n\r\n" + smuggled,
		"dot segments":       head("/a/../b") + "Content-Length: 0\r\n\r\n",
		"encoded dots":       head("/a/%2e%2e/b") + "Content-Length: 0\r\n\r\n",
		"encoded NUL":        head("/a%00b") + "Content-Length: 0\r\n\r\n",
	} {
		if out := rawRequest(t, g.URL, raw); strings.HasPrefix(out, "HTTP/1.1 2") {
			t.Errorf("%s: accepted:\n%s", name, out)
		}
	}
	// A chunked body with bare-LF line ends is found malformed only while it
	// is forwarded: the upstream gets a broken request and no answer is 2xx;
	// the connection is closed, so what follows is not read as a request.
	// A folded Transfer-Encoding (obs-fold) is refused before forwarding.
	for name, raw := range map[string]string{
		"bare LF chunk sizes": head("/lf") + "Transfer-Encoding: chunked\r\n\r\n4\nabcd\n0\n\n" + smuggled,
		"folded TE":           head("/fold") + "Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + smuggled,
	} {
		if out := rawRequest(t, g.URL, raw); strings.Count(out, "HTTP/1.1 ") > 1 {
			t.Errorf("%s: more than one answer:\n%s", name, out)
		}
	}
	var paths []string
	for _, a := range up.seen() {
		if a.Path == "/smuggled" {
			t.Fatal("a smuggled request reached the upstream")
		}
		if a.Path != "/lf" {
			paths = append(paths, a.Path)
		}
	}
	if len(paths) != 0 {
		t.Fatalf("upstream saw %q, refused requests among them", paths)
	}
}

// Framing on a keep-alive connection, through a real listener and a
// recording upstream: Content-Length alone and Transfer-Encoding alone are
// forwarded; a request with both is refused (400 naming both, the
// connection closed) even after a good one on the same connection; an
// unsupported transfer coding is the gateway's 400 too (in place of the
// 501 Go's server writes itself). Only the good requests reach the
// upstream.
func TestSecuritySmugglingFraming(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	l := acquireAs(t, g.URL, keyWorkerA, "stmt:framing", 30*time.Second)
	head := func(path string) string {
		return "POST /v1/proxy/statements" + path + " HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + keyWorkerA + "\r\nFencing-Lease: " + l.LeaseID + "\r\n"
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	read := func() (*http.Response, string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	// Content-Length alone, twice on one connection.
	for _, p := range []string{"/cl1", "/cl2"} {
		_, _ = io.WriteString(c, head(p)+"Content-Length: 5\r\n\r\nhello")
		if resp, body := read(); resp.StatusCode != 200 || resp.Close {
			t.Fatalf("%s: %d close=%v %s", p, resp.StatusCode, resp.Close, body)
		}
	}
	// Then both: refused, the connection closed.
	_, _ = io.WriteString(c, head("/both")+"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+head("/smuggled")+"Content-Length: 0\r\n\r\n")
	resp, body := read()
	if resp.StatusCode != http.StatusBadRequest || !resp.Close || !strings.Contains(body, `"code":"invalid_request"`) ||
		!strings.Contains(body, "Content-Length") || !strings.Contains(body, "Transfer-Encoding") {
		t.Fatalf("both: %d close=%v %s", resp.StatusCode, resp.Close, body)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection stayed open after the refusal")
	}

	// Transfer-Encoding alone: forwarded, then the connection is closed.
	out := rawRequest(t, g.URL, head("/te")+"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"+head("/smuggled")+"Content-Length: 0\r\n\r\n")
	if !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.Contains(out, "Connection: close") || strings.Count(out, "HTTP/1.1 ") != 1 {
		t.Fatalf("TE alone:\n%s", out)
	}
	// Oddities Go would refuse itself with 501: the gateway's 400 naming
	// the field, nothing forwarded.
	for _, te := range []string{"chunked, identity", "identity", "gzip"} {
		out := rawRequest(t, g.URL, head("/odd")+"Transfer-Encoding: "+te+"\r\nContent-Length: 5\r\n\r\nhello")
		if !strings.HasPrefix(out, "HTTP/1.1 400") || strings.Count(out, "HTTP/1.1 ") != 1 ||
			!strings.Contains(out, `"code":"invalid_request"`) || !strings.Contains(out, `"field":"Transfer-Encoding"`) {
			t.Fatalf("Transfer-Encoding: %s:\n%s", te, out)
		}
	}
	var paths []string
	for _, a := range up.seen() {
		paths = append(paths, a.Path)
		if a.Path != "/odd" && a.Body != "hello" {
			t.Errorf("%s: upstream got body %q", a.Path, a.Body)
		}
	}
	if strings.Join(paths, " ") != "/cl1 /cl2 /te" {
		t.Fatalf("upstream got %q, want /cl1 /cl2 /te", paths)
	}
}

// Clients sending their body slowly (a byte at a time) or stalling after
// part of it are cut off after the body timeout with 408 request_timeout
// naming the body, while a normal worker's writes through the same gateway
// keep completing; the upstream never gets a slow client's whole body.
func TestSecuritySlowClientCutOff(t *testing.T) {
	const bodyTimeout = 2 * time.Second
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{bodyTimeout: bodyTimeout, drainPeriod: 100 * time.Millisecond})
	slowLease := acquireAs(t, g.URL, keyWorkerB, "stmt:slow", 30*time.Second)
	fast := acquireAs(t, g.URL, keyWorkerA, "stmt:fast", 30*time.Second)

	type cutOff struct {
		after  time.Duration
		answer string
	}
	var wg sync.WaitGroup
	cut := make(chan cutOff, 4)
	firstCut := make(chan struct{}) // closed when the first slow client is cut off (or gives up)
	var firstCutOnce sync.Once
	for i := range 4 { // a few slow clients at once: two trickle, two stall
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			start := time.Now()
			_, _ = io.WriteString(c, "POST /v1/proxy/statements/slow HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "+keyWorkerB+
				"\r\nFencing-Lease: "+slowLease.LeaseID+"\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("x", 1000))
			var answer []byte
			buf := make([]byte, 4096)
			for time.Since(start) < 10*time.Second {
				if i%2 == 0 { // one byte every 100 ms, until the gateway gives up on us
					if _, err := c.Write([]byte("x")); err != nil {
						break
					}
				}
				_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				n, err := c.Read(buf)
				answer = append(answer, buf[:n]...)
				if err != nil && !isTimeout(err) {
					break // closed
				}
			}
			firstCutOnce.Do(func() { close(firstCut) })
			cut <- cutOff{time.Since(start), string(answer)}
		}()
	}

	// The normal worker writes while the slow clients hold their
	// connections: some of its writes must complete before the first slow
	// client is let go (a gateway that made it wait behind them would
	// answer it only after a cut-off). How fast is logged, not asserted.
	var worst time.Duration
	n, during := 0, 0
	for stop := false; !stop; n++ {
		start := time.Now()
		if a := writeAs(t, g.URL, keyWorkerA, "/lines", fast, "fast"); a.Status != http.StatusOK {
			t.Fatalf("normal write %d: %d %s", n, a.Status, a.Body)
		}
		worst = max(worst, time.Since(start))
		select {
		case <-firstCut:
			stop = true
		default:
			during++
		}
	}
	if during == 0 {
		t.Errorf("no normal write completed while the slow clients were connected (%d after the first was cut off)", n)
	}
	wg.Wait()
	close(cut)
	for c := range cut {
		resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(c.answer)), nil)
		if err != nil {
			t.Fatalf("a slow client's answer %q: %v", c.answer, err)
		}
		var p problemJSON
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(b, &p) != nil || p.Code != "request_timeout" || p.Field != "body" || !resp.Close {
			t.Fatalf("a slow client got %d %v %s; want 408 request_timeout naming the body, Connection: close", resp.StatusCode, resp.Header, b)
		}
		t.Logf("slow client cut off after %v: %s", c.after, p.Detail)
	}
	t.Logf("normal worker: %d writes while the slow clients were connected, slowest %v", during, worst)
	for _, a := range up.seen() {
		if a.Path == "/slow" && len(a.Body) == 100000 {
			t.Fatal("a slow client's whole body reached the upstream")
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Per-key rate limits answer 429 with Retry-After; per-key caps on TTL and
// on live leases hold.
func TestSecurityLimits(t *testing.T) {
	up := newUpstream(t)
	g := startSecureEmbedded(t, map[string]string{"statements": up.URL}, secureOptions{})
	var limited answer
	for range 10 { // rate 2/s, burst 2
		if limited = do(t, "GET", g.URL+"/v1/rejections", nil, bearer(keyLimited)...); limited.Status == http.StatusTooManyRequests {
			break
		}
	}
	wantProblem(t, limited, http.StatusTooManyRequests, "rate_limited")
	if ra := limited.Header.Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After %q, want 1", ra)
	}
	// Other keys are not affected.
	if a := do(t, "GET", g.URL+"/v1/rejections", nil, bearer(keyViewer)...); a.Status != http.StatusOK {
		t.Fatalf("another key: %d", a.Status)
	}

	a := do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "stmt:cap", "ttl_ms": 5000}, bearer(keyBilling)...)
	wantProblem(t, a, http.StatusBadRequest, "invalid_request")
	if a.Problem.Field != "ttl_ms" {
		t.Fatalf("field %q, want ttl_ms", a.Problem.Field)
	}
	l := acquireAs(t, g.URL, keyBilling, "stmt:cap", 2*time.Second)
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/renew", map[string]any{"ttl_ms": 3000}, bearer(keyBilling)...), http.StatusBadRequest, "invalid_request")
	a = do(t, "POST", g.URL+"/v1/leases", map[string]any{"resource": "stmt:cap2", "ttl_ms": 1000}, bearer(keyBilling)...)
	wantProblem(t, a, http.StatusTooManyRequests, "too_many_leases")
	do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil, bearer(keyBilling)...)
	acquireAs(t, g.URL, keyBilling, "stmt:cap2", time.Second)
}
