package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// switchFencer is a tokens.Fencer over the embedded store and a local
// lock whose fences the test declares lost (lost): the state a replica is
// in when its lock session dies, without a database to kill sessions of
// (the PostgreSQL modes' own Check is tested with real sessions killed, in
// storage/storagetest's fence suite and cmd/fencegw).
type switchFencer struct {
	store  tokens.Store
	locker *tokens.LocalLocker
	lost   atomic.Bool
	checks atomic.Int64
	// gone, if set, is every fence's Lost: the test closes it (with lost
	// set) to declare the fences lost for good.
	gone chan struct{}
}

// Exclusive is the local lock's: grants, releases and revokes wait for the
// writes Hold admitted.
func (s *switchFencer) Exclusive(ctx context.Context, resource string) (func(), error) {
	return s.locker.Exclusive(ctx, resource)
}

func (s *switchFencer) Hold(ctx context.Context, leaseID string) (tokens.Verdict, error) {
	lease, err := s.store.Lease(ctx, leaseID)
	if err != nil {
		return tokens.Verdict{}, err
	}
	unlock, err := s.locker.Shared(ctx, lease.Resource)
	if err != nil {
		return tokens.Verdict{}, err
	}
	state, err := s.store.Resource(ctx, lease.Resource)
	if err != nil {
		unlock()
		return tokens.Verdict{}, err
	}
	now := state.Now
	if now.IsZero() {
		now = time.Now()
	}
	if refusal := tokens.Judge(lease, state, now); refusal != nil {
		unlock()
		return tokens.Verdict{Lease: lease, State: state, Refusal: refusal}, nil
	}
	return tokens.Verdict{Lease: *state.Lease, State: state, Held: &switchHeld{s: s, unlock: unlock}}, nil
}

type switchHeld struct {
	s      *switchFencer
	unlock func()
}

func (h *switchHeld) Release() { h.unlock() }

func (h *switchHeld) Check(time.Time) error {
	h.s.checks.Add(1)
	if h.s.lost.Load() {
		return &tokens.Error{Kind: tokens.ErrFenceLost}
	}
	return nil
}

// Lost is the fencer's gone: nil unless the test declares fences lost for
// good (as storage/postgres closes a fence's Lost when its session dies);
// a fence lost and found again (lost alone) only Check can say.
func (h *switchHeld) Lost() <-chan struct{} { return h.s.gone }

// recordingUpstream records what each request's body brought: the bytes,
// and whether it ended cleanly (a complete body) or was cut short.
type recordingUpstream struct {
	mu       sync.Mutex
	requests []upstreamRequest
	firstIn  chan struct{} // a byte of a streamed body arrived
	once     sync.Once
}

type upstreamRequest struct {
	path     string
	body     string
	complete bool
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var got []byte
	buf := make([]byte, 64)
	var err error
	for {
		var n int
		n, err = r.Body.Read(buf)
		got = append(got, buf[:n]...)
		if n > 0 && strings.HasPrefix(r.URL.Path, "/stream") {
			u.once.Do(func() { close(u.firstIn) })
		}
		if err != nil {
			break
		}
	}
	u.mu.Lock()
	u.requests = append(u.requests, upstreamRequest{path: r.URL.Path, body: string(got), complete: err == io.EOF})
	u.mu.Unlock()
	if err != io.EOF {
		return
	}
	_, _ = io.WriteString(w, "ok")
}

func (u *recordingUpstream) seen() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamRequest(nil), u.requests...)
}

// waitFirstIn waits until a byte of a streamed body has arrived.
func (u *recordingUpstream) waitFirstIn(t *testing.T) {
	t.Helper()
	select {
	case <-u.firstIn:
	case <-time.After(10 * time.Second):
		t.Fatal("the first part of the body never reached the upstream")
	}
}

// waitPath waits until the upstream has finished with a request to path.
func (u *recordingUpstream) waitPath(t *testing.T, path string) upstreamRequest {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, r := range u.seen() {
			if r.path == path {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream never finished with %s", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func startSwitchGateway(t *testing.T, upstream *httptest.Server) (*Gateway, *tokens.Service, *switchFencer, string) {
	t.Helper()
	store, err := bolt.Open(t.TempDir()+"/fencegw.db", bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fencer := &switchFencer{store: store, locker: tokens.NewLocalLocker()}
	svc := tokens.New(tokens.Config{Store: store, Fencer: fencer, Logger: log, DrainPeriod: time.Minute})
	target, _ := url.Parse(upstream.URL)
	g := New(svc, Config{Upstreams: map[string]*url.URL{"svc": target}, Logger: log})
	if upstream.TLS != nil {
		g.transport.TLSClientConfig = upstream.Client().Transport.(*http.Transport).TLSClientConfig
	}
	// Served as a replica serves it: through the gateway's listener, so a
	// plain write with a Content-Length is the own loop's (a test's TLS
	// front, httptest's, serves the same gateway on net/http's server).
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := Listener(srv, ln, nil)
	go func() { _ = srv.Serve(served) }()
	t.Cleanup(func() {
		_ = srv.Close()
		g.Close()
	})
	return g, svc, fencer, "http://" + ln.Addr().String()
}

type fenceLostProblem struct {
	Code string `json:"code"`
	Sent *bool  `json:"sent"`
}

func readFenceLost(t *testing.T, resp *http.Response) fenceLostProblem {
	t.Helper()
	defer resp.Body.Close()
	var p fenceLostProblem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("%d: %v", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || p.Code != tokens.CodeFenceLost || p.Sent == nil {
		t.Fatalf("answer %d %+v, want 503 fence_lost saying whether anything was sent", resp.StatusCode, p)
	}
	return p
}

// A write whose fence is lost before it is sent sends nothing, whatever it
// is: a small body to a plain-http upstream, to an https upstream (the
// check above TLS), a streamed body.
func TestFenceLostBeforeSendSendsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		body func() io.Reader
	}{
		{"small body", false, func() io.Reader { return strings.NewReader("small") }},
		{"https upstream", true, func() io.Reader { return strings.NewReader("small") }},
		{"streamed body", false, func() io.Reader { return io.MultiReader(strings.NewReader("chunk"), strings.NewReader("ed")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := &recordingUpstream{firstIn: make(chan struct{})}
			var upstream *httptest.Server
			if tc.tls {
				upstream = httptest.NewTLSServer(up)
			} else {
				upstream = httptest.NewServer(up)
			}
			t.Cleanup(upstream.Close)
			_, svc, fencer, addr := startSwitchGateway(t, upstream)
			lease, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "r", Holder: "h", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			write := func(path string) *http.Response {
				req, _ := http.NewRequest("POST", addr+"/v1/proxy/svc"+path, tc.body())
				req.Header.Set(HeaderLease, lease.ID)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			// The same path with the fence held: it is forwarded.
			if resp := write("/held"); resp.StatusCode != http.StatusOK {
				t.Fatalf("write with the fence held: %d", resp.StatusCode)
			} else {
				resp.Body.Close()
			}
			if fencer.checks.Load() == 0 {
				t.Fatal("a write was sent without its fence being checked")
			}
			fencer.lost.Store(true)
			if p := readFenceLost(t, write("/lost")); *p.Sent {
				t.Errorf("a write refused before anything was sent says sent: true")
			}
			for _, r := range up.seen() {
				if r.path == "/lost" {
					t.Fatalf("the upstream got %q of a write whose fence was lost before it was sent", r.body)
				}
			}
			// Nothing was sent: the outcome is known, no drain.
			if state, err := svc.Resource(t.Context(), "r"); err != nil || !state.DrainUntil.IsZero() {
				t.Fatalf("resource after a write refused before sending: %+v %v; want no drain", state, err)
			}
		})
	}
}

// A streamed body whose fence is lost midway stops at once: the next chunk
// is not sent, the upstream's exchange is cut (never a complete body), the
// client hears that some of it was sent, and the resource drains.
func TestFenceLostMidBodyNeverCompletesIt(t *testing.T) {
	up := &recordingUpstream{firstIn: make(chan struct{})}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	_, svc, fencer, addr := startSwitchGateway(t, upstream)
	lease, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "r", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		length int64 // -1: chunked
	}{{"chunked", -1}, {"content-length", int64(2 * smallBody)}} {
		t.Run(tc.name, func(t *testing.T) {
			up.once, up.firstIn = sync.Once{}, make(chan struct{})
			fencer.lost.Store(false)
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", addr+"/v1/proxy/svc/stream-"+tc.name, pr)
			req.ContentLength = tc.length
			req.Header.Set(HeaderLease, lease.ID)
			answer := make(chan *http.Response, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					close(answer)
					return
				}
				answer <- resp
			}()
			first := strings.Repeat("a", smallBody)
			if _, err := io.WriteString(pw, first); err != nil {
				t.Fatal(err)
			}
			up.waitFirstIn(t)
			fencer.lost.Store(true)
			go func() {
				_, _ = io.WriteString(pw, strings.Repeat("b", smallBody))
				_ = pw.Close()
			}()
			resp := <-answer
			if resp == nil {
				return
			}
			if p := readFenceLost(t, resp); !*p.Sent {
				t.Errorf("a write cut midway says sent: false")
			}
			got := up.waitPath(t, "/stream-"+tc.name)
			if got.complete || strings.Contains(got.body, "b") {
				t.Fatalf("the upstream got %d bytes (complete: %v), %d of them after the fence was lost",
					len(got.body), got.complete, strings.Count(got.body, "b"))
			}
			if err := svc.WaitDrains(t.Context()); err != nil { // recorded in the background
				t.Fatal(err)
			}
			state, err := svc.Resource(t.Context(), "r")
			if err != nil || state.DrainUntil.IsZero() {
				t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", state, err)
			}
		})
	}
}

// A streamed body whose client goes quiet midway, and whose fence is then
// lost for good (Lost closed, as when a PostgreSQL session dies), is
// answered at once: 503 fence_lost, "sent": true, closing the connection,
// while the client still holds the rest of its body. The engine's watch
// resets the upstream's exchange and halts the forward, whose read of the
// client's body fails then instead of waiting for the client (up to the
// body timeout). The upstream never gets a complete body, and the resource
// drains. Over TLS on either side too.
func TestFenceLostWhileClientQuietAnswersAtOnce(t *testing.T) {
	for _, ends := range []struct{ client, upstream bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("tls client=%v upstream=%v", ends.client, ends.upstream), func(t *testing.T) {
			fenceLostWhileClientQuiet(t, ends.client, ends.upstream)
		})
	}
}

func fenceLostWhileClientQuiet(t *testing.T, clientTLS, upstreamTLS bool) {
	up := &recordingUpstream{firstIn: make(chan struct{})}
	upstream := httptest.NewUnstartedServer(up)
	if upstreamTLS {
		upstream.StartTLS()
	} else {
		upstream.Start()
	}
	t.Cleanup(upstream.Close)
	g, svc, fencer, addr := startSwitchGateway(t, upstream)
	dial := func() (net.Conn, error) { return net.Dial("tcp", strings.TrimPrefix(addr, "http://")) }
	if clientTLS {
		front := httptest.NewUnstartedServer(g)
		front.StartTLS()
		t.Cleanup(front.Close)
		cfg := front.Client().Transport.(*http.Transport).TLSClientConfig
		dial = func() (net.Conn, error) { return tls.Dial("tcp", strings.TrimPrefix(front.URL, "https://"), cfg) }
	}
	for _, tc := range []struct {
		name  string
		head  string
		first string
	}{
		{"content-length", "Content-Length: 65536\r\n", strings.Repeat("a", 8<<10)},
		{"chunked", "Transfer-Encoding: chunked\r\n", "2000\r\n" + strings.Repeat("a", 8<<10) + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up.once, up.firstIn = sync.Once{}, make(chan struct{})
			fencer.lost.Store(false)
			fencer.gone = make(chan struct{})
			resource := "quiet-" + tc.name
			lease, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "h", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			path := "/stream-quiet-" + tc.name
			if _, err := io.WriteString(c, "POST /v1/proxy/svc"+path+" HTTP/1.1\r\nHost: gw\r\n"+HeaderLease+": "+lease.ID+"\r\n"+tc.head+"\r\n"+tc.first); err != nil {
				t.Fatal(err)
			}
			up.waitFirstIn(t)
			// The client now sends nothing more; the fence is lost for good.
			fencer.lost.Store(true)
			close(fencer.gone)
			lost := time.Now()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the client stayed quiet after its fence was lost: %v", err)
			}
			if waited := time.Since(lost); waited > 5*time.Second {
				t.Errorf("answered %v after the fence was lost", waited.Round(time.Millisecond))
			}
			if !resp.Close {
				t.Error("the answer does not close the connection, though the rest of the body is unread")
			}
			if p := readFenceLost(t, resp); !*p.Sent {
				t.Errorf("a write cut midway says sent: false")
			}
			if got := up.waitPath(t, path); got.complete {
				t.Fatalf("the upstream got a complete body of %d bytes", len(got.body))
			}
			if err := svc.WaitDrains(t.Context()); err != nil {
				t.Fatal(err)
			}
			if st, err := svc.Resource(t.Context(), resource); err != nil || st.DrainUntil.IsZero() {
				t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", st, err)
			}
		})
	}
}

// A fence lost for good while the upstream's early answer waits for a
// quiet client's body to stall (the 250 ms before the forward is halted)
// wins over that answer: 503 fence_lost, "sent": true, the connection
// closed, and the resource drains. The upstream answered, but on a request
// it never got whole, sent under a fence that is gone: the gateway does
// not relay an answer to bytes it can no longer vouch for, and treats the
// outcome as unknown (the conservative side of guarantee 1).
func TestFenceLostWhileAnEarlyAnswerWaits(t *testing.T) {
	answered := make(chan struct{})
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadFull(r.Body, make([]byte, 1024))
		w.Header().Set("Connection", "close") // Go's server answers now, without the rest of the body
		w.Header().Set("Content-Length", "4")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "seen")
		w.(http.Flusher).Flush()
		close(answered)
		<-release
	}))
	t.Cleanup(func() { close(release); upstream.Close() })
	_, svc, fencer, addr := startSwitchGateway(t, upstream)
	fencer.gone = make(chan struct{})
	lease, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "early-lost", Holder: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(addr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/proxy/svc/early-lost HTTP/1.1\r\nHost: gw\r\n"+HeaderLease+": "+lease.ID+
		"\r\nContent-Length: 65536\r\n\r\n"+strings.Repeat("a", 8<<10)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not answer early")
	}
	// The client sends nothing more; the fence is lost within the 250 ms
	// the early answer waits for the body to stall.
	fencer.lost.Store(true)
	close(fencer.gone)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	if !resp.Close {
		t.Error("the answer does not close the connection, though the rest of the body is unread")
	}
	if p := readFenceLost(t, resp); !*p.Sent {
		t.Errorf("a write cut midway says sent: false")
	}
	if err := svc.WaitDrains(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := svc.Resource(t.Context(), "early-lost"); err != nil || st.DrainUntil.IsZero() {
		t.Fatalf("resource after a write cut midway: %+v %v; want a drain (its outcome is unknown)", st, err)
	}
}
