package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fencegw/fencegw/api"
	"github.com/fencegw/fencegw/client"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

func TestMain(m *testing.M) {
	if upstream := os.Getenv(childGatewayEnv); upstream != "" {
		runChildGateway(upstream, os.Getenv(childGatewayEnv+"_DIR")) // TestC09GatewayPausedLongerThanTTL: this process is the gateway
		return
	}
	goleak.VerifyTestMain(m)
}

// arrival is one request as the upstream saw it.
type arrival struct {
	Method, Path, Body string
	Token              int64
	HadLease           bool
}

// upstream is a protected service recording what reached it. /conflict
// answers with its own 409 problem document.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []arrival
}

const upstreamProblem = `{"type":"https://statements.example/problems/duplicate","title":"Duplicate line","status":409,"code":"duplicate"}`

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tok, _ := strconv.ParseInt(r.Header.Get(gateway.HeaderToken), 10, 64)
		u.mu.Lock()
		u.arrivals = append(u.arrivals, arrival{Method: r.Method, Path: r.URL.RequestURI(), Body: string(body), Token: tok,
			HadLease: r.Header.Get(gateway.HeaderLease) != ""})
		u.mu.Unlock()
		if r.URL.Path == "/conflict" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, upstreamProblem)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok")
	}))
	return u
}

func (u *upstream) seen() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]arrival(nil), u.arrivals...)
}

// env is a real gateway on a bbolt store, served by httptest, protecting
// the "statements" upstream (and "dead", which nothing listens on).
type env struct {
	t       *testing.T
	up      *upstream
	store   *bolt.Store
	srv     *httptest.Server
	handler atomic.Pointer[http.Handler] // what srv serves; swappable
	tr      *http.Transport              // the workers' transport
	api     *api.ClientWithResponses
}

var discard = slog.New(slog.DiscardHandler)

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, up: newUpstream(t), tr: &http.Transport{}}
	e.store = openStore(t)
	e.handler.Store(ptr(e.newGateway(e.store)))
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		(*e.handler.Load()).ServeHTTP(w, r)
	}))
	var err error
	e.api, err = api.NewClientWithResponses(e.srv.URL, api.WithHTTPClient(&http.Client{Transport: e.tr}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.srv.Close()
		e.up.Close()
		e.tr.CloseIdleConnections()
	})
	return e
}

func ptr[T any](v T) *T { return &v }

func openStore(t *testing.T) *bolt.Store {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "fencegw.db"), bolt.Options{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

func (e *env) newGateway(store *bolt.Store) http.Handler {
	up, _ := url.Parse(e.up.URL)
	dead, _ := url.Parse("http://" + closedAddr(e.t))
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: discard})
	gw := gateway.New(svc, gateway.Config{Upstreams: map[string]*url.URL{"statements": up, "dead": dead}, Logger: discard})
	e.t.Cleanup(gw.Close)
	return gw
}

// closedAddr is an address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// client returns an SDK client for the gateway whose requests go through rt
// (nil: the env's transport).
func (e *env) client(holder string, rt http.RoundTripper) *client.Client {
	e.t.Helper()
	if rt == nil {
		rt = e.tr
	}
	c, err := client.New(e.srv.URL, client.WithHTTPClient(&http.Client{Transport: rt}), client.WithHolder(holder))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) acquire(c *client.Client, resource string, opts client.AcquireOptions) *client.Lease {
	e.t.Helper()
	l, err := c.Acquire(context.Background(), resource, opts)
	if err != nil {
		e.t.Fatalf("acquire %s: %v", resource, err)
	}
	e.t.Cleanup(func() { _ = l.Close() })
	return l
}

// stallingTransport blocks renewals while stalled, as a frozen process's
// keep-alive would be, until their context ends.
type stallingTransport struct {
	base    http.RoundTripper
	stalled atomic.Bool
}

func (s *stallingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.stalled.Load() && strings.HasSuffix(r.URL.Path, "/renew") {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return s.base.RoundTrip(r)
}

func write(t *testing.T, l *client.Lease, path, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://statements"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := l.Do(req)
	if err == nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

func mustWrite(t *testing.T, l *client.Lease, path, body string) {
	t.Helper()
	resp, err := write(t, l, path, body)
	if err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Fatalf("write %s: %d %q", path, resp.StatusCode, b)
	}
}

func isDone(l *client.Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// waitDone waits for l.Done at most within and returns how long it took.
// waitDone waits for the lease's Done; within only bounds a hang.
func waitDone(t *testing.T, l *client.Lease, within time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(within):
		t.Fatalf("Done not closed within %v", within)
	}
}

func asError(t *testing.T, err error) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *client.Error", err, err)
	}
	return e
}

const shortTTL = 600 * time.Millisecond

func TestC01AutoRenewKeepsLeaseAlive(t *testing.T) {
	// Longer than shortTTL: the lease must survive a loaded CI machine
	// pausing the renewer, or the gateway's answers, for most of a second
	// (a 1 s lease was lost once so, every package's tests under -race on
	// 2 cores: no renewal answered for the 700 ms its renewals had).
	const renewTTL = 2 * time.Second
	e := newEnv(t)
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: renewTTL})
	if l.Token() != 1 || l.Resource() != "stmt:acct:1" || l.Holder() != "w1" || l.TTL() != renewTTL {
		t.Fatalf("lease: token %d resource %q holder %q ttl %v", l.Token(), l.Resource(), l.Holder(), l.TTL())
	}
	end := time.Now().Add(6 * renewTTL) // about 18 renewals
	writes := 0
	for time.Now().Before(end) {
		if err := l.Err(); err != nil {
			t.Fatalf("lease lost after %d writes: %v", writes, err)
		}
		mustWrite(t, l, "/accounts/1/lines", "line "+strconv.Itoa(writes))
		writes++
		time.Sleep(renewTTL / 2)
	}
	if isDone(l) {
		t.Fatal("Done closed while renewing")
	}
	if d := time.Until(l.Deadline()); d <= 0 || d > renewTTL {
		t.Fatalf("deadline %v from now, want within (0, %v]", d, renewTTL)
	}
	res, err := e.api.GetResourceWithResponse(context.Background(), "stmt:acct:1")
	if err != nil || res.JSON200 == nil {
		t.Fatalf("get resource: %v %s", err, res.Body)
	}
	if !res.JSON200.Held || res.JSON200.Token != 1 {
		t.Fatalf("resource after %v: held %v token %d, want held with token 1", 6*renewTTL, res.JSON200.Held, res.JSON200.Token)
	}
	for _, a := range e.up.seen() {
		if a.Token != 1 || a.HadLease || a.Path != "/accounts/1/lines" {
			t.Fatalf("upstream saw %+v", a)
		}
	}

	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
	if !isDone(l) || !errors.Is(l.Err(), client.ErrReleased) || !errors.Is(context.Cause(l.Context()), client.ErrReleased) {
		t.Fatalf("after release: done %v err %v", isDone(l), l.Err())
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("second release: %v", err)
	}
	_, err = write(t, l, "/accounts/1/lines", "after release")
	if !errors.Is(err, client.ErrStale) || asError(t, err).Code != client.CodeLeaseReleased {
		t.Fatalf("write after release: %v", err)
	}
}

func TestC08DoneWhenGatewayStops(t *testing.T) {
	e := newEnv(t)
	c := e.client("w1", nil)
	l := e.acquire(c, "stmt:acct:1", client.AcquireOptions{TTL: shortTTL})
	time.Sleep(shortTTL / 2)
	start := time.Now()
	e.srv.Close()
	e.tr.CloseIdleConnections()
	// Done closes at the lease's local deadline, which no renewal can have
	// moved past one TTL after the gateway stopped; the wait only bounds a
	// hang.
	waitDone(t, l, 10*time.Second)
	if deadline := l.Deadline(); deadline.After(start.Add(shortTTL)) {
		t.Fatalf("local deadline %v is more than one TTL (%v) after the gateway stopped at %v", deadline, shortTTL, start)
	}
	if !errors.Is(l.Err(), client.ErrLeaseLost) || errors.Is(l.Err(), client.ErrStale) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	if !errors.Is(context.Cause(l.Context()), client.ErrLeaseLost) {
		t.Fatalf("Context cause = %v", context.Cause(l.Context()))
	}

	_, err := c.Acquire(context.Background(), "stmt:acct:2", client.AcquireOptions{})
	if !errors.Is(err, client.ErrUnavailable) || asError(t, err).Status != 0 {
		t.Fatalf("acquire from a stopped gateway: %v", err)
	}
	if err := l.Release(context.Background()); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("release on a stopped gateway: %v", err)
	}
	if _, err := write(t, l, "/x", ""); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("write to a stopped gateway: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Acquire(ctx, "stmt:acct:2", client.AcquireOptions{}); !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("acquire with a cancelled context: %v", err)
	}
}

// The classic incident: A stalls past its TTL (its renewals too), B takes
// the lease, A wakes and writes. A learns from Done, and its write is
// refused by the gateway, never reaching the upstream.
func TestC05StalledWorkerIsFenced(t *testing.T) {
	e := newEnv(t)
	stall := &stallingTransport{base: e.tr}
	a := e.acquire(e.client("worker-a", stall), "stmt:acct:88213", client.AcquireOptions{TTL: shortTTL})
	mustWrite(t, a, "/accounts/88213/lines", "A before the stall")

	stall.stalled.Store(true)
	start := time.Now()
	b, err := e.client("worker-b", nil).Acquire(context.Background(), "stmt:acct:88213", client.AcquireOptions{TTL: 10 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("B acquire: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if b.Token() != a.Token()+1 {
		t.Fatalf("B token %d, A token %d", b.Token(), a.Token())
	}
	// Done fires at the local deadline: the last renewal's send time plus
	// the TTL minus the margin. What keeps A safe is that this deadline is
	// never later than the gateway's own expiry of the lease (the instant
	// B could be granted), whatever the machine's speed; the wait below
	// only bounds a hang.
	waitDone(t, a, 10*time.Second)
	got, err := e.api.GetLeaseWithResponse(context.Background(), a.ID())
	if err != nil || got.JSON200 == nil {
		t.Fatalf("A's lease at the gateway: %v %s", err, got.Body)
	}
	if deadline, expiry := a.Deadline(), got.JSON200.ExpiresAt; deadline.After(expiry) {
		t.Fatalf("A's local deadline %v is after the gateway's expiry %v of its lease", deadline, expiry)
	}
	if deadline := a.Deadline(); deadline.After(start.Add(shortTTL)) {
		t.Fatalf("A's local deadline %v is more than a TTL (%v) after the stall began at %v: a renewal counted that never reached the gateway", deadline, shortTTL, start)
	}
	if !errors.Is(a.Err(), client.ErrLeaseLost) {
		t.Fatalf("A.Err = %v", a.Err())
	}
	mustWrite(t, b, "/accounts/88213/lines", "B's statement")

	_, err = write(t, a, "/accounts/88213/lines", "A after the stall")
	if !errors.Is(err, client.ErrStale) || !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("A's stale write: %v, want ErrStale", err)
	}
	pe := asError(t, err)
	if pe.Status != http.StatusConflict || pe.Code != client.CodeStaleToken || pe.Token != a.Token() || pe.CurrentToken != b.Token() || pe.Op != client.OpWrite {
		t.Fatalf("A's stale write: %+v", pe)
	}
	for _, x := range e.up.seen() {
		if x.Body == "A after the stall" {
			t.Fatal("the stale write reached the upstream")
		}
	}
	rej, err := e.api.ListRejectionsWithResponse(context.Background(), &api.ListRejectionsParams{})
	if err != nil || rej.JSON200 == nil || len(rej.JSON200.Items) != 1 || rej.JSON200.Items[0].Holder != "worker-a" || rej.JSON200.Items[0].Code != "stale_token" {
		t.Fatalf("rejections: %v %s", err, rej.Body)
	}
	// Release of a lease the gateway said was superseded does not free
	// anyone else's.
	if err := a.Release(context.Background()); !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("A release: %v", err)
	}
	mustWrite(t, b, "/accounts/88213/lines", "B still holds it")
}

// A stale answer marks the lease lost at once, before any renewal could.
func TestC04StaleAnswerMarksLeaseLost(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
	rel, err := e.api.ReleaseLeaseWithResponse(context.Background(), l.ID()) // released behind its back
	if err != nil || rel.StatusCode() != http.StatusNoContent {
		t.Fatalf("release: %v %s", err, rel.Body)
	}
	if isDone(l) {
		t.Fatal("Done before any sign of loss")
	}
	_, err = write(t, l, "/accounts/1/lines", "x")
	if !errors.Is(err, client.ErrStale) || asError(t, err).Code != client.CodeLeaseReleased {
		t.Fatalf("write: %v", err)
	}
	if !isDone(l) || !errors.Is(l.Err(), client.ErrStale) {
		t.Fatalf("after a stale answer: done %v err %v", isDone(l), l.Err())
	}
}

// A renewal answered lease_lost ends the lease within one renewal period.
func TestC03RenewLeaseLost(t *testing.T) {
	e := newEnv(t)
	// A renewal every second, the local deadline 2.7 s after the last good
	// one: the renewal after the release answers long before it, even on a
	// loaded machine (shortTTL's 600 ms let the deadline win under CI's load).
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: 3 * time.Second})
	rel, err := e.api.ReleaseLeaseWithResponse(context.Background(), l.ID())
	if err != nil || rel.StatusCode() != http.StatusNoContent {
		t.Fatalf("release: %v %s", err, rel.Body)
	}
	waitDone(t, l, 10*time.Second) // a hang bound: the renewal's answer, not the deadline, must have ended it
	pe := asError(t, l.Err())
	if pe.Op != client.OpRenew || pe.Code != client.CodeLeaseLost || !errors.Is(l.Err(), client.ErrLeaseLost) || errors.Is(l.Err(), client.ErrStale) {
		t.Fatalf("Err = %+v", pe)
	}
}

// A gateway that never granted the lease (its data is gone) answers
// unknown_lease: stale.
func TestUnknownLease(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
	e.handler.Store(ptr(e.newGateway(openStore(t))))
	_, err := write(t, l, "/accounts/1/lines", "x")
	if !errors.Is(err, client.ErrStale) || asError(t, err).Status != http.StatusForbidden || asError(t, err).Code != client.CodeUnknownLease {
		t.Fatalf("write: %v", err)
	}
	if !isDone(l) {
		t.Fatal("Done not closed after unknown_lease")
	}
}

func TestOrphan(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: shortTTL})
	l.Orphan()
	res, err := e.api.GetResourceWithResponse(context.Background(), "stmt:acct:1")
	if err != nil || res.JSON200 == nil || !res.JSON200.Held {
		t.Fatalf("orphaned lease not held: %v %s", err, res.Body)
	}
	waitDone(t, l, 10*time.Second)
	// The gateway's count started later than ours: wait for its verdict.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := e.api.GetLeaseWithResponse(context.Background(), l.ID())
		if err == nil && got.JSON200 != nil && got.JSON200.State == api.Expired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never saw the orphaned lease expire: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.Release(context.Background()); !errors.Is(err, client.ErrLeaseLost) || asError(t, err).Code != client.CodeLeaseLost {
		t.Fatalf("release of an expired lease: %v", err)
	}
}

func TestC11C12UpstreamAnswersPassThrough(t *testing.T) {
	e := newEnv(t)
	l := e.acquire(e.client("w1", nil), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
	resp, err := write(t, l, "/conflict", "x")
	if err != nil {
		t.Fatalf("the upstream's own 409 became an error: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusConflict || string(b) != upstreamProblem {
		t.Fatalf("upstream 409: %d %q", resp.StatusCode, b)
	}
	if isDone(l) {
		t.Fatal("the upstream's 409 marked the lease lost")
	}

	// HTTPClient: the request's own scheme and host are ignored; path,
	// escapes and query are kept.
	hc := l.HTTPClient("statements")
	resp, err = hc.Post("https://10.9.9.9:9999/accounts/a%2Fb/lines?x=1&y=2", "text/plain", strings.NewReader("via HTTPClient"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	seen := e.up.seen()
	last := seen[len(seen)-1]
	if resp.StatusCode != http.StatusOK || last.Path != "/accounts/a%2Fb/lines?x=1&y=2" || last.Body != "via HTTPClient" || last.Token != l.Token() {
		t.Fatalf("HTTPClient write: %d, upstream saw %+v", resp.StatusCode, last)
	}
}

func TestC10C11C08TypedErrors(t *testing.T) {
	e := newEnv(t)
	a := e.acquire(e.client("worker-a", nil), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
	b := e.client("worker-b", nil)

	_, err := b.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: time.Second})
	pe := asError(t, err)
	if !errors.Is(err, client.ErrLeaseHeld) || pe.Holder != "worker-a" || pe.CurrentToken != a.Token() || pe.RetryAfter < time.Second || pe.ExpiresAt.IsZero() {
		t.Fatalf("acquire of a held resource: %v %+v", err, pe)
	}
	for _, s := range []error{client.ErrStale, client.ErrLeaseLost, client.ErrUnavailable, client.ErrUpstream} {
		if errors.Is(err, s) {
			t.Fatalf("lease_held matches %v", s)
		}
	}

	_, err = b.Acquire(context.Background(), "stmt:acct:2", client.AcquireOptions{TTL: 10 * time.Millisecond})
	if pe := asError(t, err); pe.Status != http.StatusBadRequest || pe.Code != client.CodeInvalidRequest || pe.Field != "ttl_ms" {
		t.Fatalf("acquire with a bad ttl: %+v", pe)
	}

	req, _ := http.NewRequest(http.MethodPut, "http://nowhere/x", nil)
	_, err = a.Do(req)
	if pe := asError(t, err); pe.Status != http.StatusNotFound || pe.Code != client.CodeUnknownUpstream || errors.Is(err, client.ErrStale) || isDone(a) {
		t.Fatalf("write to an unknown upstream: %+v", pe)
	}

	req, _ = http.NewRequest(http.MethodPut, "http://dead/x", nil)
	_, err = a.Do(req)
	if pe := asError(t, err); !errors.Is(err, client.ErrUpstream) || pe.Status != http.StatusBadGateway || pe.Code != client.CodeUpstreamUnreachable || errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("write to a dead upstream: %+v", pe)
	}

	_ = e.store.Close() // the token store goes away: fail closed
	_, err = b.Acquire(context.Background(), "stmt:acct:3", client.AcquireOptions{})
	if pe := asError(t, err); !errors.Is(err, client.ErrUnavailable) || pe.Status != http.StatusServiceUnavailable || pe.Code != client.CodeStoreUnavailable || pe.RetryAfter < time.Second {
		t.Fatalf("acquire with the store down: %+v", pe)
	}
	_, err = write(t, a, "/accounts/1/lines", "x")
	if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrStale) || isDone(a) {
		t.Fatalf("write with the store down: %v", err)
	}
	if n := len(e.up.seen()); n != 0 {
		t.Fatalf("upstream saw %d requests", n)
	}
	if msg := fmt.Sprint(err); !strings.Contains(msg, "503 store_unavailable") {
		t.Fatalf("message %q", msg)
	}
}

func TestNew(t *testing.T) {
	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := client.New(bad); err == nil {
			t.Errorf("New(%q) accepted", bad)
		}
	}
	if _, err := client.New("http://127.0.0.1:8080/"); err != nil {
		t.Fatal(err)
	}
}
