package engine

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// testWrite is a Write whose fence the test declares lost (lost, and
// gone if not nil: closed by the test once the fence is lost for good),
// and which counts the checks and the bytes sent.
type testWrite struct {
	body   []byte
	lost   atomic.Bool
	gone   chan struct{}
	checks atomic.Int64
	sent   atomic.Int64
	halts  atomic.Int64 // Halt calls
	onHalt func()       // run by Halt, if set
}

func (w *testWrite) Lost() <-chan struct{} { return w.gone }

func (w *testWrite) Halt() {
	w.halts.Add(1)
	if w.onHalt != nil {
		w.onHalt()
	}
}

var errLost = errors.New("the fence is lost")

func (w *testWrite) Body() []byte { return w.body }

func (w *testWrite) CheckSend() error {
	w.checks.Add(1)
	if w.lost.Load() {
		return errLost
	}
	return nil
}

func (w *testWrite) Sent(n int) { w.sent.Add(int64(n)) }

// upstream records what each request's body brought, and whether it came
// to its end.
type upstream struct {
	*httptest.Server
	mu      sync.Mutex
	got     []string // path: body, "(cut)" if it did not end
	firstIn chan struct{}
	once    sync.Once
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{firstIn: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var got []byte
		buf := make([]byte, 64)
		var err error
		for {
			var n int
			n, err = r.Body.Read(buf)
			got = append(got, buf[:n]...)
			if n > 0 {
				u.once.Do(func() { close(u.firstIn) })
			}
			if err != nil {
				break
			}
		}
		s := r.URL.Path + ": " + string(got)
		if err != io.EOF {
			s += " (cut)"
		}
		u.mu.Lock()
		u.got = append(u.got, s)
		u.mu.Unlock()
		_, _ = io.WriteString(w, "ok "+r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.got...)
}

// waitFor waits until the upstream is done with n requests.
func (u *upstream) waitFor(t *testing.T, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if s := u.seen(); len(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream finished %d requests, want %d: %q", len(u.seen()), n, u.seen())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newTestTransport is a Transport whose dials are counted, speaking TLS
// with the client configuration tlsConfig if given one.
func newTestTransport(t *testing.T, tlsConfig ...*tls.Config) (*Transport, *atomic.Int64) {
	var dials atomic.Int64
	var d net.Dialer
	std := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
	if len(tlsConfig) > 0 {
		std.TLSClientConfig = tlsConfig[0]
	}
	std.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	e := New(std)
	t.Cleanup(e.CloseIdleConnections)
	return e, &dials
}

// post sends w, a POST of body (length bytes, -1: chunked; w.body if in
// memory), through e.
func post(t *testing.T, e *Transport, url string, w *testWrite, body io.Reader, length int64) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest("POST", url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	if w.body != nil {
		req.Body = io.NopCloser(strings.NewReader(string(w.body)))
	}
	return e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Time{}, &hooksSeen{})
}

// readAll returns a reader of an answer's body, that fails t on an error.
func readAll(t *testing.T) func(*http.Response, error) string {
	return func(resp *http.Response, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

// The engine carries a write whose body is in memory itself, checks its
// fence before sending it, reuses its connection for the next, and
// carries a streamed body too, checked alike.
func TestTransportCarriesPlainExchanges(t *testing.T) {
	up := newUpstream(t)
	e, dials := newTestTransport(t)
	for i := range 3 {
		w := &testWrite{body: []byte("small")}
		if got := readAll(t)(post(t, e, up.URL+"/small", w, nil, 5)); got != "ok /small" {
			t.Fatalf("write %d: %q", i, got)
		}
		if w.checks.Load() == 0 || w.sent.Load() == 0 {
			t.Fatalf("write %d: %d checks, %d bytes sent; want the fence checked and the bytes counted", i, w.checks.Load(), w.sent.Load())
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("3 writes one after the other dialled %d connections, want 1 kept alive", n)
	}
	streamed := &testWrite{}
	if got := readAll(t)(post(t, e, up.URL+"/streamed", streamed, strings.NewReader("streamed"), 8)); got != "ok /streamed" {
		t.Fatalf("a streamed write: %q", got)
	}
	if streamed.checks.Load() == 0 || streamed.sent.Load() == 0 {
		t.Errorf("a streamed write: %d checks, %d bytes sent; want the fence checked", streamed.checks.Load(), streamed.sent.Load())
	}
}

// A write whose fence is lost before it is sent sends nothing, whether the
// engine carries it (the error is then the proof's) or the http.Transport
// under it (which turns it into an error of its own: the Write's record of
// the failed check is what tells), and the next write goes through.
func TestLostFenceSendsNothing(t *testing.T) {
	up := newUpstream(t)
	e, _ := newTestTransport(t)
	for _, tc := range []struct {
		name     string
		body     io.Reader
		length   int64
		w        *testWrite
		proofErr bool
	}{
		{"engine", nil, 5, &testWrite{body: []byte("small")}, true},
		{"streamed", strings.NewReader("streamed"), 8, &testWrite{}, false},
	} {
		tc.w.lost.Store(true)
		_, err := post(t, e, up.URL+"/lost-"+tc.name, tc.w, tc.body, tc.length)
		if err == nil || tc.proofErr && !errors.Is(err, errLost) {
			t.Errorf("%s: %v, want the write to fail (with the proof's error, from the engine)", tc.name, err)
		}
		if tc.w.checks.Load() == 0 || tc.w.sent.Load() != 0 {
			t.Errorf("%s: %d checks, %d bytes sent; want a check and nothing sent", tc.name, tc.w.checks.Load(), tc.w.sent.Load())
		}
	}
	ok := &testWrite{body: []byte("after")}
	if got := readAll(t)(post(t, e, up.URL+"/after", ok, nil, 5)); got != "ok /after" {
		t.Fatalf("the write after: %q", got)
	}
	for _, s := range up.waitFor(t, 1) {
		if strings.HasPrefix(s, "/lost") {
			t.Errorf("the upstream got %q of a write whose fence was lost before it was sent", s)
		}
	}
}

// streamFirstPart starts a chunked post of body (which the test feeds
// through pw) to up's /stream under w, sends its first 100 bytes and waits
// until they reached the upstream. done yields the exchange's error (its
// answer's body closed).
func streamFirstPart(t *testing.T, e *Transport, up *upstream, w *testWrite, body io.Reader, pw *io.PipeWriter) (done <-chan error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		resp, err := post(t, e, up.URL+"/stream", w, body, -1)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	if _, err := io.WriteString(pw, strings.Repeat("a", 100)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-up.firstIn:
	case <-time.After(10 * time.Second):
		t.Fatal("the first part of the body never reached the upstream")
	}
	return errc
}

// A streamed body whose fence is lost midway is cut: the rest is not
// sent, and the upstream never sees a complete body.
func TestLostFenceMidBodyCutsIt(t *testing.T) {
	up := newUpstream(t)
	e, _ := newTestTransport(t)
	w := &testWrite{}
	pr, pw := io.Pipe()
	done := streamFirstPart(t, e, up, w, pr, pw)
	w.lost.Store(true)
	go func() {
		_, _ = io.WriteString(pw, strings.Repeat("b", 100))
		_ = pw.Close()
	}()
	if err := <-done; err == nil {
		t.Fatal("a write cut midway got an answer")
	}
	got := up.waitFor(t, 1)[0]
	if !strings.HasSuffix(got, "(cut)") || strings.Contains(got, "b") {
		t.Fatalf("the upstream got %q: want the first part only, cut", got)
	}
}

// closingBody is a request body whose Close waits until released, as the
// body of a request to net/http's server does: its Close reads the rest of
// the client's body (up to 256 KiB), however long the client takes.
type closingBody struct {
	io.Reader
	closing chan struct{} // closed when Close is called
	release chan struct{} // Close returns once it is closed
}

func (b *closingBody) Close() error {
	close(b.closing)
	<-b.release
	return nil
}

// A failed proof resets the upstream's exchange at once, not once the
// client's body is closed: Request.Write closes the body before it
// returns, and that Close may wait for the client (closingBody), while the
// upstream would hold a cut request open.
func TestLostFenceCutsBeforeTheBodyCloses(t *testing.T) {
	up := newUpstream(t)
	e, _ := newTestTransport(t)
	w := &testWrite{}
	pr, pw := io.Pipe()
	body := &closingBody{Reader: pr, closing: make(chan struct{}), release: make(chan struct{})}
	defer close(body.release)
	streamFirstPart(t, e, up, w, body, pw) // its outcome is the upstream's to tell
	w.lost.Store(true)
	go func() { _, _ = io.WriteString(pw, strings.Repeat("b", 100)) }()
	select {
	case <-body.closing:
	case <-time.After(10 * time.Second):
		t.Fatal("the body was never closed after the proof failed")
	}
	got := up.waitFor(t, 1)[0] // while the body's Close still waits
	if !strings.HasSuffix(got, "(cut)") || strings.Contains(got, "b") {
		t.Fatalf("the upstream got %q: want the first part only, cut", got)
	}
}

// A streamed body whose client goes quiet after its fence is lost for good
// (Write.Lost closed) is reset at once: the upstream does not hold the
// half-sent request until the client sends again or gives up, though no
// byte is pending and so no proof is taken, and the write is halted
// (Write.Halt), once. The exchange then fails on the fence (sent), whether
// the client finishes its body or breaks it, or, with a Halt that fails the
// body's read as the gateway's does, at once while the client stays quiet.
func TestLostFenceResetsAQuietBody(t *testing.T) {
	for _, then := range []string{"finishes", "breaks", "stays quiet"} {
		t.Run("client "+then, func(t *testing.T) {
			up := newUpstream(t)
			e, _ := newTestTransport(t)
			w := &testWrite{gone: make(chan struct{})}
			pr, pw := io.Pipe()
			// Before the upstream closes (cleanups run last first): a
			// failed test does not leave the body, and so the upstream's
			// handler, blocked.
			t.Cleanup(func() { _ = pw.CloseWithError(errors.New("the test is over")) })
			done := streamFirstPart(t, e, up, w, pr, pw)
			if then == "stays quiet" {
				w.onHalt = func() { _ = pw.CloseWithError(errors.New("halted")) }
			}
			w.lost.Store(true)
			close(w.gone)
			// The client sends nothing more until the upstream's handler
			// has seen its request cut.
			got := up.waitFor(t, 1)[0]
			if !strings.HasSuffix(got, "(cut)") {
				t.Fatalf("the upstream got %q: want the first part only, cut", got)
			}
			switch then {
			case "finishes":
				go func() {
					_, _ = io.WriteString(pw, strings.Repeat("b", 100))
					_ = pw.Close()
				}()
			case "breaks":
				_ = pw.CloseWithError(errors.New("the client went away"))
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the exchange did not end after its fence was lost, while its client sent nothing")
			}
			if !errors.Is(err, errLost) {
				t.Fatalf("the exchange ended with %v; want the fence's error", err)
			}
			if n := w.halts.Load(); n != 1 {
				t.Fatalf("the write was halted %d times; want once, after the reset", n)
			}
			if w.sent.Load() == 0 {
				t.Fatal("the exchange says nothing was sent, though the upstream got the head and a first part")
			}
			if got := up.seen(); len(got) != 1 || strings.Contains(got[0], "b") {
				t.Fatalf("the upstream got %q: want one request, cut before the rest", got)
			}
		})
	}
}

// The watch of a half-sent request ends with its write: the fence lost
// after a streamed request was written whole does not reset its
// connection, which goes back to the pool and carries the next write.
func TestFenceWatchEndsWithTheRequest(t *testing.T) {
	up := newUpstream(t)
	e, dials := newTestTransport(t)
	w := &testWrite{gone: make(chan struct{})}
	if got := readAll(t)(post(t, e, up.URL+"/stream", w, strings.NewReader("streamed"), -1)); got != "ok /stream" {
		t.Fatalf("the streamed write's answer: %q", got)
	}
	close(w.gone) // lost after the request left whole: not the exchange's to reset
	next := &testWrite{body: []byte("in memory")}
	if got := readAll(t)(post(t, e, up.URL+"/next", next, nil, int64(len(next.body)))); got != "ok /next" {
		t.Fatalf("the next write's answer: %q", got)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials: the connection of the streamed write was not reused", n)
	}
	if got := up.waitFor(t, 2); got[0] != "/stream: streamed" || got[1] != "/next: in memory" {
		t.Fatalf("the upstream got %q", got)
	}
}

// put closes the connections that were idle too long, oldest first, and
// keeps at most maxIdle.
// idleOf is e's idle connections to key (nil for none).
func idleOf(e *Transport, key upstreamKey) []*engineConn {
	if l := e.idle[key]; l != nil {
		return l.conns
	}
	return nil
}

func TestEnginePutPrunes(t *testing.T) {
	up := upstreamKey{host: "up"}
	e := &Transport{maxIdle: 2, idleTimeout: time.Minute, idle: map[upstreamKey]*idleList{}}
	conn := func() (*engineConn, net.Conn) {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return &engineConn{nc: a, tcp: a, key: up}, b
	}
	closed := func(peer net.Conn) bool {
		_ = peer.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := peer.Read(make([]byte, 1))
		return err == io.EOF
	}
	old, oldPeer := conn()
	e.put(old)
	old.idleAt -= 2 * time.Minute
	fresh, freshPeer := conn()
	e.put(fresh)
	if !closed(oldPeer) || closed(freshPeer) || len(idleOf(e, up)) != 1 || idleOf(e, up)[0] != fresh {
		t.Fatalf("after putting a fresh connection beside one idle for 2 minutes: %d idle", len(idleOf(e, up)))
	}
	second, _ := conn()
	e.put(second)
	extra, extraPeer := conn()
	e.put(extra)
	if len(idleOf(e, up)) != 2 || !closed(extraPeer) {
		t.Fatalf("maxIdle 2: %d idle, the third not closed", len(idleOf(e, up)))
	}
}

// The pool's lists are taken in place (idleList), and CloseIdleConnections
// takes them all away at once: connections given back, taken and closed
// at the same time neither race (under -race) nor leak. Every connection
// ends closed: by get (it cannot be checked here: no socket), by
// CloseIdleConnections, or left in the pool and closed by the last call.
func TestIdlePoolBesideCloseIdleConnections(t *testing.T) {
	up := upstreamKey{host: "up"}
	e := &Transport{std: &http.Transport{}, maxIdle: 4, idleTimeout: time.Minute, idle: map[upstreamKey]*idleList{},
		dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no dial here") }}
	const n = 300
	peers := make([]net.Conn, n)
	conns := make([]*engineConn, n)
	for i := range n {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		conns[i], peers[i] = &engineConn{nc: a, tcp: a, key: up, br: bufio.NewReader(a)}, b
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, c := range conns {
			e.put(c)
		}
	})
	wg.Go(func() {
		for range n {
			_, _, _ = e.get(context.Background(), up, time.Time{}, false)
		}
	})
	wg.Go(func() {
		for range n / 10 {
			e.CloseIdleConnections()
		}
	})
	wg.Wait()
	e.CloseIdleConnections()
	for i, peer := range peers {
		_ = peer.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("connection %d was not closed: %v", i, err)
		}
	}
}

// A connection given back after CloseIdleConnections goes to the pool the
// next call closes, not to the list the last lookup found (Transport.last):
// the list taken away must not be found again.
func TestCloseIdleConnectionsForgetsTheLastList(t *testing.T) {
	up := upstreamKey{host: "up"}
	e := &Transport{std: &http.Transport{}, maxIdle: 4, idleTimeout: time.Minute, idle: map[upstreamKey]*idleList{}}
	for i := range 2 {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		e.put(&engineConn{nc: a, tcp: a, key: up, br: bufio.NewReader(a)})
		e.CloseIdleConnections()
		_ = b.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := b.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("connection %d, given back after %d calls, was not closed by the next: %v", i, i, err)
		}
	}
}

// heldContinue is an upstream that takes one request with Expect:
// 100-continue and holds back its 100 Continue: it reads the head, says so
// (headIn), and then only reads, reporting what reached it after the head
// and how its connection ended (ended).
type heldContinue struct {
	addr   string
	headIn chan struct{}
	ended  chan heldContinueEnd
}

type heldContinueEnd struct {
	body []byte // what came after the head
	err  error  // the read that ended it (a reset: ECONNRESET)
}

// holdContinue starts a heldContinue, speaking TLS with cfg if it is not
// nil.
func holdContinue(t *testing.T, cfg *tls.Config) *heldContinue {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	u := &heldContinue{addr: ln.Addr().String(), headIn: make(chan struct{}), ended: make(chan heldContinueEnd, 1)}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			u.ended <- heldContinueEnd{err: err}
			return
		}
		defer c.Close()
		// Bounds the test if nothing ends the connection; not a wait.
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				u.ended <- heldContinueEnd{err: fmt.Errorf("head: %w", err)}
				return
			}
			if line == "\r\n" {
				break
			}
		}
		close(u.headIn)
		body, err := io.ReadAll(br)
		u.ended <- heldContinueEnd{body: body, err: err}
	}()
	return u
}

// A write with Expect: 100-continue whose upstream holds back its 100 is
// half-sent, as a quiet streamed body is: its head has left and it waits
// for the upstream's leave, which may be long in coming (an hour here).
// Once its fence is lost for good (Write.Lost closed) the connection is
// reset at once, over TLS too, where the reset is made below TLS: the
// upstream sees a reset, not a close it could take for the request's end,
// and no byte of the body. The exchange fails on the fence, without
// waiting for the 100 or its timeout. A body in memory is watched too:
// only its wait for the 100 can leave it half-sent.
func TestLostFenceResetsAWaitForContinue(t *testing.T) {
	for _, tc := range []struct {
		scheme   string
		inMemory bool
	}{{"http", true}, {"http", false}, {"https", true}, {"https", false}} {
		scheme := tc.scheme
		name := scheme + " streamed"
		if tc.inMemory {
			name = scheme + " in memory"
		}
		t.Run(name, func(t *testing.T) {
			std := &http.Transport{ExpectContinueTimeout: time.Hour}
			var serverTLS *tls.Config
			if scheme == "https" {
				certs := httptest.NewTLSServer(http.NotFoundHandler())
				serverTLS = certs.TLS.Clone()
				std.TLSClientConfig = certs.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
				certs.Close()
			}
			up := holdContinue(t, serverTLS)
			e := New(std)
			t.Cleanup(e.CloseIdleConnections)
			w := &testWrite{gone: make(chan struct{})}
			if tc.inMemory {
				w.body = []byte("body")
			}
			req, err := http.NewRequest("POST", scheme+"://"+up.addr+"/x", io.NopCloser(strings.NewReader("body")))
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = 4
			req.Header.Set("Expect", "100-continue")
			done := make(chan error, 1)
			go func() {
				resp, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Now().Add(time.Hour), &hooksSeen{})
				if err == nil {
					_ = resp.Body.Close()
				}
				done <- err
			}()
			select {
			case <-up.headIn:
			case end := <-up.ended:
				t.Fatalf("the upstream never got the head: %v", end.err)
			case <-time.After(10 * time.Second):
				t.Fatal("the head never reached the upstream")
			}
			w.lost.Store(true)
			close(w.gone)
			select {
			case err := <-done:
				if !errors.Is(err, errLost) {
					t.Fatalf("the exchange ended with %v; want the fence's error", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the exchange still waits for the upstream's 100 after its fence was lost")
			}
			end := <-up.ended
			if !errors.Is(end.err, syscall.ECONNRESET) {
				t.Errorf("the upstream's connection ended with %v; want a reset", end.err)
			}
			if len(end.body) != 0 {
				t.Errorf("the upstream got %q of the body, whose fence was lost before its 100", end.body)
			}
			if w.sent.Load() == 0 {
				t.Error("the exchange says nothing was sent, though the upstream got the head")
			}
		})
	}
}

// postX makes one exchange of POST /x with deadline through e to up, and
// requires up's answer.
func postX(t *testing.T, e *Transport, up *upstream, deadline time.Time) {
	t.Helper()
	req, err := http.NewRequest("POST", up.URL+"/x", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	w := &testWrite{body: []byte("x")}
	if got := readAll(t)(e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, deadline, &hooksSeen{})); got != "ok /x" {
		t.Fatalf("answer %q", got)
	}
}

// An exchange's deadline stays on its connection while the connection is
// idle (lifting it would cost each exchange a second SetDeadline): one
// that passed there neither fails the liveness check of the connection's
// reuse nor the next exchange, and an exchange without a deadline lifts it.
func TestIdleConnectionOutlivesItsDeadline(t *testing.T) {
	up := newUpstream(t)
	e, dials := newTestTransport(t)
	exchange := func(deadline time.Time) { t.Helper(); postX(t, e, up, deadline) }
	idle := func() *engineConn {
		t.Helper()
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, list := range e.idle {
			if len(list.conns) == 1 {
				return list.conns[0]
			}
		}
		t.Fatal("no idle connection")
		return nil
	}
	exchange(time.Now().Add(time.Hour))
	// As if the hour had passed while the connection was idle.
	idle().setDeadline(time.Now().Add(-time.Second))
	exchange(time.Now().Add(time.Hour))
	exchange(time.Time{})
	if c := idle(); c.deadline {
		t.Errorf("an exchange without a deadline left the last one's (%v) on its connection", c.deadlineAt)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("3 exchanges dialled %d connections, want 1 kept alive", n)
	}
}

// deadlineCounter counts the deadlines set on a connection.
type deadlineCounter struct {
	net.Conn
	n int
}

func (c *deadlineCounter) SetDeadline(t time.Time) error {
	c.n++
	return c.Conn.SetDeadline(t)
}

// Exchanges a few milliseconds apart whose deadlines are a minute ahead
// mostly keep the deadline on their connection (rounded up, package
// coarse) rather than set it again; one that moves it sets it.
func TestCloseExchangesKeepTheDeadlineOnTheSocket(t *testing.T) {
	up := newUpstream(t)
	e, _ := newTestTransport(t)
	exchange := func(deadline time.Time) { t.Helper(); postX(t, e, up, deadline) }
	exchange(time.Now().Add(time.Minute))
	e.mu.Lock()
	var c *engineConn
	for _, list := range e.idle {
		c = list.conns[0]
	}
	e.mu.Unlock()
	counter := &deadlineCounter{Conn: c.nc}
	c.nc = counter
	for range 20 {
		exchange(time.Now().Add(time.Minute))
	}
	if counter.n > 5 {
		t.Fatalf("20 exchanges a minute ahead set the deadline %d times; want a few", counter.n)
	}
	n := counter.n
	want := time.Now().Add(time.Hour)
	exchange(want)
	if counter.n != n+1 {
		t.Fatal("an exchange an hour ahead did not set its deadline")
	}
	if late := c.deadlineAt.Sub(want); late < 0 || late > 269*time.Millisecond { // coarse's coarsest step
		t.Fatalf("the deadline on the socket is %v from the exchange's", late)
	}
}

// An idle connection the upstream has closed, or on which it sent bytes
// nobody asked for, is not reused: the liveness check before a reuse
// (alive.go) sees the close (over TLS, the close_notify below TLS) or the
// bytes, and the next write goes out on a fresh connection instead of
// being sent into a dead one, where it would fail with its outcome unknown
// (a 502 and a drain at the gateway).
func TestReuseSkipsAConnectionTheUpstreamEnded(t *testing.T) {
	for _, scheme := range []string{"http", "https"} {
		for _, end := range []string{"closed", "unsolicited bytes"} {
			t.Run(scheme+" "+end, func(t *testing.T) {
				var mu sync.Mutex
				var idle []net.Conn // the upstream's side of its idle connections
				up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					_, _ = io.WriteString(w, "ok "+r.URL.Path)
				}))
				up.Config.ConnState = func(c net.Conn, s http.ConnState) {
					if s == http.StateIdle {
						mu.Lock()
						idle = append(idle, c)
						mu.Unlock()
					}
				}
				if scheme == "https" {
					up.StartTLS()
				} else {
					up.Start()
				}
				t.Cleanup(up.Close)
				var tlsConfig *tls.Config
				if scheme == "https" {
					tlsConfig = up.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
				}
				e, dials := newTestTransport(t, tlsConfig)
				write := func(path string) {
					t.Helper()
					w := &testWrite{body: []byte("x")}
					if got := readAll(t)(post(t, e, up.URL+path, w, nil, 1)); got != "ok "+path {
						t.Fatalf("%s: answer %q", path, got)
					}
				}
				write("/first")
				var pooled *engineConn
				for deadline := time.Now().Add(5 * time.Second); ; {
					e.mu.Lock()
					for _, list := range e.idle {
						if len(list.conns) == 1 {
							pooled = list.conns[0]
						}
					}
					e.mu.Unlock()
					mu.Lock()
					n := len(idle)
					mu.Unlock()
					if pooled != nil && n == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after one exchange: pooled %v, %d idle at the upstream", pooled != nil, n)
					}
					time.Sleep(time.Millisecond)
				}
				mu.Lock()
				if end == "closed" {
					_ = idle[0].Close()
				} else {
					_, _ = io.WriteString(idle[0], "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
				}
				mu.Unlock()
				// The FIN or the bytes are on their way over loopback: wait
				// until the check can see them (a check that never does fails
				// here), then write.
				for deadline := time.Now().Add(5 * time.Second); pooled.alive(); {
					if time.Now().After(deadline) {
						t.Fatalf("the pooled connection still looks alive 5 s after the upstream %s", end)
					}
					time.Sleep(time.Millisecond)
				}
				write("/second")
				if n := dials.Load(); n != 2 {
					t.Errorf("%d dials, want 2: the second write must go out on a fresh connection", n)
				}
			})
		}
	}
}
