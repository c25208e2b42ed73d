package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// scriptedUpstream answers a request for /case/<name> with the exact
// bytes answers[name], and /ok with a plain 200 "ok", on keep-alive
// connections; it closes the connection after the answer if name begins
// with "close-".
func scriptedUpstream(t testing.TB, answers map[string]string) string {
	t.Helper()
	return "http://" + rawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			a, ok := answers[strings.TrimPrefix(req.URL.Path, "/case/")]
			if !ok {
				a = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
			}
			if _, err := io.WriteString(c, a); err != nil || strings.HasPrefix(req.URL.Path, "/case/close-") {
				return
			}
		}
	})
}

// rawServer serves each connection accepted on 127.0.0.1 with serve, on a
// goroutine of its own, and closes it when serve returns; it returns the
// address. The tests' upstreams that answer in bytes of their own.
func rawServer(t testing.TB, serve func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRaw(t, ln, serve)
	return ln.Addr().String()
}

// rawTLSServer is rawServer over TLS, with the certificate of httptest's
// TLS servers; it returns the address and a client configuration that
// trusts it (for the gateway's transport).
func rawTLSServer(t testing.TB, serve func(c net.Conn)) (string, *tls.Config) {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	server, client := ts.TLS.Clone(), ts.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	ts.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	serveRaw(t, ln, serve)
	return ln.Addr().String(), client
}

// serveRaw is rawServer's accept loop on ln, closed at the test's end.
func serveRaw(t testing.TB, ln net.Listener, serve func(c net.Conn)) {
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
}

// An upstream's hostile or odd answer reaches the client as the reference
// road would relay it, or as a 502 where the answer is no answer: never a
// malformed answer, never bytes past the answer's framed end (on the
// client's connection or read as the answer to the next write on the
// upstream's), never a hop-by-hop field; the client's connection stays
// usable, and the resource drains exactly when no answer head came.
func TestHostileUpstreamAnswers(t *testing.T) {
	cases := []struct {
		name, answer string
		status       int // 0: the answer is cut short (no complete answer at the client)
		body         string
		drain        bool
	}{
		// A status below 100 is no HTTP status (RFC 9110 15): net/http's
		// server panics on it (WriteHeader), as the reference road does.
		{"status-0", "HTTP/1.1 000 Zero\r\nSet-Cookie: s=1\r\nContent-Length: 2\r\n\r\nhi", 502, "", true},
		{"status-99", "HTTP/1.1 099 X\r\nContent-Length: 2\r\n\r\nhi", 502, "", true},
		{"status-99-after-103", "HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 099 X\r\nContent-Length: 2\r\n\r\nhi", 502, "", true},
		{"status-999", "HTTP/1.1 999 X\r\nContent-Length: 2\r\n\r\nhi", 999, "hi", false},
		{"body-past-length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nFAKE!", 200, "hi", false},
		{"chunked-then-more", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nFAKE!", 200, "hi", false},
		{"204-with-body", "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nSMUGG", 204, "", false},
		{"304-chunked", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nSMUGG\r\n0\r\n\r\n", 304, "", false},
		{"length-and-chunked", "HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 200, "hi", false},
		{"lengths-differ", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi!", 502, "", true},
		{"gzip-chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 502, "", true},
		{"length-plus", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nhi", 502, "", true},
		{"hop-by-hop", "HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: s\r\nKeep-Alive: a\r\nProxy-Connection: b\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false},
		// Connection naming close and a field: ReadResponse (and the
		// engine's own reader, as it) takes the field out, and with it the
		// names it lists; the road still drops the fields named.
		{"close-hop-named", "HTTP/1.1 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false},
		{"close-hop-named-chunked", "HTTP/1.1 200 OK\r\nConnection: X-Secret, close\r\nX-Secret: s\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 200, "hi", false},
		{"close-hop-named-http10", "HTTP/1.0 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false},
		// A drain exactly when no complete answer head came.
		{"close-head-cut", "HTTP/1.1 200 OK\r\nContent-Le", 502, "", true},
		{"close-after-1xx", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 502, "", true},
		{"close-body-cut", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhi", 0, "", false},
		{"close-chunked-cut", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n", 0, "", false},
		{"101-unasked", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 502, "", true},
	}
	answers := map[string]string{}
	for _, c := range cases {
		answers[c.name] = c.answer
	}
	tg := startFraming(t, scriptedUpstream(t, answers), Config{ForwardTimeout: 5 * time.Second}, false)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lease := tg.lease(t, tc.name)
			c := tg.dial(t)
			br := bufio.NewReader(c)
			// send writes a request on c and reads its answer: nil if the
			// answer is cut short (the gateway then closes c).
			send := func(path string) (*http.Response, string) {
				t.Helper()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, "POST /v1/proxy/svc"+path+" HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\nContent-Length: 1\r\n\r\nb"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(br, nil)
				for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 {
					resp, err = http.ReadResponse(br, nil)
				}
				if err != nil {
					return nil, err.Error()
				}
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					return nil, err.Error()
				}
				return resp, string(b)
			}
			resp, body := send("/case/" + tc.name)
			if tc.status == 0 {
				if resp != nil {
					t.Fatalf("a cut answer reached the client whole: %d %q", resp.StatusCode, body)
				}
				c = tg.dial(t)
				br = bufio.NewReader(c)
			} else if resp == nil {
				t.Fatalf("no answer: %s", body)
			} else if resp.StatusCode != tc.status || tc.status != 502 && body != tc.body {
				t.Fatalf("the client got %d %q, want %d %q", resp.StatusCode, body, tc.status, tc.body)
			}
			if tc.status == 502 && !strings.Contains(body, "upstream_unreachable") {
				t.Fatalf("a 502 that is not the gateway's problem: %q", body)
			}
			for _, k := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Connection", "Upgrade", "Transfer-Encoding", "Set-Cookie"} {
				if resp == nil {
					break
				}
				if v := resp.Header[k]; v != nil && !(k == "Connection" && v[0] == "close") {
					t.Errorf("%s reached the client: %q", k, v)
				}
			}
			// The client's connection, and the upstream's, carry the next
			// write's own answer.
			if resp, body := send("/ok"); resp == nil || resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("the next write got %v %q, want 200 \"ok\"", resp != nil, body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tg.svc.WaitDrains(ctx); err != nil {
				t.Fatal(err)
			}
			res, err := tg.svc.Resource(ctx, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if drain := res.DrainUntil.After(time.Now()); drain != tc.drain {
				t.Fatalf("drain %v, want %v", drain, tc.drain)
			}
		})
	}
}

// HTTP/1.0 knows no 1xx: an HTTP/1.0 client takes an upstream's 103 or
// 102, relayed, for the final answer, and the final answer's bytes for its
// body or the next answer (RFC 9110 15.2: a server must not send it one).
// An HTTP/1.1 client still gets them, without their hop-by-hop fields
// (RFC 9110 7.6.1), as the final answer's.
func TestUpstream1xxRelay(t *testing.T) {
	info := "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nConnection: X-Hop\r\nX-Hop: h\r\nKeep-Alive: k\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n" +
		"HTTP/1.1 103 Early Hints\r\nLink: </b>\r\nConnection: close, X-Hop\r\nX-Hop: h\r\n\r\n"
	up := scriptedUpstream(t, map[string]string{"hints": info + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"})
	tg := startFraming(t, up, Config{}, false)
	lease := tg.lease(t, "r")
	for _, proto := range []string{"HTTP/1.0", "HTTP/1.1"} {
		c := tg.dial(t)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		// Connection: close, so that both protocols end the same way.
		if _, err := io.WriteString(c, "POST /v1/proxy/svc/case/hints "+proto+"\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\nConnection: close\r\nContent-Length: 1\r\n\r\nb"); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		want := proto + " 200 OK\r\n"
		if proto == "HTTP/1.1" {
			want = "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </b>\r\n\r\n" + want
		}
		if !strings.HasPrefix(string(got), want) || !strings.HasSuffix(string(got), "\r\n\r\nhi") {
			t.Errorf("%s client got %q, want %q... then the body", proto, got, want)
		}
	}
}

// An upstream's trailer fields reach the client only if they may be
// trailer fields at all: no hop-by-hop field (nor one the answer's
// Connection names), no framing, routing, authentication or payload
// processing field (RFC 9110 6.5.1; httpguts.ValidTrailerHeader, which
// net/http's server applies to announced trailers only), announced or
// not; the Trailer field the client gets names only those that go on.
func TestUpstreamAnswerTrailers(t *testing.T) {
	bad := "Connection: close\r\nKeep-Alive: k\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nTrailer: X-Sum\r\n" +
		"Host: evil\r\nAuthorization: a\r\nSet-Cookie: s=1\r\nContent-Type: text/x\r\nProxy-Authenticate: p\r\nTe: trailers\r\nX-Named: n\r\n"
	cases := map[string]string{
		// Announced, one named by Connection, some that may not be trailers.
		"announced": "HTTP/1.1 200 OK\r\nConnection: X-Named\r\nTrailer: X-Sum, X-Named, Keep-Alive, Set-Cookie\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"2\r\nhi\r\n0\r\nX-Sum: 1\r\nX-Named: n\r\nKeep-Alive: k\r\nSet-Cookie: s=1\r\n\r\n",
		// Not announced (each goes as a trailer of its own, TrailerPrefix).
		"unannounced": "HTTP/1.1 200 OK\r\nConnection: X-Named\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-Sum: 1\r\n" + bad + "\r\n",
		// Announced in part, so sent as if none were.
		"partly": "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Named\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nX-Sum: 1\r\n" + bad + "\r\n",
	}
	tg := startFraming(t, scriptedUpstream(t, cases), Config{}, false)
	lease := tg.lease(t, "t")
	for name := range cases {
		t.Run(name, func(t *testing.T) {
			c := tg.dial(t)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "POST /v1/proxy/svc/case/"+name+" HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\nTe: trailers\r\nContent-Length: 1\r\n\r\nb"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil || string(b) != "hi" {
				t.Fatalf("body %q %v", b, err)
			}
			if len(resp.Trailer) != 1 || resp.Trailer.Get("X-Sum") != "1" {
				t.Errorf("the client got the trailer %q, want only X-Sum: 1", resp.Trailer)
			}
			if v := resp.Header["Trailer"]; v != nil && (len(v) != 1 || v[0] != "X-Sum") {
				t.Errorf("the client's Trailer field is %q, want X-Sum or none", v)
			}
		})
	}
}

// An upstream that answers 1xx after 1xx (an endless 103 flood) gets no
// more than the forward timeout: past 100 informational answers the
// exchange is broken, 502, and as its request left, the resource drains.
func TestUpstream1xxFlood(t *testing.T) {
	up := rawServer(t, func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		for i := 0; i < 1e6; i++ {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"); err != nil {
				return
			}
		}
	})
	tg := startFraming(t, "http://"+up, Config{ForwardTimeout: time.Minute}, false)
	lease := tg.lease(t, "flood")
	c := tg.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/proxy/svc/x HTTP/1.1\r\nHost: gw\r\nFencing-Lease: "+lease+"\r\nContent-Length: 1\r\n\r\nb"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	infos := 0
	resp, err := http.ReadResponse(br, nil)
	for ; err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200; resp, err = http.ReadResponse(br, nil) {
		infos++
	}
	if err != nil {
		t.Fatalf("after %d 1xx answers: %v", infos, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || !strings.Contains(string(b), "upstream_unreachable") || infos > 100 {
		t.Fatalf("the client got %d 1xx answers, then %d %q; want at most 100, then the gateway's 502", infos, resp.StatusCode, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tg.svc.WaitDrains(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := tg.svc.Resource(ctx, "flood")
	if err != nil {
		t.Fatal(err)
	}
	if !res.DrainUntil.After(time.Now()) {
		t.Fatal("the resource does not drain: the request left, its outcome is unknown")
	}
}
