package client_test

// The behaviours of sdk/CONFORMANCE.md that the other test files do not
// already cover for the Go SDK, each test named by its id. C09 runs the
// gateway in a child process (this test binary, re-executed) so that it can
// be stopped with SIGSTOP.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/client"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/tokens"
)

// flakyRenewals fails renewals without sending them, as a network that
// drops them: the next `fail` ones, or all while failAll is set.
type flakyRenewals struct {
	base    http.RoundTripper
	fail    atomic.Int32
	failAll atomic.Bool
	failed  atomic.Int32
	passed  chan struct{} // a signal per renewal that reached the gateway and succeeded
}

func (f *flakyRenewals) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/renew") {
		return f.base.RoundTrip(r)
	}
	if f.failAll.Load() || f.fail.Add(-1) >= 0 {
		f.failed.Add(1)
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, errors.New("connection refused (the test drops this renewal)")
	}
	resp, err := f.base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK {
		select {
		case f.passed <- struct{}{}:
		default:
		}
	}
	return resp, err
}

// A failed renewal is retried and loses nothing; the lease is lost only at
// its deadline, no later than a TTL after renewals stopped reaching the
// gateway.
func TestC02FailedRenewalsRetriedLostOnlyAtDeadline(t *testing.T) {
	const ttl = 3 * time.Second
	e := newEnv(t)
	flaky := &flakyRenewals{base: e.tr, passed: make(chan struct{}, 1)}
	flaky.fail.Store(2)
	l := e.acquire(e.client("w1", flaky), "stmt:acct:1", client.AcquireOptions{TTL: ttl})
	hang := time.After(30 * time.Second)
	for flaky.failed.Load() < 2 {
		select {
		case <-flaky.passed:
		case <-hang:
			t.Fatalf("no renewal passed after %d failures", flaky.failed.Load())
		}
	}
	select {
	case <-flaky.passed: // the retry after two failures renewed
	case <-hang:
		t.Fatal("no renewal passed after the failures")
	}
	if isDone(l) {
		t.Fatalf("two failed renewals lost the lease: %v", l.Err())
	}

	start := time.Now()
	flaky.failAll.Store(true)
	waitDone(t, l, 30*time.Second)
	if deadline := l.Deadline(); deadline.After(start.Add(ttl)) {
		t.Fatalf("local deadline %v is more than a TTL after renewals stopped at %v", deadline, start)
	}
	if !errors.Is(l.Err(), client.ErrLeaseLost) || errors.Is(l.Err(), client.ErrStale) {
		t.Fatalf("Err = %v, want ErrLeaseLost for the TTL running out", l.Err())
	}
	if n := flaky.failed.Load(); n <= 2 {
		t.Fatalf("only %d failed renewals: the loss did not wait for retries", n)
	}
}

// countingTransport counts the fenced writes it sends.
type countingTransport struct {
	base   http.RoundTripper
	writes atomic.Int32
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/v1/proxy/") {
		c.writes.Add(1)
	}
	return c.base.RoundTrip(r)
}

// A stale write is refused, not forwarded, and not retried even with an
// idempotency key.
func TestC05DoIdempotentNeverRetriesAStaleWrite(t *testing.T) {
	e := newKeyedEnv(t)
	ct := &countingTransport{base: &http.Transport{}}
	t.Cleanup(ct.base.(*http.Transport).CloseIdleConnections)
	c, err := client.New(e.gw.URL, client.WithHTTPClient(&http.Client{Transport: ct}))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(t.Context(), "acct/1", client.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Released behind its back.
	del, _ := http.NewRequest(http.MethodDelete, e.gw.URL+"/v1/leases/"+url.PathEscape(l.ID()), nil)
	resp, err := ct.base.RoundTrip(del)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("release behind its back: %v %v", err, resp)
	}
	_ = resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://statements/lines", strings.NewReader("stale"))
	_, err = l.DoIdempotent(req, client.IdempotentOptions{Attempts: 5, Backoff: time.Millisecond})
	if !errors.Is(err, client.ErrStale) || asError(t, err).Code != client.CodeLeaseReleased {
		t.Fatalf("DoIdempotent under a released lease: %v", err)
	}
	if n := ct.writes.Load(); n != 1 {
		t.Fatalf("the stale write was sent %d times", n)
	}
	if w, _ := e.counts(); w != 0 || e.arrived.Load() != 0 {
		t.Fatalf("the upstream applied %d writes", w)
	}
	if !isDone(l) || !errors.Is(l.Err(), client.ErrLeaseLost) {
		t.Fatalf("after a stale answer: done %v err %v", isDone(l), l.Err())
	}
}

// defer lease.Close() releases the lease whether the work returns an error
// or panics.
func TestC07CloseReleasesOnErrorAndPanic(t *testing.T) {
	e := newEnv(t)
	c := e.client("w1", nil)
	errWork := errors.New("the work failed")
	var leases []*client.Lease
	failing := func() error {
		l, err := c.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
		if err != nil {
			return err
		}
		defer l.Close()
		leases = append(leases, l)
		mustWrite(t, l, "/accounts/1/lines", "work")
		return errWork
	}
	panicking := func() (rec any) {
		defer func() { rec = recover() }()
		l, err := c.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute})
		if err != nil {
			t.Fatalf("acquire after the first release: %v", err)
		}
		defer l.Close()
		leases = append(leases, l)
		panic("boom")
	}
	if err := failing(); !errors.Is(err, errWork) {
		t.Fatalf("work: %v", err)
	}
	if rec := panicking(); rec != "boom" { // acquires without waiting: the first was released
		t.Fatalf("recovered %v", rec)
	}
	for i, l := range leases {
		if !errors.Is(l.Err(), client.ErrReleased) {
			t.Fatalf("lease %d after Close: %v", i, l.Err())
		}
		// The first was released and then superseded (stale_token), the
		// second only released (lease_released).
		_, err := write(t, l, "/accounts/1/lines", "after exit")
		if !errors.Is(err, client.ErrStale) {
			t.Fatalf("write under released lease %d: %v", i, err)
		}
	}
	res, err := e.api.GetResourceWithResponse(context.Background(), "stmt:acct:1")
	if err != nil || res.JSON200 == nil || res.JSON200.Held || res.JSON200.Token != 2 {
		t.Fatalf("resource after both exits: %v %s", err, res.Body)
	}
}

// childGatewayEnv makes this test binary serve a gateway instead of
// running tests (see TestMain): the value is the upstream's URL.
const childGatewayEnv = "FENCEGW_CLIENT_TEST_CHILD_GATEWAY"

// runChildGateway serves a real gateway on a bbolt store in dir, protecting
// "statements" at upstream, and prints where, until killed.
func runChildGateway(upstream, dir string) {
	up, err := url.Parse(upstream)
	if err != nil {
		panic(err)
	}
	store, err := bolt.Open(filepath.Join(dir, "fencegw.db"), bolt.Options{Logger: discard})
	if err != nil {
		panic(err)
	}
	svc := tokens.New(tokens.Config{Store: store, Locker: tokens.NewLocalLocker(), Logger: discard})
	gw := gateway.New(svc, gateway.Config{Upstreams: map[string]*url.URL{"statements": up}, Logger: discard})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Printf("serving on http://%s\n", ln.Addr())
	panic(http.Serve(ln, gw))
}

// childGateway starts runChildGateway in a process of its own.
func childGateway(t *testing.T, upstream string) (*exec.Cmd, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childGatewayEnv+"="+upstream, childGatewayEnv+"_DIR="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "serving on ") {
		t.Fatalf("child gateway: %q %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return cmd, strings.TrimSpace(strings.TrimPrefix(line, "serving on "))
}

// The gateway process is stopped with SIGSTOP: a pause shorter than the TTL
// loses nothing; a pause longer than the TTL loses the lease at its local
// deadline, without any answer, and the gateway refuses its writes when it
// wakes.
func TestC09GatewayPausedLongerThanTTL(t *testing.T) {
	up := newUpstream(t)
	t.Cleanup(up.Close)
	cmd, base := childGateway(t, up.URL)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New(base, client.WithHTTPClient(&http.Client{Transport: tr}), client.WithHolder("w1"))
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	cont := func() {
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}

	const longTTL = 3 * time.Second
	l, err := c.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: longTTL})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	time.Sleep(300 * time.Millisecond) // the pause: far shorter than the TTL minus the margin
	cont()
	resumed := time.Now()
	for hang := time.Now().Add(30 * time.Second); !l.Deadline().After(resumed.Add(longTTL - longTTL/10)); {
		if isDone(l) || time.Now().After(hang) {
			t.Fatalf("no renewal after a short pause: done %v err %v", isDone(l), l.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}

	const ttl = 1500 * time.Millisecond
	l, err = c.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	start := time.Now()
	stop()
	waitDone(t, l, 30*time.Second) // no answer can have come: the loss is the SDK's own
	if deadline := l.Deadline(); deadline.After(start.Add(ttl)) {
		t.Fatalf("local deadline %v is more than a TTL after the pause began at %v", deadline, start)
	}
	if !errors.Is(l.Err(), client.ErrLeaseLost) || errors.Is(l.Err(), client.ErrStale) {
		t.Fatalf("Err = %v", l.Err())
	}
	// Paused for longer than the TTL: the gateway's own count, which began
	// after ours, has run out too when it wakes.
	time.Sleep(time.Until(start.Add(ttl + 500*time.Millisecond)))
	cont()
	_, err = write(t, l, "/accounts/1/lines", "after the pause")
	if !errors.Is(err, client.ErrStale) || asError(t, err).Code != client.CodeLeaseExpired {
		t.Fatalf("write after the pause: %v", err)
	}
	for _, a := range up.seen() {
		if a.Body == "after the pause" {
			t.Fatal("the stale write reached the upstream")
		}
	}
	next, err := c.Acquire(context.Background(), "stmt:acct:1", client.AcquireOptions{TTL: time.Minute, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after the pause: %v", err)
	}
	t.Cleanup(func() { _ = next.Close() })
	if next.Token() != l.Token()+1 {
		t.Fatalf("next token %d after %d", next.Token(), l.Token())
	}
}
