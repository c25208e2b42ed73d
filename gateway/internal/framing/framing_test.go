package framing

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/testcert"
)

// checked is what Check said of one request, as the handler saw it.
type checked struct {
	path    string
	v       Verdict
	scanned bool
}

// serveChecks serves, through Listener, a handler that records what Check
// says of every request and answers 200 (with Connection: close after a
// Transfer-Encoding request, as the gateway does).
func serveChecks(t *testing.T, tlsConfig *tls.Config) (addr string, seen func() []checked) {
	t.Helper()
	var mu sync.Mutex
	var got []checked
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, scanned := Check(r)
		mu.Lock()
		got = append(got, checked{r.URL.Path, v, scanned})
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		if v.TransferEncoding || v.Field != "" {
			w.Header().Set("Connection", "close")
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = Listener(srv, ln, tlsConfig, nil, nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), func() []checked {
		mu.Lock()
		defer mu.Unlock()
		return append([]checked(nil), got...)
	}
}

// send writes raw on c and reads answers until the server closes c.
func send(t *testing.T, c net.Conn, raw string) int {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	n := 0
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return n
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n++
	}
}

// Each request served through Listener gets its own head, in order on a
// connection of pipelined requests: good ones go on, one with both
// Content-Length and Transfer-Encoding is refused naming both, and one
// framed by Transfer-Encoding is marked so that its answer closes the
// connection. Without Listener nothing is scanned.
func TestCheckThroughListener(t *testing.T) {
	addr, seen := serveChecks(t, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send(t, c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"+
		"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"+
		"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	send(t, c2, "POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")

	want := []checked{
		{path: "/a", scanned: true},
		{path: "/b", scanned: true},
		{path: "/c", scanned: true, v: Verdict{TransferEncoding: true}},
		{path: "/d", scanned: true, v: Verdict{Field: fieldFraming, Reason: "a request must not carry both (RFC 9112 6.3)"}},
	}
	got := seen()
	if len(got) != len(want) {
		t.Fatalf("the handler saw %+v, want %+v", got, want)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("request %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	r, _ := http.NewRequest("GET", "http://x/", nil)
	if v, scanned := Check(r); scanned || !reflect.DeepEqual(v, Verdict{}) {
		t.Errorf("a request that came through no Listener: %+v, scanned %v", v, scanned)
	}
}

// With TLS the listener terminates it and Check hands each request the
// connection's state.
func TestCheckGivesTheTLSState(t *testing.T) {
	cert := testcert.New(t)
	addr, seen := serveChecks(t, &tls.Config{Certificates: []tls.Certificate{cert.TLS}})
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: cert.Pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send(t, c, "GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	got := seen()
	if len(got) != 1 || got[0].v.Field != "" || got[0].v.TLS == nil || !got[0].v.TLS.HandshakeComplete {
		t.Fatalf("the handler saw %+v, want one request with the TLS state", got)
	}
	if p := got[0].v.TLS.NegotiatedProtocol; p != "" && p != "http/1.1" {
		t.Errorf("ALPN negotiated %q; the listener serves HTTP/1.1 only", p)
	}
}

// Go's own plain-text answers (4xx and 5xx) are recognised, a handler's
// never (it carries a Date, and its header is written in another order).
func TestOwnAnswer(t *testing.T) {
	for _, tc := range []struct {
		p      string
		status int
	}{
		{"HTTP/1.1 501 Not Implemented" + goErrorHeaders + "Unsupported transfer encoding", 501},
		{"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + goErrorHeaders + "505 HTTP Version Not Supported: unsupported protocol version", 505},
		{"HTTP/1.1 400 Bad Request" + goErrorHeaders + "400 Bad Request", 400},
		{"HTTP/1.1 400 Bad Request: missing required Host header" + goErrorHeaders + "400 Bad Request: missing required Host header", 400},
		{"HTTP/1.1 431 Request Header Fields Too Large" + goErrorHeaders + "431 Request Header Fields Too Large", 431},
		{"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Thu, 03 Dec 2026 10:00:00 GMT\r\nConnection: close\r\n\r\nx", 0},
		{"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Thu, 03 Dec 2026 10:00:00 GMT\r\nConnection: close\r\n\r\nx", 0},
		{"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n", 0},
		{"HTTP/1.1 200 OK" + goErrorHeaders, 0},
		{"HTTP/1.1 4x0 Bad" + goErrorHeaders, 0},
		{"HTTP/1.1 200 OK\r\n\r\n", 0},
		{"HTTP/1.1 5", 0},
		{"HTTP/1.1 40", 0},
	} {
		status, _, ok := ownAnswer([]byte(tc.p))
		if ok != (tc.status != 0) || status != tc.status {
			t.Errorf("%q: %d %v, want %d", tc.p, status, ok, tc.status)
		}
	}
}

// Go's own answers, on the wire, become problems: its 400s keep 400 and
// say in net/http's words what is wrong, its 431 stays 431.
func TestOwnAnswerOnTheWire(t *testing.T) {
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 1 << 10,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { Check(r) })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = Listener(srv, ln, nil, nil, nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, tc := range []struct {
		name, raw string
		status    int
		detail    string
	}{
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"bad Host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "malformed Host header"},
		{"no colon", "GET / HTTP/1.1\r\nHost: x\r\nX-A\r\n\r\n", 400, "malformed header field name"},
		{"bad line", "GET /\r\nHost: x\r\n\r\n", 400, "net/http: 400 Bad Request"},
		{"too large", "GET / HTTP/1.1\r\nHost: x\r\nX-A: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", 431, "431 Request Header Fields Too Large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, tc.raw)
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			var p struct {
				Status int
				Detail string
			}
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" || !resp.Close ||
				json.Unmarshal(body, &p) != nil || p.Status != tc.status || !strings.Contains(p.Detail, tc.detail) {
				t.Fatalf("%d %v close=%v %s; want a %d problem saying %q", resp.StatusCode, resp.Header, resp.Close, body, tc.status, tc.detail)
			}
		})
	}
}

// A handler's answer is never taken for Go's own, whatever its bytes: a
// body that starts like one, written straight to the connection, goes out
// as it is.
func TestOwnAnswerNotInAHandlersAnswer(t *testing.T) {
	fake := "HTTP/1.1 400 Bad Request" + goErrorHeaders + "400 Bad Request"
	body := fake + strings.Repeat("x", 16<<10)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Check(r)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush() // the body's first bytes start a write of their own
		_, _ = io.WriteString(w, body)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = Listener(srv, ln, nil, nil, nil)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != body {
		t.Fatalf("the body came %d bytes (%v), starting %q; want the handler's %d", len(got), err, got[:min(len(got), 200)], len(body))
	}
}
