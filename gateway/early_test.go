package gateway

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// headOnly sends raw, a request head whose body never comes, and reads the
// answer: it must come (the body is never sent) and close the connection.
// It reports whether a 100 Continue came before the final answer.
func headOnly(c net.Conn, raw string) (resp *http.Response, body string, got100 bool, err error) {
	// Far longer than any answer takes; without the rule, none comes.
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		return nil, "", false, err
	}
	br := bufio.NewReader(c)
	for {
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			return nil, "", got100, fmt.Errorf("no answer while the body never came: %w", err)
		}
		if resp.StatusCode != http.StatusContinue {
			break
		}
		got100 = true
	}
	b, _ := io.ReadAll(resp.Body)
	if !resp.Close {
		return resp, string(b), got100, fmt.Errorf("answer %d without Connection: close", resp.StatusCode)
	}
	// The gateway closes the connection (after its short linger).
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) && !isReset(err) {
		return resp, string(b), got100, fmt.Errorf("after the answer the connection was not closed: %v", err)
	}
	return resp, string(b), got100, nil
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

func earlyGateway(t *testing.T, up string, tlsOn bool, auth Authenticator) *testGateway {
	return startFramingWith(t, up, Config{BodyTimeout: time.Hour, Auth: auth, AllowedHosts: []string{"gw.example"}}, tlsOn,
		func(store *bolt.Store, cfg *Config, _ *http.Server) {
			cfg.Idempotency = tokens.NewIdempotency(tokens.IdempotencyConfig{Store: store, InFlight: time.Minute, MaxBody: 1 << 20})
		})
}

// headCase is a request head whose body never comes, and the answer it
// must get at once.
type headCase struct {
	name string
	tg   *testGateway
	raw  string
	code int
}

// runHeads sends each case's head on a connection of its own, all at
// once, and checks each answer: the code, no 100 Continue, the
// connection closed.
func runHeads(t *testing.T, cases []headCase) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range cases {
		conn := c.tg.dial(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, got100, err := headOnly(conn, c.raw)
			switch {
			case err != nil:
				t.Errorf("%s: %v", c.name, err)
			case resp.StatusCode != c.code || got100:
				t.Errorf("%s: %d (100 Continue first: %v), want %d without a 100\n%s", c.name, resp.StatusCode, got100, c.code, body)
			}
		}()
	}
	wg.Wait()
}

type earlyEnv struct {
	up             *recorder
	open, authed   *testGateway
	stale, current string
	host           string
}

func newEarlyEnv(t *testing.T, tlsOn bool) *earlyEnv {
	e := &earlyEnv{up: newRecorder(t), host: "Host: gw.example\r\n"}
	e.open = earlyGateway(t, e.up.URL, tlsOn, nil)
	e.authed = earlyGateway(t, e.up.URL, tlsOn, keyAuth{})
	e.stale = e.open.lease(t, "stale")
	if _, err := e.open.svc.Release(t.Context(), e.stale, ""); err != nil {
		t.Fatal(err)
	}
	e.current = e.open.lease(t, "current")
	return e
}

func (e *earlyEnv) write(lease, extra string) string {
	return "POST /v1/proxy/svc/x HTTP/1.1\r\n" + e.host + "Fencing-Lease: " + lease + "\r\n" + extra
}

func bothListeners(t *testing.T, f func(t *testing.T, tlsOn bool)) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) { f(t, tlsOn) })
	}
}

// A refusal that does not need the body is answered at once, with
// Connection: close, without reading the body: the head is sent, the body
// never is, and the answer comes and the connection closes. Plain and TLS.
func TestEarlyRefusalsDoNotWaitForTheBody(t *testing.T) {
	bothListeners(t, func(t *testing.T, tlsOn bool) {
		e := newEarlyEnv(t, tlsOn)
		host := e.host
		runHeads(t, []headCase{
			{"healthz with a body", e.open, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n", 200},
			{"readyz with a body", e.open, "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n", 200},
			{"unauthenticated", e.authed, "POST /v1/leases HTTP/1.1\r\n" + host + "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n", 401},
			{"unauthenticated write", e.authed, e.write(e.current, "Content-Length: 50\r\n\r\n"), 401},
			{"foreign host", e.open, "POST /v1/leases HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n", 403},
			{"no lease", e.open, "POST /v1/proxy/svc/x HTTP/1.1\r\n" + host + "Content-Length: 50\r\n\r\n", 400},
			{"unknown lease", e.open, e.write("fl_nope", "Content-Length: 50\r\n\r\n"), 403},
			{"stale lease", e.open, e.write(e.stale, "Content-Length: 50\r\n\r\n"), 409},
			{"stale lease, chunked", e.open, e.write(e.stale, "Transfer-Encoding: chunked\r\n\r\n"), 409},
			{"unknown upstream", e.open, "POST /v1/proxy/nope/x HTTP/1.1\r\n" + host + "Fencing-Lease: " + e.current + "\r\nContent-Length: 50\r\n\r\n", 404},
			{"text/plain", e.open, "POST /v1/leases HTTP/1.1\r\n" + host + "Content-Type: text/plain\r\nContent-Length: 50\r\n\r\n", 415},
			{"release with a body it does not need", e.open, "POST /v1/leases/fl_nope/release HTTP/1.1\r\n" + host + "Content-Length: 50\r\n\r\n", 404},
		})
		if n := len(e.up.seen()); n != 0 {
			t.Fatalf("the upstream got %d writes", n)
		}
		// Calls whose bodies are read keep their connection.
		body := `{"resource":"kept","holder":"h","ttl_ms":60000}`
		resp, b := e.open.roundTrip(t, "POST /v1/leases HTTP/1.1\r\n"+host+"Content-Type: application/json\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n"+body)
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("an acquire: %d close=%v %s", resp.StatusCode, resp.Close, b)
		}
		resp, b = e.open.roundTrip(t, e.write(e.current, "Content-Length: 4\r\n\r\nbody"))
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("a write: %d close=%v %s", resp.StatusCode, resp.Close, b)
		}
	})
}

// Expect: 100-continue under a refused lease (or no key) gets the final
// answer without a 100; a current lease still gets its 100, then the
// upstream's answer on the same connection.
func TestExpectContinueUnderARefusedLease(t *testing.T) {
	bothListeners(t, func(t *testing.T, tlsOn bool) {
		e := newEarlyEnv(t, tlsOn)
		expect := "Expect: 100-continue\r\nContent-Length: 2048\r\n\r\n"
		runHeads(t, []headCase{
			{"stale lease", e.open, e.write(e.stale, expect), 409},
			{"unknown lease", e.open, e.write("fl_nope", expect), 403},
			{"keyed, unknown lease", e.open, e.write("fl_nope", "Idempotency-Key: \"k3\"\r\n"+expect), 403},
			{"unauthenticated", e.authed, e.write(e.current, expect), 401},
		})
		c := e.open.dial(t)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.WriteString(c, e.write(e.current, "Expect: 100-continue\r\nContent-Length: 4\r\n\r\n"))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusContinue {
			t.Fatalf("a current lease with Expect: %v %v", resp, err)
		}
		_, _ = io.WriteString(c, "body")
		if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 || resp.Close {
			t.Fatalf("a current lease with Expect, after its body: %v %v", resp, err)
		}
		if got := e.up.seen(); len(got) != 1 || got[0].Body != "body" {
			t.Fatalf("the upstream got %+v", got)
		}
	})
}

// A keyed write (Idempotency-Key) has its lease judged before its body is
// read: under an unknown or stale lease, a 10 MB body that never comes
// gets its refusal at once.
func TestKeyedWriteJudgesTheLeaseFirst(t *testing.T) {
	bothListeners(t, func(t *testing.T, tlsOn bool) {
		e := newEarlyEnv(t, tlsOn)
		runHeads(t, []headCase{
			{"unknown lease", e.open, e.write("fl_nope", "Idempotency-Key: \"k1\"\r\nContent-Length: 10000000\r\n\r\n"), 403},
			{"stale lease", e.open, e.write(e.stale, "Idempotency-Key: \"k2\"\r\nContent-Length: 1000000\r\n\r\n"), 409},
			{"stale lease, chunked", e.open, e.write(e.stale, "Idempotency-Key: \"k4\"\r\nTransfer-Encoding: chunked\r\n\r\n"), 409},
		})
		// A keyed write under the current lease is still forwarded once.
		resp, body := e.open.roundTrip(t, e.write(e.current, "Idempotency-Key: \"k5\"\r\nContent-Length: 4\r\n\r\nbody"))
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplayed) != "" {
			t.Fatalf("a keyed write under the current lease: %d %s", resp.StatusCode, body)
		}
		if got := e.up.seen(); len(got) != 1 || got[0].Body != "body" {
			t.Fatalf("the upstream got %+v", got)
		}
	})
}

// Many heads whose bodies never come do not hold their connections: each
// is answered and closed by the gateway.
func TestEarlyRefusalsDoNotHoldConnections(t *testing.T) {
	up := newRecorder(t)
	tg := earlyGateway(t, up.URL, false, nil)
	const n = 1500
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", tg.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			raw := "POST /v1/proxy/svc/x HTTP/1.1\r\nHost: gw.example\r\nFencing-Lease: fl_x" + fmt.Sprint(i) + "\r\nContent-Length: 100\r\n\r\n"
			if _, err := io.WriteString(c, raw); err != nil {
				errs <- err
				return
			}
			out, err := io.ReadAll(c) // to the gateway's close
			if err != nil && !isReset(err) {
				errs <- fmt.Errorf("not closed: %w (%q)", err, out)
			} else if !strings.HasPrefix(string(out), "HTTP/1.1 403") {
				errs <- fmt.Errorf("answer %q", out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// The gateway wraps the body of a copy of the request Go's server hands
// it, never that request's own: the server looks at its own request's body
// once the answer starts (whether it was read to its end, or closed early)
// and must find its own there.
func TestGatewayLeavesTheServersRequestBody(t *testing.T) {
	tg := startFraming(t, "http://127.0.0.1:1", Config{}, false)
	for _, path := range []string{"/v1/proxy/svc/x", "/v1/leases", "/healthz"} {
		body := io.NopCloser(strings.NewReader("{}"))
		r := httptest.NewRequest(http.MethodPost, path, nil)
		r.Body, r.ContentLength = body, 2
		tg.g.ServeHTTP(httptest.NewRecorder(), r)
		if r.Body != body {
			t.Errorf("POST %s: the server's request's body was replaced by a %T", path, r.Body)
		}
	}
}

// An upstream that hangs up in the middle of a streamed body is answered
// while the client is still sending it: the failed send ends the exchange
// at once (502, the resource drains), without first waiting for the rest of
// the client's body, which net/http's server would read, up to 256 KiB and
// for as long as the client takes, if the forward closed the body it was
// given (openBody). The client here sends the rest only after the answer.
func TestUpstreamGoneMidBodyAnswersBeforeTheRest(t *testing.T) {
	for _, ends := range []struct{ client, upstream bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("tls client=%v upstream=%v", ends.client, ends.upstream), func(t *testing.T) {
			upstreamGoneMidBody(t, ends.client, ends.upstream)
		})
	}
}

func upstreamGoneMidBody(t *testing.T, clientTLS, upstreamTLS bool) {
	for _, tc := range []struct {
		name string
		head string // after the request line and Host
		part func(string) string
	}{
		{"content-length", "Content-Length: 262144\r\n", func(s string) string { return s }},
		{"chunked", "Transfer-Encoding: chunked\r\n", func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The upstream reads the head and some of the body, then resets
			// the connection.
			upLn, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = upLn.Close() })
			serverTLS, clientConfig := testCertificate(t)
			go func() {
				for {
					c, err := upLn.Accept()
					if err != nil {
						return
					}
					go func() {
						var rc net.Conn = c
						if upstreamTLS {
							rc = tls.Server(c, serverTLS)
						}
						br := bufio.NewReader(rc)
						if _, err := http.ReadRequest(br); err == nil {
							_, _ = io.CopyN(io.Discard, br, 8<<10)
						}
						_ = c.(*net.TCPConn).SetLinger(0)
						_ = c.Close()
					}()
				}
			}()
			scheme := "http://"
			if upstreamTLS {
				scheme = "https://"
			}
			tg := earlyGateway(t, scheme+upLn.Addr().String(), clientTLS, nil)
			tg.g.transport.TLSClientConfig = clientConfig
			lease := tg.lease(t, "gone-"+tc.name)
			c := tg.dial(t)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(c, "POST /v1/proxy/svc/gone HTTP/1.1\r\nHost: gw.example\r\n"+HeaderLease+": "+lease+"\r\n"+tc.head+"\r\n"); err != nil {
				t.Fatal(err)
			}
			// Parts until the gateway answers: its send to the reset
			// upstream fails on one of them.
			answer := make(chan *http.Response, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Errorf("no answer: %v", err)
					close(answer)
					return
				}
				answer <- resp
			}()
			// At most 192 KiB of the 256: what is left is less than
			// net/http's server reads when a handler closes a body early,
			// so a Close of the client's body would wait for the client.
			part := tc.part(strings.Repeat("x", 16<<10))
			var resp *http.Response
		send:
			for sent := 0; ; sent++ {
				if sent == 12 {
					select {
					case resp = <-answer:
						break send
					case <-time.After(10 * time.Second):
						t.Fatal("no answer after the upstream hung up, while the client holds the rest of its body")
					}
				}
				if _, err := io.WriteString(c, part); err != nil {
					t.Fatalf("sending part %d: %v", sent, err)
				}
				select {
				case resp = <-answer:
					break send
				case <-time.After(50 * time.Millisecond):
				}
			}
			if resp == nil {
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || !resp.Close {
				t.Fatalf("answer %d (closes the connection: %v), want 502 closing it (the upstream hung up mid-body, the rest of the body is unread)",
					resp.StatusCode, resp.Close)
			}
			if err := tg.svc.WaitDrains(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := tg.svc.Resource(t.Context(), "gone-"+tc.name); err != nil || st.DrainUntil.IsZero() {
				t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", st, err)
			}
		})
	}
}

// A client that half-closes its connection once its request is sent (as
// `nc -N` does, or a script's shutdown(SHUT_WR)) still reads its answer:
// net/http's server takes the EOF for a client gone and cancels the
// request's context, but a fenced write whose request reached the gateway
// is carried to its answer (direct.go), not aborted into an unknown
// outcome. The upstream's answer comes back, and the resource does not
// drain.
func TestHalfClosedClientGetsItsAnswer(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		time.Sleep(100 * time.Millisecond) // past the gateway's sight of the half-close
		fmt.Fprintf(w, "got %d", n)
	}))
	t.Cleanup(up.Close)
	tg := earlyGateway(t, up.URL, false, nil)
	big := strings.Repeat("x", 16<<10)
	for _, tc := range []struct{ name, head, body string }{
		{"small", "Content-Length: 4\r\n", "abcd"},
		{"streamed", "Content-Length: 16384\r\n", big},
		{"chunked", "Transfer-Encoding: chunked\r\n", "4000\r\n" + big + "\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resource := "half-" + tc.name
			lease := tg.lease(t, resource)
			c := tg.dial(t)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(c, "POST /v1/proxy/svc/half HTTP/1.1\r\nHost: gw.example\r\n"+HeaderLease+": "+lease+"\r\n"+tc.head+"\r\n"+tc.body); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer after the client half-closed: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			want := fmt.Sprintf("got %d", len(big))
			if tc.name == "small" {
				want = "got 4"
			}
			if resp.StatusCode != http.StatusOK || string(b) != want {
				t.Fatalf("answer %d %q; want the upstream's 200 %q", resp.StatusCode, b, want)
			}
			if err := tg.svc.WaitDrains(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := tg.svc.Resource(t.Context(), resource); err != nil || !st.DrainUntil.IsZero() {
				t.Fatalf("resource after a write carried to its answer: %+v %v; want no drain", st, err)
			}
		})
	}
}

// A control call whose client half-closes its connection after the
// request is never answered with a 5xx: net/http's server takes the EOF
// for a client gone and cancels the call, which then ends unanswered (the
// connection closed) unless it finished first (its 201).
func TestHalfClosedControlCallIsNotA5xx(t *testing.T) {
	tg := earlyGateway(t, "http://127.0.0.1:1", false, nil)
	for i := range 20 {
		c := tg.dial(t)
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		body := fmt.Sprintf(`{"resource":"half-acquire-%d","holder":"h","ttl_ms":5000}`, i)
		if _, err := fmt.Fprintf(c, "POST /v1/leases HTTP/1.1\r\nHost: gw.example\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // unanswered: the call was abandoned
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("a half-closed acquire got %d %s; want its 201 or no answer", resp.StatusCode, b)
		}
	}
}

// A waiting acquire whose client goes away (closes its connection, or
// half-closes it, as net/http's server counts it) stops waiting: the
// release it waited for grants it nothing, and it is not answered. The
// listener's own loop serves acquires and tells no request of its client
// by itself; the acquire asks it to (framing.WatchClient).
func TestAbandonedWaitingAcquireGrantsNothing(t *testing.T) {
	plain := earlyGateway(t, "http://127.0.0.1:1", false, nil)
	withTLS := earlyGateway(t, "http://127.0.0.1:1", true, nil)
	for _, mode := range []string{"closed", "half-closed", "tls/closed", "tls/half-closed"} {
		t.Run(mode, func(t *testing.T) {
			tg := plain
			if strings.HasPrefix(mode, "tls/") {
				tg = withTLS
			}
			resource := "wait-gone-" + strings.ReplaceAll(mode, "/", "-")
			holder := tg.lease(t, resource)
			c := tg.dial(t)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			body := fmt.Sprintf(`{"resource":%q,"holder":"waiter","ttl_ms":60000,"wait_ms":10000}`, resource)
			if _, err := fmt.Fprintf(c, "POST /v1/leases HTTP/1.1\r\nHost: gw.example\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // the acquire waits for the holder
			abandonAcquire(t, tg, c, strings.HasSuffix(mode, "half-closed"), resource, holder, func() {
				if _, err := tg.svc.Release(t.Context(), holder, ""); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// abandonedGrants is how many acquires tg counted as abandoned by their
// clients (fencegw_grants_total{result="abandoned"}).
func abandonedGrants(t *testing.T, tg *testGateway) float64 {
	t.Helper()
	var m dto.Metric
	if err := tg.g.metrics.grants["abandoned"].Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// abandonAcquire closes c, whose acquire waits for resource (or, half,
// half-closes it), waits until the gateway has ended the acquire (counted
// it abandoned), frees the resource (free) and checks that
// the acquire was not answered (if the connection can still be read) and
// that nothing was granted after holder's lease.
func abandonAcquire(t *testing.T, tg *testGateway, c net.Conn, half bool, resource, holder string, free func()) {
	t.Helper()
	ended := abandonedGrants(t, tg)
	switch c := c.(type) {
	case *tls.Conn:
		if half {
			_ = c.CloseWrite() // close_notify: the end of what the client sends
		} else {
			_ = c.Close()
		}
	case *net.TCPConn:
		if half {
			_ = c.CloseWrite()
		} else {
			_ = c.Close()
		}
	}
	for deadline := time.Now().Add(10 * time.Second); abandonedGrants(t, tg) == ended; {
		if time.Now().After(deadline) {
			t.Fatal("10 s after its client went, the acquire still waits: the gateway did not hear the client go")
		}
		time.Sleep(5 * time.Millisecond)
	}
	free()
	if half {
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("the abandoned acquire was answered %d %s; want the connection closed", resp.StatusCode, b)
		}
	}
	time.Sleep(500 * time.Millisecond) // a grant still waiting would be made by now
	st, err := tg.svc.Resource(t.Context(), resource)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lease == nil || st.Lease.ID != holder || st.Token != st.Lease.Token {
		t.Fatalf("after the client went and the resource was freed: token %d, lease %+v; want no grant after the holder's (%s)", st.Token, st.Lease, holder)
	}
}

// An acquire without wait_ms waits too, for a write of the previous token
// still in flight (up to the grant wait): one whose client goes away
// meanwhile (closed or half-closed, plain or TLS) stops, and the write's
// end grants it nothing; one whose client stays gets its lease once the
// write ends, and its connection serves the next request. The listener's
// own loop watches such an acquire's client only once it has run for
// quietAcquire (framing.WatchClientAfter).
func TestAbandonedAcquireWithoutWaitGrantsNothing(t *testing.T) {
	plain := earlyGateway(t, "http://127.0.0.1:1", false, nil)
	withTLS := earlyGateway(t, "http://127.0.0.1:1", true, nil)
	for _, mode := range []string{"closed", "half-closed", "stays", "tls/closed", "tls/half-closed", "tls/stays"} {
		t.Run(mode, func(t *testing.T) {
			tg := plain
			if strings.HasPrefix(mode, "tls/") {
				tg = withTLS
			}
			resource := "nowait-gone-" + strings.ReplaceAll(mode, "/", "-")
			// A write under the holder's lease, in flight until released.
			// A loaded machine may take the lease's 300 ms before the
			// write is admitted: the lease is then taken again.
			var holder string
			var permit *tokens.Permit
			for attempt := 1; ; attempt++ {
				holder = tg.leaseTTL(t, resource, 300*time.Millisecond)
				var err error
				if permit, err = tg.svc.Admit(t.Context(), holder, tokens.Write{Method: "POST", Upstream: "svc", Path: "/x"}); err == nil {
					break
				} else if attempt == 5 {
					t.Fatal(err)
				}
			}
			var once sync.Once
			writeEnds := func() { once.Do(func() { permit.Done(tokens.OutcomeKnown) }) }
			t.Cleanup(writeEnds)
			time.Sleep(400 * time.Millisecond) // the holder's lease has expired: a grant waits only for the write
			c := tg.dial(t)
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			body := fmt.Sprintf(`{"resource":%q,"holder":"next","ttl_ms":60000}`, resource)
			acquire := fmt.Sprintf("POST /v1/leases HTTP/1.1\r\nHost: gw.example\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			if _, err := io.WriteString(c, acquire); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // the acquire waits for the write
			if strings.HasSuffix(mode, "stays") {
				writeEnds()
				br := bufio.NewReader(c)
				for i, want := range []int{http.StatusCreated, http.StatusConflict} {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("answer %d: %v", i+1, err)
					}
					b, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != want {
						t.Fatalf("answer %d: %d %s; want %d", i+1, resp.StatusCode, b, want)
					}
					if i == 0 { // the connection serves the next request: an acquire of the now held resource
						if _, err := io.WriteString(c, acquire); err != nil {
							t.Fatal(err)
						}
					}
				}
				return
			}
			abandonAcquire(t, tg, c, strings.HasSuffix(mode, "half-closed"), resource, holder, writeEnds)
		})
	}
}
