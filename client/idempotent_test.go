package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/client"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/tokens"
)

// keyedEnv: a real gateway with idempotency on a bolt store, and an
// upstream that counts how often each key was applied and can be made
// slower than the forward timeout.
type keyedEnv struct {
	gw      *httptest.Server
	mu      sync.Mutex
	applied map[string]int
	arrived atomic.Int32 // requests that reached the upstream, applied or not yet
	// slow holds every write at the upstream until land is called: past
	// the forward timeout, it lands anyway.
	slow     atomic.Bool
	held     chan struct{}
	landOnce sync.Once
}

// land lets the writes held by slow be applied.
func (e *keyedEnv) land() { e.landOnce.Do(func() { close(e.held) }) }

func newKeyedEnv(t *testing.T) *keyedEnv {
	e := &keyedEnv{applied: map[string]int{}, held: make(chan struct{})}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		e.arrived.Add(1)
		if e.slow.Load() {
			<-e.held
		}
		e.mu.Lock()
		e.applied[r.Header.Get(client.HeaderIdempotencyKey)]++
		e.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "line added")
	}))
	t.Cleanup(up.Close)
	t.Cleanup(e.land) // before the upstream closes: it waits for its handlers
	store := openStore(t)
	u, _ := url.Parse(up.URL)
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: discard, DrainPeriod: 100 * time.Millisecond})
	gw := gateway.New(svc, gateway.Config{Upstreams: map[string]*url.URL{"statements": u}, Logger: discard,
		ForwardTimeout: 100 * time.Millisecond,
		Idempotency:    tokens.NewIdempotency(tokens.IdempotencyConfig{Store: store, InFlight: time.Second})})
	t.Cleanup(gw.Close)
	e.gw = httptest.NewServer(gw)
	t.Cleanup(e.gw.Close)
	return e
}

func (e *keyedEnv) counts() (writes, keys int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.applied {
		writes += n
	}
	return writes, len(e.applied)
}

// losingTransport delivers requests but loses the first n answers, as a
// connection that breaks after the request was sent.
type losingTransport struct {
	base http.RoundTripper
	n    atomic.Int32
}

func (l *losingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(r)
	if err == nil && strings.Contains(r.URL.Path, "/v1/proxy/") && l.n.Add(-1) >= 0 {
		_ = resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

func TestC06DoIdempotentRetriesALostAnswerOnce(t *testing.T) {
	e := newKeyedEnv(t)
	lt := &losingTransport{base: &http.Transport{}}
	lt.n.Store(1)
	c, err := client.New(e.gw.URL, client.WithHTTPClient(&http.Client{Transport: lt}))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(t.Context(), "acct/1", client.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://statements/lines", strings.NewReader("amount=5"))
	resp, err := l.DoIdempotent(req, client.IdempotentOptions{Backoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("DoIdempotent: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != "line added" || !client.Replayed(resp) {
		t.Fatalf("answer %d %q replayed=%v; want the first attempt's 201, replayed", resp.StatusCode, body, client.Replayed(resp))
	}
	if w, k := e.counts(); w != 1 || k != 1 {
		t.Fatalf("upstream applied %d writes under %d keys, want 1 under 1", w, k)
	}
	// Two logical writes are two keys.
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, "http://statements/lines", strings.NewReader("amount=5"))
		resp, err := l.DoIdempotent(req, client.IdempotentOptions{})
		if err != nil || client.Replayed(resp) {
			t.Fatalf("new logical write: %v replayed=%v", err, err == nil && client.Replayed(resp))
		}
		resp.Body.Close()
	}
	if w, k := e.counts(); w != 3 || k != 3 {
		t.Fatalf("upstream applied %d writes under %d keys, want 3 under 3", w, k)
	}
}

func TestDoIdempotentTimeoutIsOutcomeUnknown(t *testing.T) {
	e := newKeyedEnv(t)
	e.slow.Store(true)
	c, err := client.New(e.gw.URL, client.WithHTTPClient(&http.Client{Transport: &http.Transport{}}))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(t.Context(), "acct/2", client.AcquireOptions{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://statements/lines", strings.NewReader("amount=5"))
	_, err = l.DoIdempotent(req, client.IdempotentOptions{Backoff: 10 * time.Millisecond})
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("DoIdempotent after a 504: %v, want ErrOutcomeUnknown", err)
	}
	if e := asError(t, err); e.Code != client.CodeOutcomeUnknown || e.Status != http.StatusConflict {
		t.Fatalf("error %+v", e)
	}
	// Every write that reached the upstream now lands; the answer was
	// unknown, so none may have been sent again.
	e.land()
	deadline := time.Now().Add(10 * time.Second)
	for w, _ := e.counts(); w < int(e.arrived.Load()); w, _ = e.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("the held writes never landed: %d of %d", w, e.arrived.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w, _ := e.counts(); w != 1 {
		t.Fatalf("upstream applied %d writes, want 1", w)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://statements/lines", strings.NewReader("x"))
	if _, err := l.DoIdempotent(req, client.IdempotentOptions{}); err == nil || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("cancelled DoIdempotent: %v", err)
	}
}
