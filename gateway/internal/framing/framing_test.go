package framing

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
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
	ln = Listener(srv, ln, tlsConfig, nil)
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
		if got[i] != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	r, _ := http.NewRequest("GET", "http://x/", nil)
	if v, scanned := Check(r); scanned || v != (Verdict{}) {
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

// Go's own 5xx answers are recognised, a handler's never (it carries a
// Date, and its header is written in another order).
func TestOwnAnswer(t *testing.T) {
	for _, tc := range []struct {
		p      string
		status int
	}{
		{"HTTP/1.1 501 Not Implemented" + goErrorHeaders + "Unsupported transfer encoding", 501},
		{"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + goErrorHeaders + "505 HTTP Version Not Supported: unsupported protocol version", 505},
		{"HTTP/1.1 400 Bad Request" + goErrorHeaders + "400 Bad Request", 0},
		{"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Thu, 03 Dec 2026 10:00:00 GMT\r\nConnection: close\r\n\r\nx", 0},
		{"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n", 0},
		{"HTTP/1.1 200 OK\r\n\r\n", 0},
		{"HTTP/1.1 5", 0},
	} {
		status, _, ok := ownAnswer([]byte(tc.p))
		if ok != (tc.status != 0) || status != tc.status {
			t.Errorf("%q: %d %v, want %d", tc.p, status, ok, tc.status)
		}
	}
}
