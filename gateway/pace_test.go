package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// pacedSend writes head, then the body in parts of 16 KiB a few
// milliseconds apart, and stops sending as soon as an answer arrives. It
// returns the first answer, its body, and how many parts went out before
// it.
func pacedSend(t *testing.T, c net.Conn, br *bufio.Reader, head string, chunked bool, parts int) (*http.Response, string, int) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			got <- answer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		got <- answer{resp, string(b), err}
	}()
	part := strings.Repeat("p", 16<<10)
	if chunked {
		part = fmt.Sprintf("%x\r\n%s\r\n", len(part), part)
	}
	sent := 0
	for {
		if sent < parts {
			if _, err := io.WriteString(c, part); err != nil {
				t.Fatalf("sending part %d: %v", sent, err)
			}
			sent++
			if sent == parts && chunked {
				_, _ = io.WriteString(c, "0\r\n\r\n")
			}
		}
		wait := 2 * time.Millisecond
		if sent == parts {
			wait = 8 * time.Second
		}
		select {
		case a := <-got:
			if a.err != nil {
				t.Fatalf("no answer after %d of %d parts: %v", sent, parts, a.err)
			}
			return a.resp, a.body, sent
		case <-time.After(wait):
			if wait > time.Second {
				t.Fatalf("no answer after %d of %d parts, the client waiting", sent, parts)
			}
		}
	}
}

// countingUpstream answers every request before reading its body (200,
// "early"), as an upstream that decides on the head alone; Go's server
// then reads what is left of the body, up to 256 KiB, or closes the
// connection if more is left.
type countingUpstream struct {
	mu    sync.Mutex
	paths []string
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.paths = append(u.paths, r.URL.Path)
	u.mu.Unlock()
	_, _ = io.WriteString(w, "early "+r.URL.Path)
}

func (u *countingUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.paths...)
}

// An upstream that answers a streamed write before reading its body, while
// the client paces the body, of no more than Go's server drains after an
// answer (256 KiB), so the upstream keeps its connection: the client gets
// the upstream's answer, once, after its whole body was forwarded, and its
// connection carries its next request, which the upstream gets as a
// request of its own, not mixed with what was left of the first body. The
// upstream answered, so the outcome is known and the resource does not
// drain.
func TestEarlyAnswerToAPacedBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		chunked bool
		parts   int  // of 16 KiB
		kept    bool // the upstream keeps its connection, and the client its
	}{
		{"content-length, 128 KiB", false, 8, true},
		{"content-length, 240 KiB", false, 15, true},
		// The gateway closes a connection whose request was chunked
		// (framing.go).
		{"chunked, 128 KiB", true, 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &countingUpstream{}
			upstream := httptest.NewServer(up)
			t.Cleanup(upstream.Close)
			tg := earlyGateway(t, upstream.URL, false, nil)
			resource := fmt.Sprintf("paced-%v-%d", tc.chunked, tc.parts)
			lease := tg.lease(t, resource)
			framing := fmt.Sprintf("Content-Length: %d\r\n", tc.parts<<14)
			if tc.chunked {
				framing = "Transfer-Encoding: chunked\r\n"
			}
			c := tg.dial(t)
			br := bufio.NewReader(c)
			head := "POST /v1/proxy/svc/first HTTP/1.1\r\nHost: gw.example\r\n" + HeaderLease + ": " + lease + "\r\n" + framing + "\r\n"
			resp, body, sent := pacedSend(t, c, br, head, tc.chunked, tc.parts)
			if resp.StatusCode != http.StatusOK || body != "early /first" || resp.Close == tc.kept {
				t.Fatalf("after %d of %d parts: answer %d %q, closes the connection: %v; want the upstream's 200, closing it: %v",
					sent, tc.parts, resp.StatusCode, body, resp.Close, !tc.kept)
			}
			if tc.kept {
				_, _ = io.WriteString(c, "POST /v1/proxy/svc/second HTTP/1.1\r\nHost: gw.example\r\n"+HeaderLease+": "+lease+"\r\nContent-Length: 5\r\n\r\nhello")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("the next request on the kept connection: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || string(b) != "early /second" {
					t.Fatalf("the next request on the kept connection: %d %q", resp.StatusCode, b)
				}
			} else if _, err := br.ReadByte(); err != io.EOF && !isReset(err) {
				t.Fatalf("after an answer that closes, the connection was not closed: %v", err)
			}
			want := []string{"/first"}
			if tc.kept {
				want = append(want, "/second")
			}
			if got := up.seen(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("the upstream got requests %v, want %v", got, want)
			}
			if err := tg.svc.WaitDrains(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := tg.svc.Resource(t.Context(), resource); err != nil || !st.DrainUntil.IsZero() {
				t.Fatalf("resource after an answered write: %+v %v; want no drain", st, err)
			}
		})
	}
}

// A chunked body that grows past MaxBody while the client paces it is the
// client's fault, answered 413 (not 502, as though the upstream had broken
// the connection), closing the connection; the upstream, which got the
// head and part of the body, never gets a complete body, and the resource
// drains (the outcome is unknown).
func TestChunkedBodyPastMaxBodyMidStream(t *testing.T) {
	up := &recordingUpstream{firstIn: make(chan struct{})}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	tg := startFraming(t, upstream.URL, Config{MaxBody: 64 << 10, BodyTimeout: time.Hour}, false)
	lease := tg.lease(t, "past-max-body")
	c := tg.dial(t)
	head := "POST /v1/proxy/svc/stream-big HTTP/1.1\r\nHost: gw\r\n" + HeaderLease + ": " + lease + "\r\nTransfer-Encoding: chunked\r\n\r\n"
	resp, body, sent := pacedSend(t, c, bufio.NewReader(c), head, true, 64)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("after %d parts of 16 KiB: answer %d (closes the connection: %v), want 413 closing it\n%s", sent, resp.StatusCode, resp.Close, body)
	}
	if got := up.waitPath(t, "/stream-big"); got.complete {
		t.Fatalf("the upstream got a complete body of %d bytes", len(got.body))
	}
	if err := tg.svc.WaitDrains(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := tg.svc.Resource(t.Context(), "past-max-body"); err != nil || st.DrainUntil.IsZero() {
		t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", st, err)
	}
}

// An upstream that refuses a paced body at once (413, closing its
// connection with the body unread, which resets it), or that cannot be
// reached at all, is answered before the client sent the rest of its
// body: the upstream's answer, or 502, closing the connection. The
// upstream answered, or got nothing: the outcome is known and the
// resource does not drain.
func TestRefusalOfAPacedBodyAnswersBeforeTheRest(t *testing.T) {
	for _, tc := range []struct {
		name string
		code int
		up   func(t *testing.T) string
	}{
		{"413 closing", http.StatusRequestEntityTooLarge, func(t *testing.T) string {
			return "http://" + rawServer(t, func(c net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
				}
			})
		}},
		{"unreachable", http.StatusBadGateway, func(t *testing.T) string {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			_ = ln.Close()
			return "http://" + addr
		}},
	} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s chunked=%v", tc.name, chunked), func(t *testing.T) {
				tg := earlyGateway(t, tc.up(t), false, nil)
				resource := fmt.Sprintf("refused-%d-%v", tc.code, chunked)
				lease := tg.lease(t, resource)
				framing := "Content-Length: 262144\r\n" // what is left, less than Go's server reads after an answer
				if chunked {
					framing = "Transfer-Encoding: chunked\r\n"
				}
				c := tg.dial(t)
				br := bufio.NewReader(c)
				head := "POST /v1/proxy/svc/refused HTTP/1.1\r\nHost: gw.example\r\n" + HeaderLease + ": " + lease + "\r\n" + framing + "\r\n"
				resp, body, sent := pacedSend(t, c, br, head, chunked, 16)
				if resp.StatusCode != tc.code || !resp.Close || sent == 16 {
					t.Fatalf("after %d of 16 parts: answer %d (closes the connection: %v), want %d closing it before the whole body\n%s",
						sent, resp.StatusCode, resp.Close, tc.code, body)
				}
				if err := tg.svc.WaitDrains(t.Context()); err != nil {
					t.Fatal(err)
				}
				if st, err := tg.svc.Resource(t.Context(), resource); err != nil || !st.DrainUntil.IsZero() {
					t.Fatalf("resource after a write the upstream refused, or never got: %+v %v; want no drain", st, err)
				}
			})
		}
	}
}

// sendAndGoQuiet sends a streamed write on a lease of resource: its head
// and 64 KiB of a 1 MiB body, and then nothing. It returns the answer and
// its body, which must come within 10 s.
func sendAndGoQuiet(t *testing.T, tg *testGateway, resource string) (*http.Response, []byte) {
	t.Helper()
	lease := tg.lease(t, resource)
	c := tg.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	_, _ = io.WriteString(c, "POST /v1/proxy/svc/quiet HTTP/1.1\r\nHost: gw.example\r\n"+HeaderLease+": "+lease+
		"\r\nContent-Length: 1048576\r\n\r\n"+strings.Repeat("q", 64<<10))
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer %v after the client went quiet mid-body: %v", time.Since(start).Round(time.Millisecond), err)
		}
		if resp.StatusCode < 200 {
			continue // an informational answer relayed: the final one follows
		}
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
}

// An upstream that answers a streamed write while its client has gone
// quiet mid-body (an upstream that refuses on the head alone, and one that
// answers without reading the body) is heard by the client once the body
// stalls, not at the body timeout (an hour here): the upstream's answer,
// closing the connection, whose body was not all read. The upstream
// answered, so the outcome is known and the resource does not drain.
func TestEarlyAnswerToAQuietClient(t *testing.T) {
	const pause = "<pause>" // the upstream writes what comes before, waits 100 ms, then the rest
	for _, tc := range []struct {
		name   string
		answer string
		code   int
	}{
		{"413 closing", "HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope", http.StatusRequestEntityTooLarge},
		{"200 keeping", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nseen", http.StatusOK},
		// The final answer after informational ones, sent at once or after a pause.
		{"103 413 closing", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" +
			"HTTP/1.1 413 Content Too Large\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope", http.StatusRequestEntityTooLarge},
		{"100 102 pause 200 keeping", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n" +
			pause + "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nseen", http.StatusOK},
	} {
		for _, overTLS := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s tls=%v", tc.name, overTLS), func(t *testing.T) {
				tg := rawUpstreamGateway(t, overTLS, func(c net.Conn) {
					br := bufio.NewReader(c)
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					first, rest, _ := strings.Cut(tc.answer, pause)
					_, _ = io.WriteString(c, first)
					if rest != "" {
						time.Sleep(100 * time.Millisecond)
						_, _ = io.WriteString(c, rest)
					}
					_, _ = io.Copy(io.Discard, br) // what comes of the body, until the gateway closes
				})
				resource := fmt.Sprintf("quiet-%s-%v", strings.ReplaceAll(tc.name, " ", "-"), overTLS)
				resp, b := sendAndGoQuiet(t, tg, resource)
				if resp.StatusCode != tc.code || string(b) != tc.answer[len(tc.answer)-4:] || !resp.Close {
					t.Fatalf("answer %d %q (closes the connection: %v), want the upstream's %d closing it", resp.StatusCode, b, resp.Close, tc.code)
				}
				if err := tg.svc.WaitDrains(t.Context()); err != nil {
					t.Fatal(err)
				}
				if st, err := tg.svc.Resource(t.Context(), resource); err != nil || !st.DrainUntil.IsZero() {
					t.Fatalf("resource after an answered write: %+v %v; want no drain", st, err)
				}
			})
		}
	}
}

// rawUpstreamGateway is earlyGateway in front of an upstream that serves
// each connection with serve, over TLS or not.
func rawUpstreamGateway(t *testing.T, overTLS bool, serve func(net.Conn)) *testGateway {
	t.Helper()
	if !overTLS {
		return earlyGateway(t, "http://"+rawServer(t, serve), false, nil)
	}
	addr, trust := rawTLSServer(t, serve)
	tg := earlyGateway(t, "https://"+addr, false, nil)
	tg.g.transport.TLSClientConfig = trust
	return tg
}

// An upstream that hangs up (closes, or resets) after the head of a
// streamed write while its client is quiet mid-body can send no answer:
// the client hears 502 at once, closing the connection, not 408 at its
// body timeout (an hour here). The upstream got an incomplete request, so
// the outcome is unknown and the resource drains, as it would have then.
func TestUpstreamHangUpWhileClientQuiet(t *testing.T) {
	for _, tc := range []struct{ reset, overTLS, early1xx bool }{
		{false, false, false}, {true, false, false}, {false, true, false},
		{false, false, true}, {false, true, true}, // a 103, then the close: still no final answer
	} {
		t.Run(fmt.Sprintf("reset=%v tls=%v 103=%v", tc.reset, tc.overTLS, tc.early1xx), func(t *testing.T) {
			tg := rawUpstreamGateway(t, tc.overTLS, func(c net.Conn) {
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				if tc.early1xx {
					_, _ = io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
					time.Sleep(50 * time.Millisecond)
				}
				if tc.reset {
					_ = c.(*net.TCPConn).SetLinger(0)
				}
			})
			resource := fmt.Sprintf("hung-up-%v-%v-%v", tc.reset, tc.overTLS, tc.early1xx)
			resp, b := sendAndGoQuiet(t, tg, resource)
			if resp.StatusCode != http.StatusBadGateway || !resp.Close || !strings.Contains(string(b), "outcome is unknown") {
				t.Fatalf("answer %d (closes the connection: %v) %s; want 502 closing it, the outcome unknown", resp.StatusCode, resp.Close, b)
			}
			if err := tg.svc.WaitDrains(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := tg.svc.Resource(t.Context(), resource); err != nil || st.DrainUntil.IsZero() {
				t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", st, err)
			}
		})
	}
}

// An upstream whose early answer to a quiet client's streamed write starts
// with a final status line but is no answer (a malformed head): no answer
// reached the client, which hears 502 (not 504: the upstream did not run
// out of time, and not the client's fault), and the resource drains.
func TestMalformedEarlyAnswerWhileClientQuiet(t *testing.T) {
	tg := rawUpstreamGateway(t, false, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n")
		_, _ = io.Copy(io.Discard, br)
	})
	resp, b := sendAndGoQuiet(t, tg, "malformed-early")
	if resp.StatusCode != http.StatusBadGateway || !resp.Close || !strings.Contains(string(b), "outcome is unknown") {
		t.Fatalf("answer %d (closes the connection: %v) %s; want 502 closing it, the outcome unknown", resp.StatusCode, resp.Close, b)
	}
	if err := tg.svc.WaitDrains(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := tg.svc.Resource(t.Context(), "malformed-early"); err != nil || st.DrainUntil.IsZero() {
		t.Fatalf("resource after a write with no answer: %+v %v; want a drain", st, err)
	}
}
