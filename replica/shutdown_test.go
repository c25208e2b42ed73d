package replica_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	"github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// bodyUpstream is an upstream that reports, on entered, each write whose
// first body byte it read, and reads the rest as it comes.
func bodyUpstream(t *testing.T) (*url.URL, <-chan struct{}) {
	t.Helper()
	entered := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b [1]byte
		if _, err := io.ReadFull(r.Body, b[:]); err == nil {
			entered <- struct{}{}
		}
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	return u, entered
}

// trickleWrite sends a fenced write under lease to the replica at addr and
// then only the first lines of its body, which the replica forwards and
// waits for the rest of: chunked (served by Go's server) or with a
// Content-Length (served by the listener's own loop). It returns once the
// upstream read the first byte, with the connection (closed with the test).
func trickleWrite(t *testing.T, addr, lease string, chunked bool, entered <-chan struct{}) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := "POST /v1/proxy/svc/slow HTTP/1.1\r\nHost: " + addr + "\r\nFencing-Lease: " + lease + "\r\n"
	if chunked {
		head += "Transfer-Encoding: chunked\r\n\r\nb\r\nfirst line\n\r\n"
	} else {
		// The engine copies such a body through its 4 KiB buffer: more
		// than that, for some of it to leave.
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat("first line\n", 1000))
	}
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the write's first bytes did not reach the upstream")
	}
	return c
}

// shutdownCutsWrite starts a replica on m with a write whose body trickles
// in (--body-timeout far beyond --forward-timeout + 5 s, so Shutdown runs
// out of time), shuts it down, and checks what a timed-out shutdown owes:
// the error, the write's handler returned, and its drain recorded by the
// store before Shutdown returns (Close would otherwise close the store
// under it). It returns the replica, shut down, for the caller to Close.
func shutdownCutsWrite(t *testing.T, m mode.Config, resource string, chunked bool) *replica.Replica {
	t.Helper()
	u, entered := bodyUpstream(t)
	r, err := replica.New(t.Context(), replica.Config{
		Mode:           m,
		Listen:         "127.0.0.1:0",
		Live:           gateway.Live{Upstreams: map[string]*url.URL{"svc": u}},
		ForwardTimeout: 100 * time.Millisecond,
		BodyTimeout:    time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	r.Start()
	// The lease expires long before Shutdown returns: afterwards only the
	// drain keeps its resource from the next grant.
	l, err := r.Service().Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "A", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	trickleWrite(t, r.Addr(), l.ID, chunked, entered)
	if err := r.Shutdown(nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a write's body still coming in: %v, want its timeout", err)
	}
	if n := r.Gateway().InFlight(); n != 0 {
		t.Errorf("Shutdown returned with %d writes in flight, want the cut write's handler returned", n)
	}
	st, err := r.Mode().Store.Resource(t.Context(), resource)
	if err != nil {
		t.Fatal(err)
	}
	if !st.DrainUntil.After(time.Now()) {
		t.Errorf("Shutdown returned with the cut write's drain not in the store (drain until %v)", st.DrainUntil)
	}
	return r
}

// A shutdown that runs out of time on a write still streaming its body in
// cuts the write short and waits for it: its unknown outcome's drain is in
// the store when Shutdown returns, so Close does not close the store under
// it, and the next start finds the resource closed to grants. Both servers:
// Go's (a chunked body) and the listener's own loop (a Content-Length).
func TestShutdownTimedOutRecordsTheCutWritesDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the shutdown's timeout (the forward timeout + 5 s)")
	}
	for _, chunked := range []bool{true, false} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			dir := t.TempDir()
			r := shutdownCutsWrite(t, mode.Config{Data: dir, DrainPeriod: time.Minute}, "r", chunked)
			r.Close()
			if !drainsAtReopen(t, dir, "r") {
				t.Error("the next start grants the cut write's resource at once")
			}
		})
	}
}

// The same in the PostgreSQL mode: once the replica that cut the write
// short has shut down and closed, another replica on the same database
// does not grant its resource before the drain period has passed.
func TestShutdownTimedOutDrainHoldsOtherReplicasGrant(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the shutdown's timeout (the forward timeout + 5 s)")
	}
	m := mode.Config{Postgres: pgtest.URL(), Schema: pgtest.NewSchema(t), DrainPeriod: time.Minute}
	for _, chunked := range []bool{true, false} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			resource := fmt.Sprintf("r-chunked-%v", chunked)
			r := shutdownCutsWrite(t, m, resource, chunked)
			r.Close()
			other, err := replica.New(t.Context(), replica.Config{Mode: m, Listen: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			l, err := other.Service().Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "B", TTL: time.Minute})
			if !errors.Is(err, tokens.ErrFenceBusy) {
				t.Errorf("another replica's grant after the shutdown: %+v, %v; want fence_busy (the drain)", l, err)
			}
		})
	}
}

// Close without Shutdown closes every connection, the own loop's busy ones
// too (which http.Server.Close does not reach): a write still streaming its
// body in is cut at once, not left to run until its body timeout.
func TestCloseCutsTheOwnLoopsBusyWrite(t *testing.T) {
	u, entered := bodyUpstream(t)
	r, err := replica.New(t.Context(), replica.Config{
		Mode:        mode.Config{Data: t.TempDir(), DrainPeriod: time.Minute},
		Listen:      "127.0.0.1:0",
		Live:        gateway.Live{Upstreams: map[string]*url.URL{"svc": u}},
		BodyTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	r.Start()
	l, err := r.Service().Acquire(t.Context(), tokens.AcquireRequest{Resource: "r", Holder: "A", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c := trickleWrite(t, r.Addr(), l.ID, false, entered)
	r.Close()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the write's connection is still open 20 s after Close")
	}
}
