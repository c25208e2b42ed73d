package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// Control calls, the live stream and pipelining over raw connections whose
// pacing the tests choose: the class of TestUpstreamGoneMidBodyAnswersBeforeTheRest
// (an answer held until net/http's server has read the rest of a body)
// off the fenced-write path.

// paceConn is one raw client connection.
type paceConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func newWire(t *testing.T, tg *testGateway) *paceConn {
	c := tg.dial(t)
	return &paceConn{t: t, c: c, br: bufio.NewReader(c)}
}

// send writes parts with a pause between each, as a client that paces
// its request.
func (w *paceConn) send(parts ...string) {
	w.t.Helper()
	for i, p := range parts {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		_ = w.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(w.c, p); err != nil {
			w.t.Fatalf("send: %v", err)
		}
	}
}

// answer reads the next final answer and its body (method is the
// request's, for HEAD); the test fails if none comes in time.
func (w *paceConn) answer(method string) (*http.Response, string) {
	w.t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(w.br, &http.Request{Method: method})
	if err != nil {
		w.t.Fatalf("no answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatalf("answer's body: %v", err)
	}
	return resp, string(b)
}

// reused checks that the connection carries a next request.
func (w *paceConn) reused() {
	w.t.Helper()
	w.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	if resp, body := w.answer("GET"); resp.StatusCode != http.StatusOK {
		w.t.Fatalf("the next request on the connection: %d %s", resp.StatusCode, body)
	}
}

// closed checks that the gateway closes the connection, nothing more sent.
func (w *paceConn) closed() {
	w.t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := w.br.ReadByte()
	if err == nil {
		rest, _ := w.br.Peek(w.br.Buffered())
		w.t.Fatalf("more after the answer: %q", append([]byte{b}, rest...))
	}
	if !errors.Is(err, io.EOF) && !isReset(err) {
		w.t.Fatalf("connection not closed: %v", err)
	}
}

func wantProblem(t *testing.T, resp *http.Response, body string, status int, code string, close bool) {
	t.Helper()
	var p problem
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != problemContentType ||
		json.Unmarshal([]byte(body), &p) != nil || p.Code != code || resp.Close != close {
		t.Fatalf("answer %d %v close=%v\n%s\nwant %d %s, close=%v", resp.StatusCode, resp.Header, resp.Close, body, status, code, close)
	}
}

// postJSON is the head of a control call whose body is body.
func postJSON(path, extra, body string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n"
}

const chunkedJSON = "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

func acquireBody(resource string) string {
	return `{"resource":"` + resource + `","holder":"h","ttl_ms":60000}`
}

// Control calls whose bodies come slowly get one answer once the body is
// in, and keep their connection; a body over the control limit is refused
// at once, without waiting for (or a 100 Continue asking for) the rest.
func TestControlPacedBodies(t *testing.T) {
	tg := startFraming(t, newRecorder(t).URL, Config{BodyTimeout: 5 * time.Second}, false)

	t.Run("acquire, Content-Length, paced", func(t *testing.T) {
		w, b := newWire(t, tg), acquireBody("p1")
		w.send(postJSON("/v1/leases", "", b), b[:5], b[5:20], b[20:])
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusCreated || resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		w.reused()
	})
	t.Run("acquire, chunked, paced", func(t *testing.T) {
		w, b := newWire(t, tg), acquireBody("p2")
		// RFC 9112 6.3: the request after a chunked one is not read.
		w.send("POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\n"+chunkedJSON, chunk(b[:7]), chunk(b[7:]),
			"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusCreated || !resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		w.closed()
	})
	t.Run("acquire, Expect: 100-continue", func(t *testing.T) {
		w, b := newWire(t, tg), acquireBody("p3")
		w.send(postJSON("/v1/leases", "Expect: 100-continue\r\n", b))
		if resp, _ := w.answer("POST"); resp.StatusCode != http.StatusContinue {
			t.Fatalf("%d, want 100 Continue before the body", resp.StatusCode)
		}
		w.send(b[:10], b[10:])
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusCreated || resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		w.reused()
	})
	t.Run("renew, paced", func(t *testing.T) {
		w, b := newWire(t, tg), `{"ttl_ms":60000}`
		w.send(postJSON("/v1/leases/"+tg.lease(t, "p4")+"/renew", "", b), b[:4], b[4:])
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		w.reused()
	})
	t.Run("too large, Expect: 100-continue", func(t *testing.T) {
		t.Parallel()
		w := newWire(t, tg)
		w.send("POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 70000\r\n\r\n")
		resp, body := w.answer("POST")
		wantProblem(t, resp, body, http.StatusRequestEntityTooLarge, "body_too_large", true)
		w.closed()
	})
	t.Run("too large, chunked, then a pause", func(t *testing.T) {
		t.Parallel() // the gateway lingers on the unread rest before it closes
		w := newWire(t, tg)
		w.send("POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\n" + chunkedJSON + chunk(`{"resource":"`+strings.Repeat("a", 70000)))
		resp, body := w.answer("POST")
		wantProblem(t, resp, body, http.StatusRequestEntityTooLarge, "body_too_large", true)
		w.closed()
	})
	t.Run("under the limit, paced", func(t *testing.T) {
		w, b := newWire(t, tg), `{"resource":"`+strings.Repeat("a", 60000)+`"}`
		w.send(postJSON("/v1/leases", "", b), b[:30000], b[30000:])
		resp, body := w.answer("POST")
		wantProblem(t, resp, body, http.StatusBadRequest, "invalid_request", false) // the name's length
		w.reused()
	})
	t.Run("malformed JSON, paced", func(t *testing.T) {
		w, b := newWire(t, tg), `{"resource":"x", "holder": }`
		w.send(postJSON("/v1/leases", "", b), b[:8], b[8:16], b[16:])
		resp, body := w.answer("POST")
		wantProblem(t, resp, body, http.StatusBadRequest, "invalid_request", false)
		w.reused()
	})
	t.Run("malformed chunk after a pause", func(t *testing.T) {
		w := newWire(t, tg)
		w.send("POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\n"+chunkedJSON+chunk(`{"res`), "zz\r\nxx\r\n")
		resp, body := w.answer("POST")
		wantProblem(t, resp, body, http.StatusBadRequest, "invalid_request", true)
		w.closed()
	})
	t.Run("head byte by byte", func(t *testing.T) {
		w, b := newWire(t, tg), acquireBody("p5")
		head := postJSON("/v1/leases", "", b)
		for i := range len(head) {
			_ = w.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(w.c, head[i:i+1]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
		w.send(b)
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusCreated || resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		w.reused()
	})
}

// Requests pipelined on one connection are answered in order; one whose
// body was left unread closes the connection (the next is not answered),
// any other leaves it to the next.
func TestControlPipelining(t *testing.T) {
	tg := startFraming(t, newRecorder(t).URL, Config{BodyTimeout: 5 * time.Second, AllowedHosts: []string{"127.0.0.1"}}, false)
	lease := tg.lease(t, "q1")
	healthz := "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

	t.Run("control, write, control", func(t *testing.T) {
		w, b := newWire(t, tg), acquireBody("q2")
		w.send(postJSON("/v1/leases", "", b) + b +
			"POST /v1/proxy/svc/x HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Lease: " + lease + "\r\nContent-Length: 4\r\n\r\nbody" +
			"GET /v1/resources/q1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		for i, want := range []int{http.StatusCreated, http.StatusOK, http.StatusOK} {
			if resp, body := w.answer("GET"); resp.StatusCode != want || resp.Close {
				t.Fatalf("answer %d: %d close=%v %s", i, resp.StatusCode, resp.Close, body)
			}
		}
		w.reused()
	})
	t.Run("an acquire that waits, then another request", func(t *testing.T) {
		held := tg.lease(t, "q3")
		w, b := newWire(t, tg), `{"resource":"q3","holder":"h2","ttl_ms":60000,"wait_ms":5000}`
		w.send(postJSON("/v1/leases", "", b) + b + healthz)
		time.Sleep(100 * time.Millisecond)
		if _, err := tg.svc.Release(t.Context(), held, ""); err != nil {
			t.Fatal(err)
		}
		if resp, body := w.answer("POST"); resp.StatusCode != http.StatusCreated || resp.Close {
			t.Fatalf("%d close=%v %s", resp.StatusCode, resp.Close, body)
		}
		if resp, _ := w.answer("GET"); resp.StatusCode != http.StatusOK {
			t.Fatalf("the pipelined request: %d", resp.StatusCode)
		}
	})
	head := func(method, path, extra string) string {
		return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra
	}
	for _, c := range []struct {
		name, raw, code string
		status          int
		close           bool // the body was not read
	}{
		{"415", head("POST", "/v1/leases", "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}"), "unsupported_media_type", 415, true},
		{"413", head("POST", "/v1/leases", "Content-Type: application/json\r\nContent-Length: 70000\r\n\r\n{}"), "body_too_large", 413, true},
		{"403 host", "POST /v1/leases HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", "forbidden", 403, true},
		{"400 JSON", head("POST", "/v1/leases", "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{]"), "invalid_request", 400, false},
		{"400 fields", head("POST", "/v1/leases", "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"), "invalid_request", 400, false},
		{"404", head("GET", "/v1/leases/fl_nope", "\r\n"), "not_found", 404, false},
		{"400 missing lease", head("POST", "/v1/proxy/svc/x", "Content-Length: 2\r\n\r\n{}"), "missing_lease", 400, true},
		{"400 missing lease, no body", head("POST", "/v1/proxy/svc/x", "Content-Length: 0\r\n\r\n"), "missing_lease", 400, false},
		{"GET with a body", head("GET", "/v1/resources/q1", "Content-Length: 5\r\n\r\nhello"), "", 200, true},
		{"DELETE with a body", head("DELETE", "/v1/leases/fl_nope", "Content-Length: 5\r\n\r\nhello"), "not_found", 404, true},
		{"GET chunked", head("GET", "/v1/resources/q1", "Transfer-Encoding: chunked\r\n\r\n"+chunk("hi")+"0\r\n\r\n"), "", 200, true},
		{"HEAD", head("HEAD", "/v1/resources/q1", "\r\n"), "", 200, false},
		{"OPTIONS", head("OPTIONS", "/v1/leases", "\r\n"), "method_not_allowed", 405, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWire(t, tg)
			w.send(c.raw + healthz)
			resp, body := w.answer(strings.Fields(c.raw)[0])
			if c.code != "" {
				wantProblem(t, resp, body, c.status, c.code, c.close)
			} else if resp.StatusCode != c.status || resp.Close != c.close {
				t.Fatalf("%d close=%v %s, want %d close=%v", resp.StatusCode, resp.Close, body, c.status, c.close)
			}
			if c.close {
				w.closed()
				return
			}
			if resp, _ := w.answer("GET"); resp.StatusCode != http.StatusOK {
				t.Fatalf("the pipelined request: %d", resp.StatusCode)
			}
		})
	}
}

// With authentication on, a control call refused for its key is answered
// at once, while its body has not (all) come, and closes the connection;
// no 100 Continue asks for a body that would be refused.
func TestAuthRefusesPausedControlBodies(t *testing.T) {
	tg := startFraming(t, newRecorder(t).URL, Config{BodyTimeout: time.Hour, Auth: keyAuth{}}, false)
	b := acquireBody("a1")
	for _, c := range []struct {
		name, raw, code string
		status          int
	}{
		{"no key, half the body", postJSON("/v1/leases", "", b) + b[:10], "unauthorized", 401},
		{"no key, chunked, half the body", "POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\n" + chunkedJSON + chunk(b[:10]), "unauthorized", 401},
		{"no key, Expect", postJSON("/v1/leases", "Expect: 100-continue\r\n", b), "unauthorized", 401},
		{"unknown key, renew", postJSON("/v1/leases/fl_x/renew", "Authorization: Bearer nope\r\n", "{}") + "{", "unauthorized", 401},
		{"Basic on the API", postJSON("/v1/leases", "Authorization: Basic dTpw\r\n", b), "unauthorized", 401},
		{"viewer acquires", postJSON("/v1/leases", "Authorization: Bearer viewer\r\n", b) + b[:10], "forbidden", 403},
		{"viewer acquires, Expect", postJSON("/v1/leases", "Authorization: Bearer viewer\r\nExpect: 100-continue\r\n", b), "forbidden", 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWire(t, tg)
			w.send(c.raw)
			resp, body := w.answer("POST")
			wantProblem(t, resp, body, c.status, c.code, true)
			w.closed()
		})
	}
	t.Run("no key, no body", func(t *testing.T) {
		w := newWire(t, tg)
		w.send("GET /v1/resources/a1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" +
			"GET /v1/resources/a1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer worker\r\n\r\n")
		resp, body := w.answer("GET")
		wantProblem(t, resp, body, 401, "unauthorized", false)
		resp, body = w.answer("GET")
		wantProblem(t, resp, body, 404, "not_found", false)
	})
}

// With the embedded store closed, control calls (paced bodies too), the
// readiness probe and a write get 503 store_unavailable with Retry-After;
// a call whose body was read keeps its connection.
func TestControlStoreClosed(t *testing.T) {
	var store *bolt.Store
	tg := startFramingWith(t, newRecorder(t).URL, Config{BodyTimeout: 5 * time.Second}, false,
		func(s *bolt.Store, _ *Config, _ *http.Server) { store = s })
	id := tg.lease(t, "s1")
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	b := acquireBody("s2")
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" }
	for _, c := range []struct {
		name, method string
		parts        []string
		close        bool
	}{
		{"acquire, paced", "POST", []string{postJSON("/v1/leases", "", b), b[:9], b[9:]}, false},
		{"acquire, chunked", "POST", []string{"POST /v1/leases HTTP/1.1\r\nHost: 127.0.0.1\r\n" + chunkedJSON, chunk(b), "0\r\n\r\n"}, true},
		{"renew", "POST", []string{postJSON("/v1/leases/"+id+"/renew", "", "{}"), "{}"}, false},
		{"release", "DELETE", []string{"DELETE /v1/leases/" + id + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"}, false},
		{"inspect", "GET", []string{get("/v1/leases/" + id)}, false},
		{"resource", "GET", []string{get("/v1/resources/s1")}, false},
		{"rejections", "GET", []string{get("/v1/rejections")}, false},
		{"readyz", "GET", []string{get("/readyz")}, false},
		{"write, paced", "POST", []string{"POST /v1/proxy/svc/x HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Lease: " + id + "\r\nContent-Length: 4\r\n\r\n", "bo", "dy"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWire(t, tg)
			w.send(c.parts...)
			resp, body := w.answer(c.method)
			wantProblem(t, resp, body, http.StatusServiceUnavailable, "store_unavailable", c.close)
			if resp.Header.Get("Retry-After") == "" {
				t.Fatalf("no Retry-After: %v", resp.Header)
			}
			if !c.close {
				w.reused()
			}
		})
	}
}

// The live stream ends, and frees its slot, for a subscriber that stops
// reading (at the rolling write deadline) or half-closes; one that
// pipelines a request after the stream's GET still gets its events.
func TestStreamEndsForQuietClients(t *testing.T) {
	closed := make(chan struct{}, 16)
	tg := startFramingWith(t, "http://127.0.0.1:1", Config{WriteTimeout: 300 * time.Millisecond}, false,
		func(_ *bolt.Store, _ *Config, srv *http.Server) {
			srv.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateClosed {
					closed <- struct{}{}
				}
			}
		})
	slots := func() int {
		tg.g.streams.mu.Lock()
		defer tg.g.streams.mu.Unlock()
		return tg.g.streams.total
	}
	waitSlots := func(t *testing.T, want int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); slots() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d streams open, want %d", slots(), want)
			}
		}
	}
	open := func(t *testing.T, pipelined string) *paceConn {
		t.Helper()
		w := newWire(t, tg)
		w.send("GET " + pathStream + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + pipelined)
		_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, err := http.ReadResponse(w.br, nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the stream: %v %v", resp, err)
		}
		waitSlots(t, 1)
		return w
	}

	t.Run("never reads", func(t *testing.T) {
		_ = open(t, "")
		stop := make(chan struct{})
		defer close(stop)
		go func() { // events far larger than the socket buffers, until it ends
			big := strings.Repeat("h", 1<<20)
			for i := int64(1); ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				tg.g.Publish(tokens.Rejection{ID: i, Resource: "r", Code: "stale_token", Holder: big})
			}
		}()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatal("a stream whose client never reads holds its connection")
		}
		waitSlots(t, 0)
	})
	t.Run("half-closes", func(t *testing.T) {
		w := open(t, "")
		_ = w.c.(*net.TCPConn).CloseWrite()
		_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(w.br); err != nil && !isReset(err) {
			t.Fatalf("the stream did not end: %v", err)
		}
		waitSlots(t, 0)
	})
	t.Run("a request pipelined after it", func(t *testing.T) {
		w := open(t, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
		tg.g.Publish(tokens.Rejection{ID: 7, Resource: "r", Code: "stale_token"})
		_ = w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			line, err := w.br.ReadString('\n')
			if err != nil {
				t.Fatalf("no event: %v", err)
			}
			if strings.HasPrefix(line, "HTTP/") {
				t.Fatalf("an answer inside the stream: %q", line)
			}
			if line == "event: rejection\n" {
				break
			}
		}
		_ = w.c.Close()
		waitSlots(t, 0)
	})
}
