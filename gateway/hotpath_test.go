package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// countWrites makes the gateway's upstream connections count their Write
// calls (each one is a write system call: the Transport writes through its
// own bufio.Writer).
func countWrites(tg *testGateway) *atomic.Int64 {
	var n atomic.Int64
	dial := tg.g.transport.DialContext
	tg.g.transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &n}, nil
	}
	return &n
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A small write reaches the upstream in one write (head and body together),
// with its body and Content-Length intact; a larger one, a chunked one and
// one that expects 100-continue still stream, and arrive intact too.
func TestSmallBodyForwardedInOneWrite(t *testing.T) {
	up := &recorder{}
	var got sync.Map // path -> what the upstream saw of the framing
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		got.Store(r.URL.Path, strconv.FormatInt(r.ContentLength, 10)+" "+strings.Join(r.TransferEncoding, ",")+" "+r.Header.Get("Expect"))
		up.add(recorded{Path: r.URL.Path, Body: string(body), Complete: err == nil})
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	tg := startFraming(t, up.URL, Config{}, false)
	writes := countWrites(tg)
	lease := tg.lease(t, "r")
	client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	send := func(path, body string, edit func(*http.Request)) int64 {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+tg.addr+"/v1/proxy/svc"+path, strings.NewReader(body))
		req.Header.Set(HeaderLease, lease)
		if edit != nil {
			edit(req)
		}
		before := writes.Load()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		return writes.Load() - before
	}
	small := strings.Repeat("s", 300)
	if n := send("/small", small, nil); n != 1 {
		t.Errorf("a %d-byte write took %d writes to the upstream, want 1", len(small), n)
	}
	if n := send("/edge", strings.Repeat("e", smallBody), nil); n < 1 {
		t.Errorf("a %d-byte write took %d writes", smallBody, n)
	}
	big := strings.Repeat("b", smallBody+1)
	if n := send("/big", big, nil); n < 2 {
		t.Errorf("a %d-byte write took %d writes, want the head and the streamed body apart", len(big), n)
	}
	send("/chunked", small, func(r *http.Request) { r.ContentLength = -1; r.Body = io.NopCloser(strings.NewReader(small)) })
	send("/expect", small, func(r *http.Request) { r.Header.Set("Expect", "100-continue") })

	want := map[string]struct{ body, framing string }{
		"/small":   {small, "300  "},
		"/edge":    {strings.Repeat("e", smallBody), strconv.Itoa(smallBody) + "  "},
		"/big":     {big, strconv.Itoa(len(big)) + "  "},
		"/chunked": {small, "-1 chunked "},
		"/expect":  {small, "300  100-continue"},
	}
	seen := map[string]bool{}
	for _, r := range up.seen() {
		w, ok := want[r.Path]
		if !ok || !r.Complete || r.Body != w.body {
			t.Fatalf("upstream got %s with a body of %d bytes (complete %v)", r.Path, len(r.Body), r.Complete)
		}
		framing, _ := got.Load(r.Path)
		if framing != w.framing {
			t.Errorf("%s reached the upstream framed %q, want %q", r.Path, framing, w.framing)
		}
		seen[r.Path] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("upstream saw %v, want %d paths", seen, len(want))
	}
}

// A small body that stalls or is cut short is answered before anything is
// forwarded: 408 or 400 naming the body, the upstream never sees the write,
// and the resource does not drain (the outcome is known).
func TestSmallBodyFailsBeforeForward(t *testing.T) {
	const bodyTimeout = 300 * time.Millisecond
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{BodyTimeout: bodyTimeout}, false)
	for _, c := range []struct {
		name   string
		cut    bool // close the sending side instead of stalling
		status int
		code   string
	}{
		{"stalled", false, http.StatusRequestTimeout, problems.CodeRequestTimeout},
		{"cut", true, http.StatusBadRequest, tokens.CodeInvalidRequest},
	} {
		lease := tg.lease(t, c.name)
		conn := tg.dial(t)
		raw := "POST /v1/proxy/svc/" + c.name + " HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\nContent-Length: 100\r\n\r\n" + strings.Repeat("x", 10)
		if _, err := io.WriteString(conn, raw); err != nil {
			t.Fatal(err)
		}
		if c.cut {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
		answers, bodies, _ := readAnswers(t, conn)
		if c.cut {
			// net/http may close before the answer goes out to a client
			// that is gone; what matters is what the upstream saw.
			if len(answers) > 0 && answers[0].StatusCode != c.status {
				t.Fatalf("%s: %d %s", c.name, answers[0].StatusCode, bodies[0])
			}
		} else {
			var p problem
			if len(answers) != 1 || answers[0].StatusCode != c.status || json.Unmarshal([]byte(bodies[0]), &p) != nil ||
				p.Code != c.code || p.Field != "body" || !strings.Contains(p.Detail, "nothing was forwarded") {
				t.Fatalf("%s: %d answers %v, want %d %s naming the body", c.name, len(answers), bodies, c.status, c.code)
			}
		}
		res, err := tg.svc.Resource(context.Background(), c.name)
		if err != nil {
			t.Fatal(err)
		}
		if res.DrainUntil.After(time.Now()) {
			t.Fatalf("%s: the resource drains after a write that was never forwarded: %+v", c.name, res)
		}
	}
	for _, r := range up.seen() {
		t.Fatalf("the upstream got %s", r.Path)
	}
	out := httptest.NewRecorder()
	tg.g.ServeHTTP(out, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(out.Body.String(), `fencegw_writes_total{outcome="bad_request"} 2`) {
		t.Fatalf("metrics: want 2 bad requests\n%s", out.Body.String())
	}
}

// The shortcut to the proxy answers every request exactly as the router
// would: the same status and body for paths in and around /v1/proxy/, raw
// paths chi matches differently, and methods chi does not route.
func TestDispatchAgreesWithRouter(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	si := tg.g.controlServer(false)
	router := tg.g.routes(si)
	direct := tg.g.dispatch(router, tg.g.acquireHandler(si))
	paths := []string{"/v1/proxy/svc/a", "/v1/proxy/nope/a", "/v1/proxy/", "/v1/proxy", "/v1/proxyx/svc/a",
		"/v1/%70roxy/svc/a", "/v1/proxy/svc/%2e%2e/x", "/v1/proxy/svc%2Fa", "/V1/proxy/svc/a", "/v1/leases"}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "QUERY", "PURGE", "get", "PROPFIND"}
	for _, p := range paths {
		for _, m := range methods {
			req := func() *http.Request {
				r := httptest.NewRequest("GET", "http://gw"+p, strings.NewReader("x"))
				r.Method = m
				return r
			}
			a, b := httptest.NewRecorder(), httptest.NewRecorder()
			direct.ServeHTTP(a, req())
			router.ServeHTTP(b, req())
			if a.Code != b.Code || a.Body.String() != b.Body.String() {
				t.Errorf("%s %s: shortcut %d %s, router %d %s", m, p, a.Code, a.Body, b.Code, b.Body)
			}
		}
	}
	if len(up.seen()) != 0 {
		t.Fatalf("the upstream got %v", up.seen())
	}
}

// keyAuth is a fixed set of bearer keys: "viewer", "worker" and
// "narrow" (a worker limited to resources under "other/").
type keyAuth struct{}

func (keyAuth) Authenticate(r *http.Request) (*Principal, error) {
	switch r.Header.Get("Authorization") {
	case "Bearer viewer":
		return &Principal{Name: "viewer", Role: RoleViewer}, nil
	case "Bearer worker":
		return &Principal{Name: "worker", Role: RoleWorker}, nil
	case "Bearer narrow":
		return &Principal{Name: "narrow", Role: RoleWorker, Resources: []string{"other/"}}, nil
	}
	return nil, ErrUnauthenticated
}

func (keyAuth) Allow(*Principal) (bool, time.Duration) { return true, 0 }

// With authentication on, the shortcuts (fenced writes and POST
// /v1/leases) authenticate and check roles exactly as the router's
// middleware does: no key 401, a viewer 403, a worker through to the lease
// check (or, for an acquire, the body's).
func TestDispatchAgreesWithRouterWithAuth(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{Auth: keyAuth{}}, false)
	si := tg.g.controlServer(false)
	router := tg.g.routes(si)
	direct := tg.g.dispatch(router, tg.g.acquireHandler(si))
	seen := map[int]bool{}
	for _, key := range []string{"", "Bearer nope", "Bearer viewer", "Bearer worker", "Bearer narrow"} {
		for _, p := range []string{"/v1/proxy/svc/a", "/v1/proxy/nope/a", "/v1/%70roxy/svc/a", "/v1/leases", "/v1/le%61ses"} {
			for _, m := range []string{"POST", "GET", "PURGE"} {
				req := func() *http.Request {
					r := httptest.NewRequest("GET", "http://gw"+p, strings.NewReader("x"))
					r.Method = m
					if key != "" {
						r.Header.Set("Authorization", key)
					}
					return r
				}
				a, b := httptest.NewRecorder(), httptest.NewRecorder()
				direct.ServeHTTP(a, req())
				router.ServeHTTP(b, req())
				if a.Code != b.Code || a.Body.String() != b.Body.String() || a.Header().Get("WWW-Authenticate") != b.Header().Get("WWW-Authenticate") {
					t.Errorf("%q %s %s: shortcut %d %s, router %d %s", key, m, p, a.Code, a.Body, b.Code, b.Body)
				}
				seen[a.Code] = true
			}
		}
	}
	if !seen[http.StatusUnauthorized] || !seen[http.StatusForbidden] || !seen[http.StatusBadRequest] {
		t.Fatalf("answers seen %v: want 401, 403 and (a worker without a lease) 400 among them", seen)
	}
	if len(up.seen()) != 0 {
		t.Fatalf("the upstream got %v", up.seen())
	}
}
