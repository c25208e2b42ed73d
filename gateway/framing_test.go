package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"github.com/fencegw/fencegw/gateway/internal/framing"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/internal/testcert"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// recorder is an upstream that records what reached it.
type recorder struct {
	*httptest.Server
	mu  sync.Mutex
	got []recorded
}

type recorded struct {
	Path, Body, Proto string
	Complete          bool // the body was read to its end
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	rec := &recorder{}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			rec.add(recorded{Path: r.URL.Path, Complete: true})
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			_ = brw.Flush()
			_, _ = io.Copy(c, brw)
			return
		}
		body, err := io.ReadAll(r.Body)
		rec.add(recorded{Path: r.URL.Path, Body: string(body), Proto: r.Header.Get("X-Forwarded-Proto"), Complete: err == nil})
		_, _ = io.WriteString(w, "ok "+r.URL.Path)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (r *recorder) add(x recorded) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
}

func (r *recorder) seen() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.got...)
}

type testGateway struct {
	g    *Gateway
	addr string
	svc  *tokens.Service
	tls  *tls.Config // the client's, with TLS
}

// startFraming serves a gateway through Listener on a real server, as
// cmd/fencegw does; tlsConfig switches TLS on.
func startFraming(t testing.TB, up string, cfg Config, tlsOn bool) *testGateway {
	t.Helper()
	return startFramingWith(t, up, cfg, tlsOn, nil)
}

// startFramingWith is startFraming with setup given the store and the
// server first (to build what needs the store, Config.Idempotency, or to
// watch the server's connections).
func startFramingWith(t testing.TB, up string, cfg Config, tlsOn bool, setup func(*bolt.Store, *Config, *http.Server)) *testGateway {
	t.Helper()
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	if setup != nil {
		setup(store, &cfg, srv)
	}
	target, _ := url.Parse(up)
	cfg.Upstreams, cfg.Logger = map[string]*url.URL{"svc": target}, log
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: log, DrainPeriod: time.Minute})
	g := New(svc, cfg)
	srv.Handler = g
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &testGateway{g: g, svc: svc, addr: ln.Addr().String()}
	var serverTLS *tls.Config
	if tlsOn {
		serverTLS, tg.tls = testCertificate(t)
	}
	served := listenFraming(srv, ln, serverTLS)
	go func() { _ = srv.Serve(served) }()
	t.Cleanup(func() {
		g.Close()
		_ = srv.Close()
	})
	return tg
}

// listenFraming is how startFramingWith serves its gateway: Listener, the
// gateway's own loop in front of Go's server, unless a test says otherwise
// (netHTTPOnly).
var listenFraming = Listener

// netHTTPOnly serves every request with Go's server alone, as the
// reference the own loop is held to: the listener without the loop.
func netHTTPOnly(srv *http.Server, ln net.Listener, tlsConfig *tls.Config) ServingListener {
	return framing.Listener(srv, ln, tlsConfig, framingRefusal, nil)
}

// withNetHTTPOnly runs start with the gateways it starts served by Go's
// server alone.
func withNetHTTPOnly[T any](start func() T) T {
	listenFraming = netHTTPOnly
	defer func() { listenFraming = Listener }()
	return start()
}

func testCertificate(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	c := testcert.New(t)
	return &tls.Config{Certificates: []tls.Certificate{c.TLS}},
		&tls.Config{RootCAs: c.Pool, NextProtos: []string{"h2", "http/1.1"}}
}

func (tg *testGateway) dial(t *testing.T) net.Conn {
	t.Helper()
	var c net.Conn
	var err error
	if tg.tls != nil {
		c, err = tls.Dial("tcp", tg.addr, tg.tls)
	} else {
		c, err = net.Dial("tcp", tg.addr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (tg *testGateway) lease(t testing.TB, resource string) string {
	t.Helper()
	return tg.leaseTTL(t, resource, time.Minute)
}

func (tg *testGateway) leaseTTL(t testing.TB, resource string, ttl time.Duration) string {
	t.Helper()
	p, err := tg.svc.Acquire(context.Background(), tokens.AcquireRequest{Resource: resource, Holder: "h", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// exchange writes raw to a fresh connection and reads answers until the
// gateway closes it (closed) or nothing more comes for a second.
func (tg *testGateway) exchange(t *testing.T, raw string) (answers []*http.Response, bodies []string, closed bool) {
	t.Helper()
	c := tg.dial(t)
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return readAnswers(t, c)
}

func readAnswers(t *testing.T, c net.Conn) (answers []*http.Response, bodies []string, closed bool) {
	t.Helper()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			if errorsAs(err, &ne) && ne.Timeout() {
				return answers, bodies, false
			}
			return answers, bodies, true // EOF or reset: closed
		}
		b, _ := io.ReadAll(resp.Body)
		answers, bodies = append(answers, resp), append(bodies, string(b))
	}
}

func errorsAs(err error, target *net.Error) bool {
	for err != nil {
		if ne, ok := err.(net.Error); ok {
			*target = ne
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

func wantFramingRefusal(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != problemContentType || !resp.Close {
		t.Fatalf("answer %d %v close=%v, want 400 problem+json with Connection: close\n%s", resp.StatusCode, resp.Header, resp.Close, body)
	}
	var p problem
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Code != tokens.CodeInvalidRequest || p.Field == "" {
		t.Fatalf("problem %s, want invalid_request naming a field", body)
	}
}

func TestFrameRefusesContentLengthWithTransferEncoding(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[tlsOn], func(t *testing.T) {
			up := newRecorder(t)
			tg := startFraming(t, up.URL, Config{}, tlsOn)
			lease := tg.lease(t, "r")
			head := func(path string) string {
				return "POST /v1/proxy/svc" + path + " HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n"
			}
			smuggled := head("/smuggled") + "Content-Length: 0\r\n\r\n"
			body := "0\r\n\r\n" + smuggled

			// Content-Length and Transfer-Encoding: 400, closed, nothing forwarded.
			answers, bodies, closed := tg.exchange(t, head("/both")+"Content-Length: "+strconv.Itoa(len(body))+"\r\nTransfer-Encoding: chunked\r\n\r\n"+body)
			if len(answers) != 1 || !closed {
				t.Fatalf("%d answers, closed %v: %q", len(answers), closed, bodies)
			}
			wantFramingRefusal(t, answers[0], bodies[0])
			var p problem
			_ = json.Unmarshal([]byte(bodies[0]), &p)
			if p.Field != "Content-Length, Transfer-Encoding" || !strings.Contains(p.Detail, "both") {
				t.Fatalf("problem %+v does not name the framing fields", p)
			}

			// Transfer-Encoding alone: forwarded, then the connection closes.
			answers, bodies, closed = tg.exchange(t, head("/chunked")+"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+smuggled)
			if len(answers) != 1 || answers[0].StatusCode != 200 || !answers[0].Close || !closed {
				t.Fatalf("chunked: %d answers %q, closed %v", len(answers), bodies, closed)
			}

			// Content-Length alone, keep-alive, then an ambiguous one on the
			// same connection: the first is forwarded, the second refused.
			c := tg.dial(t)
			_, _ = io.WriteString(c, head("/first")+"Content-Length: 3\r\n\r\nabc")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 || resp.Close {
				t.Fatalf("first: %v %v", resp, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_, _ = io.WriteString(c, head("/second")+"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n")
			resp, err = http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			wantFramingRefusal(t, resp, string(b))

			var paths []string
			for _, r := range up.seen() {
				paths = append(paths, r.Path)
				if tlsOn != (r.Proto == "https") {
					t.Errorf("X-Forwarded-Proto %q with TLS %v", r.Proto, tlsOn)
				}
			}
			if strings.Join(paths, " ") != "/chunked /first" {
				t.Fatalf("upstream got %q, want /chunked /first", paths)
			}
		})
	}
}

// Odd framing is refused by Go itself or by the gateway, with the gateway's
// 400 problem either way (in place of Go's own plain-text 400, and of the
// 501 it writes for a Transfer-Encoding other than one "chunked"); nothing
// reaches the upstream, and the connection is closed.
func TestFrameOddities(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	head := "POST /v1/proxy/svc/odd HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n"
	smuggled := "POST /v1/proxy/svc/smuggled HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\nContent-Length: 0\r\n\r\n"
	for name, tc := range map[string]struct {
		raw    string
		status int
	}{
		"chunked, identity":         {head + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"identity and length":       {head + "Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"two TE fields":             {head + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"CHUNKED and length":        {head + "Transfer-Encoding: CHUNKED\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"lower case both":           {head + "content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"length after chunked":      {head + "Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"folded TE":                 {head + "Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"fold hiding a TE":          {head + "X-A: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"Transfer_Encoding":         {head + "Transfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"same length twice":         {head + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"two lengths":               {head + "Content-Length: 3\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"HTTP/1.0 with both":        {strings.Replace(head, "HTTP/1.1", "HTTP/1.0", 1) + "Connection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"HTTP/1.0 with TE":          {strings.Replace(head, "HTTP/1.1", "HTTP/1.0", 1) + "Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"expect 100 with both":      {head + "Expect: 100-continue\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
		"both on a control call":    {"POST /v1/leases HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"both on a probe":           {"GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"both on OPTIONS *":         {"OPTIONS * HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"space before the colon":    {head + "Content-Length : 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"length with a sign":        {head + "Content-Length: +5\r\n\r\n0\r\n\r\n" + smuggled, 400},
		"bare CR in a header value": {head + "X-A: 1\rTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled, 400},
	} {
		t.Run(name, func(t *testing.T) {
			answers, bodies, closed := tg.exchange(t, tc.raw)
			if len(answers) != 1 || answers[0].StatusCode != tc.status || !closed {
				t.Fatalf("%d answers %q, closed %v; want one %d and the connection closed", len(answers), bodies, closed, tc.status)
			}
			wantFramingRefusal(t, answers[0], bodies[0])
		})
	}
	if got := up.seen(); len(got) != 0 {
		t.Fatalf("upstream got %+v", got)
	}
}

// What Go's server refuses itself, before any handler, is answered with
// the gateway's problem, not Go's plain text: 400 invalid_request saying
// in net/http's words what is wrong (or what the scanner found), 431 for a
// head too large, 417 for an expectation other than 100-continue; the
// status stays Go's. Nothing reaches the upstream.
func TestFrameGoOwnRefusalsAreProblems(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	line := "POST /v1/proxy/svc/own HTTP/1.1\r\n"
	fence := "Fencing-Lease: " + lease + "\r\nContent-Length: 0\r\n"
	for _, tc := range []struct {
		name, raw     string
		status        int
		field, detail string
	}{
		{"no Host", line + fence + "\r\n", 400, "Host", "missing required Host header"},
		{"bad Host", line + "Host: a b\r\n" + fence + "\r\n", 400, "Host", "malformed Host header"},
		{"two Hosts", line + "Host: a\r\nHost: b\r\n" + fence + "\r\n", 400, "headers", "400 Bad Request"},
		{"no colon", line + "Host: gw\r\nX-A\r\n" + fence + "\r\n", 400, "headers", "malformed"},
		{"bad request line", "POST /v1/proxy/svc/own\r\nHost: gw\r\n" + fence + "\r\n", 400, "headers", "400 Bad Request"},
		{"head too large", line + "Host: gw\r\nX-A: " + strings.Repeat("a", 100<<10) + "\r\n" + fence + "\r\n", 431, "headers", "431 Request Header Fields Too Large"},
		{"other expectation", line + "Host: gw\r\nExpect: something\r\n" + fence + "\r\n", 417, "Expect", "100-continue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answers, bodies, closed := tg.exchange(t, tc.raw)
			if len(answers) != 1 || !closed {
				t.Fatalf("%d answers %q, closed %v; want one and the connection closed", len(answers), bodies, closed)
			}
			resp := answers[0]
			var p problem
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != problemContentType || !resp.Close ||
				json.Unmarshal([]byte(bodies[0]), &p) != nil || p.Status != tc.status || p.Code != tokens.CodeInvalidRequest ||
				p.Field != tc.field || !strings.Contains(p.Detail, tc.detail) {
				t.Fatalf("%d %v close=%v %s; want a %d invalid_request problem naming %s and saying %q",
					resp.StatusCode, resp.Header, resp.Close, bodies[0], tc.status, tc.field, tc.detail)
			}
		})
	}
	if got := up.seen(); len(got) != 0 {
		t.Fatalf("upstream got %+v", got)
	}
}

// Requests that are fine keep working: pipelined, with a CRLF after a
// POST body, Expect: 100-continue. (Upgrades are refused on /v1/proxy/:
// TestProxyRefusesTunnels.)
func TestFrameKeepsGoodRequests(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	req := func(path, extra, body string) string {
		return "POST /v1/proxy/svc" + path + " HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n" + extra +
			"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	answers, bodies, closed := tg.exchange(t, req("/p1", "", "a")+"\r\n"+req("/p2", "", "GET / HTTP/1.1\r\n\r\n")+
		"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
	if len(answers) != 3 || closed || bodies[0] != "ok /p1" || bodies[1] != "ok /p2" || bodies[2] != "ok\n" {
		t.Fatalf("pipelined: %d answers %q, closed %v", len(answers), bodies, closed)
	}

	c := tg.dial(t)
	_, _ = io.WriteString(c, req("/expect", "Expect: 100-continue\r\n", ""))
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("expect with an empty body: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_, _ = io.WriteString(c, strings.Replace(req("/expect2", "Expect: 100-continue\r\n", "xyz"), "xyz", "", 1))
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 100 {
		t.Fatalf("want 100 Continue: %v %v", resp, err)
	}
	_, _ = io.WriteString(c, "xyz")
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after 100 Continue: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)

	var paths []string
	for _, r := range up.seen() {
		paths = append(paths, r.Path)
	}
	if strings.Join(paths, " ") != "/p1 /p2 /expect /expect2" {
		t.Fatalf("upstream got %q", paths)
	}
}

// Over TLS the gateway answers HTTP/1.1 (ALPN http/1.1, no h2), sets the
// request's TLS state, and the upstream is told https.
func TestFrameTLS(t *testing.T) {
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{}, true)
	lease := tg.lease(t, "r")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tg.tls, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "https://"+tg.addr+"/v1/proxy/svc/tls", strings.NewReader("body"))
	req.Header.Set(HeaderLease, lease)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("%d %s %s", resp.StatusCode, resp.Proto, b)
	}
	if got := up.seen(); len(got) != 1 || got[0].Proto != "https" || got[0].Body != "body" {
		t.Fatalf("upstream got %+v", got)
	}
	// Plain HTTP to the TLS port: the gateway's 400 problem, where
	// net/http writes plain text.
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(c)
	resp, err = http.ReadResponse(bufio.NewReader(bytes.NewReader(out)), nil)
	var p problem
	if err != nil || resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != problemContentType ||
		json.NewDecoder(resp.Body).Decode(&p) != nil || p.Code != tokens.CodeInvalidRequest || !strings.Contains(p.Detail, "HTTPS") {
		t.Fatalf("plain HTTP to the TLS port: %q", out)
	}
}

// A client that sends part of its body and stalls gets 408 request_timeout
// naming the body, the upstream never gets the whole write, the resource
// drains (the upstream may have acted on the part it got), and a normal
// write on another resource goes through meanwhile. Control calls with a
// stalled body get 408 too.
// Over TLS too: the connection's deadlines take effect at its next read
// (framing/deadline.go), and under TLS a read may have to finish a record
// the client stalled in.
func TestBodyTimeoutAnswers408(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "TLS"}[tlsOn], func(t *testing.T) { testBodyTimeout(t, tlsOn) })
	}
}

func testBodyTimeout(t *testing.T, tlsOn bool) {
	const bodyTimeout = 300 * time.Millisecond
	up := newRecorder(t)
	tg := startFraming(t, up.URL, Config{BodyTimeout: bodyTimeout}, tlsOn)
	slow := tg.lease(t, "slow")
	fast := tg.lease(t, "fast")

	type result struct {
		resp *http.Response
		body string
		err  error
	}
	// midRecord: over TLS, raw's head goes in a record of its own, and
	// the last bytes of the record that carries its body are held back,
	// so that the gateway's read of the body waits inside a record.
	stallAt := func(raw string, midRecord bool) <-chan result {
		done := make(chan result, 1)
		var c net.Conn
		if midRecord {
			tcp, err := net.Dial("tcp", tg.addr)
			if err != nil {
				t.Fatal(err)
			}
			held := &holdBack{Conn: tcp}
			cfg := tg.tls.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(tg.addr)
			tc := tls.Client(held, cfg)
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			// The head in a whole record, then the body's record cut.
			i := strings.Index(raw, "\r\n\r\n") + 4
			if _, err := io.WriteString(tc, raw[:i]); err != nil {
				t.Fatal(err)
			}
			held.hold.Store(true)
			raw = raw[i:]
			t.Cleanup(func() { _ = tc.Close() })
			c = tc
		} else {
			c = tg.dial(t)
		}
		go func() {
			if _, err := io.WriteString(c, raw); err != nil {
				done <- result{err: err}
				return
			}
			// Nothing more is sent; the answer must come within generous bounds.
			_ = c.SetReadDeadline(time.Now().Add(bodyTimeout + 10*time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				done <- result{err: err}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			if _, err := br.ReadByte(); err == nil {
				done <- result{err: io.ErrUnexpectedEOF} // not closed after the answer
				return
			}
			done <- result{resp: resp, body: string(b)}
		}()
		return done
	}
	stall := func(raw string) <-chan result { return stallAt(raw, false) }
	writeHead := "POST /v1/proxy/svc/slow HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + slow + "\r\n"
	stalled := []<-chan result{
		stall(writeHead + "Content-Length: 100\r\n\r\n" + strings.Repeat("x", 10)),
		stall(writeHead + "Transfer-Encoding: chunked\r\n\r\na\r\n" + strings.Repeat("y", 10) + "\r\n"),
		stall("POST /v1/leases HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"resource\":"),
	}
	if tlsOn {
		// Part of the body in a record of which the gateway gets all but
		// the last bytes: a small body is read whole before the forward,
		// so nothing is forwarded.
		stalled = append(stalled, stallAt(writeHead+"Content-Length: 100\r\n\r\n"+strings.Repeat("z", 40), true))
	}

	// A normal worker meanwhile.
	client, scheme := http.DefaultClient, "http://"
	if tlsOn {
		tr := &http.Transport{TLSClientConfig: tg.tls}
		defer tr.CloseIdleConnections()
		client, scheme = &http.Client{Transport: tr}, "https://"
	}
	for range 3 {
		req, _ := http.NewRequest("POST", scheme+tg.addr+"/v1/proxy/svc/fast", strings.NewReader("fast write"))
		req.Header.Set(HeaderLease, fast)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.Do(req.WithContext(ctx))
		if err != nil {
			cancel()
			t.Fatalf("a normal write while slow clients stall: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != 200 {
			t.Fatalf("a normal write while slow clients stall: %d", resp.StatusCode)
		}
	}

	for i, ch := range stalled {
		r := <-ch
		if r.err != nil {
			t.Fatalf("stalled client %d: %v", i, r.err)
		}
		var p problem
		if r.resp.StatusCode != http.StatusRequestTimeout || r.resp.Header.Get("Content-Type") != problemContentType || !r.resp.Close ||
			json.Unmarshal([]byte(r.body), &p) != nil || p.Code != problems.CodeRequestTimeout || p.Field != "body" {
			t.Fatalf("stalled client %d: %d %v\n%s\nwant 408 request_timeout naming the body, Connection: close", i, r.resp.StatusCode, r.resp.Header, r.body)
		}
		t.Logf("stalled client %d: %s", i, p.Detail)
	}
	for _, r := range up.seen() {
		if r.Path == "/slow" && r.Complete {
			t.Fatalf("the upstream got a complete slow write: %+v", r)
		}
	}
	// The chunked forward left the upstream with an incomplete request
	// whose outcome is unknown: the resource drains. (The small
	// Content-Length body is read in whole before a forward, so that one
	// was never forwarded: TestSmallBodyFailsBeforeForward.) The drain is
	// recorded in the background, its fence held meanwhile (tokens/drain.go):
	// the answers do not wait for it.
	if err := tg.svc.WaitDrains(t.Context()); err != nil {
		t.Fatal(err)
	}
	res, err := tg.svc.Resource(context.Background(), "slow")
	if err != nil {
		t.Fatal(err)
	}
	if !res.DrainUntil.After(time.Now()) {
		t.Fatalf("resource not draining after a cut write: %+v", res)
	}
	// Metrics count them as bad requests, not upstream errors.
	out := httptest.NewRecorder()
	tg.g.ServeHTTP(out, httptest.NewRequest("GET", "/metrics", nil))
	badRequests := 2
	if tlsOn {
		badRequests = 3
	}
	if !strings.Contains(out.Body.String(), `fencegw_writes_total{outcome="bad_request"} `+strconv.Itoa(badRequests)) ||
		!strings.Contains(out.Body.String(), `fencegw_writes_total{outcome="upstream_error"} 0`) {
		t.Fatalf("metrics:\n%s", out.Body.String())
	}
}

// holdBack is a connection that, once hold is set, sends all but the last
// eight bytes of each write: a TLS record cut short.
type holdBack struct {
	net.Conn
	hold atomic.Bool
}

func (h *holdBack) Write(p []byte) (int, error) {
	if !h.hold.Load() || len(p) <= 8 {
		return h.Conn.Write(p)
	}
	if _, err := h.Conn.Write(p[:len(p)-8]); err != nil {
		return 0, err
	}
	return len(p), nil
}

// A request framed by Transfer-Encoding closes its connection after the
// answer even when the upstream sends a 1xx first: the reverse proxy
// clears the header map after forwarding a 1xx, which took the
// gateway's Connection: close with it, and the bytes after the chunked
// body were then read as a next request.
func TestFrameTEClosesAfterAnUpstream1xx(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	tg := startFraming(t, up.URL, Config{}, false)
	lease := tg.lease(t, "r")
	head := func(path string) string {
		return "POST /v1/proxy/svc" + path + " HTTP/1.1\r\nHost: gw\r\nFencing-Lease: " + lease + "\r\n"
	}
	c := tg.dial(t)
	_, _ = io.WriteString(c, head("/chunked")+"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+
		head("/smuggled")+"Content-Length: 0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode < 200 {
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("final answer %v, %v; want 200 with Connection: close", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if next, err := http.ReadResponse(br, nil); err == nil {
		t.Fatalf("a second answer on the connection: %d", next.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(paths, " ") != "/chunked" {
		t.Fatalf("upstream got %q, want /chunked only", paths)
	}
}

// A request Go's server refuses before any handler (a request line with a
// space in its target, a header line without a colon, no Host) is answered
// by net/http itself, which then closes the connection at once. With bytes
// of the request still unread (its body, beyond Go's 4 KiB read buffer)
// that close is a TCP reset, and the client loses the answer: the 400 that
// FuzzEngineMatchesReverseProxy reached as "connection reset by peer"
// (testdata/fuzz/FuzzEngineMatchesReverseProxy). The client must read the
// whole answer and then the end of the connection, never a reset.
func TestRefusedHeadIsReadNotReset(t *testing.T) {
	body := strings.Repeat("z", 16<<10)
	for _, tlsOn := range []bool{false, true} {
		tg := startFraming(t, newRecorder(t).URL, Config{}, tlsOn)
		lease := tg.lease(t, "r")
		for name, head := range map[string]string{
			"space in the query": "PATCH /v1/proxy/svc/a?k=%     2F HTTP/1.1\r\nHost: gw\r\n",
			"no colon":           "POST /v1/proxy/svc/a HTTP/1.1\r\nHost: gw\r\nX-A\r\n",
			"no Host":            "POST /v1/proxy/svc/a HTTP/1.1\r\n",
		} {
			t.Run(map[bool]string{false: "plain/", true: "tls/"}[tlsOn]+name, func(t *testing.T) {
				c := tg.dial(t)
				raw := head + "Fencing-Lease: " + lease + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
				if _, err := io.WriteString(c, raw); err != nil {
					t.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(c)
				if err != nil {
					t.Fatalf("reading the answer: %v (after %q)", err, got)
				}
				resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
				if err != nil || resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("answer %q, want a 400", got)
				}
			})
		}
		if tlsOn {
			// Plain HTTP to the TLS listener: its own 400 problem (package framing, tls.go).
			t.Run("tls/plain HTTP", func(t *testing.T) {
				c, err := net.Dial("tcp", tg.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				raw := "POST /v1/proxy/svc/a HTTP/1.1\r\nHost: gw\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
				if _, err := io.WriteString(c, raw); err != nil {
					t.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(c)
				if err != nil || !strings.HasPrefix(string(got), "HTTP/1.1 400 ") || !strings.Contains(string(got), problemContentType) {
					t.Fatalf("reading the answer: %v (after %q), want a 400 and the end", err, got)
				}
			})
		}
	}
}

// The listener's own loop serves fenced writes and the two control calls
// every lease makes; every other request is Go's server's.
func TestOwnsRequest(t *testing.T) {
	for line, want := range map[string]bool{
		"POST /v1/proxy/svc/a HTTP/1.1":        true,
		"PUT /v1/proxy/svc/a HTTP/1.1":         true,
		"GET /v1/proxy/svc/a HTTP/1.1":         true,
		"HEAD /v1/proxy/svc/a HTTP/1.1":        false,
		"OPTIONS /v1/proxy/svc/a HTTP/1.1":     false,
		"POST /v1/leases HTTP/1.1":             true,
		"POST /v1/leases?x=1 HTTP/1.1":         true,
		"POST /v1/lea":                         false, // the first bytes only: Go's server keeps it
		"POST /v1/leasesx HTTP/1.1":            false,
		"POST /v1/leases/fl_a/renew HTTP/1.1":  false,
		"POST /v1/leases/fl_a/revoke HTTP/1.1": false,
		"DELETE /v1/leases/fl_a HTTP/1.1":      true,
		"DELETE /v1/leases HTTP/1.1":           false,
		"DELETE /v1/leases/ HTTP/1.1":          true, // the handler's 404 or 405, on either server
		"GET /v1/leases/fl_a HTTP/1.1":         false,
		"GET /v1/resources/r HTTP/1.1":         false,
		"GET /dashboard HTTP/1.1":              false,
		"POST":                                 false,
	} {
		if got := ownsRequest([]byte(line)); got != want {
			t.Errorf("ownsRequest(%q) = %v; want %v", line, got, want)
		}
	}
}
