package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"syscall"
	"testing"
	"time"
)

// keepAliveClient sends every request on one connection, and reports
// whether each reused it.
type keepAliveClient struct {
	c *http.Client
}

func newKeepAliveClient() *keepAliveClient {
	return &keepAliveClient{c: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1}}}
}

type kaAnswer struct {
	answer
	reused bool
	close  bool // the answer said Connection: close
}

func (k *keepAliveClient) do(method, url, body string, header ...string) kaAnswer {
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), method, url, strings.NewReader(body))
	if err != nil {
		return kaAnswer{answer: answer{err: err}}
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := k.c.Do(req)
	if err != nil {
		return kaAnswer{answer: answer{err: err}, reused: reused}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return kaAnswer{answer: answer{code: resp.StatusCode, header: resp.Header, body: b, err: err}, reused: reused, close: resp.Close}
}

// waitShuttingDown waits until the replica's /readyz says shutting_down
// (the signal's first visible effect).
func waitShuttingDown(t *testing.T, p *proc) answer {
	t.Helper()
	for {
		a := call("GET", p.url()+"/readyz", nil)
		if a.err == nil && a.code == http.StatusServiceUnavailable && a.problemCode() == "shutting_down" {
			return a
		}
		select {
		case <-p.exited:
			t.Fatalf("exited before /readyz said shutting_down (last: %v):\n%s", a, p.output())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// On SIGTERM a replica fails /readyz at once and serves on, keep-alive
// connections included, for --shutdown-delay; then it stops accepting,
// answers the request still in flight with Connection: close, and exits 0.
func TestShutdownDelayKeepsServing(t *testing.T) {
	up := newUpstream(t)
	p := startProc(t, "--data", t.TempDir(), "--upstream", "svc="+up.URL, "--shutdown-delay", "2s")
	ka := newKeepAliveClient()
	if a := ka.do("GET", p.url()+"/readyz", ""); a.code != http.StatusOK {
		t.Fatalf("/readyz before the signal: %v", a)
	}
	l, a := grant(p.url(), "bye", "A", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatalf("grant: %v", a)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ready := waitShuttingDown(t, p)
	if ready.header.Get("Content-Type") != "application/problem+json" || ready.header.Get("Retry-After") == "" {
		t.Errorf("/readyz while shutting down: %v %v, want a problem with Retry-After", ready.header, ready)
	}

	// During the delay: the open connection still carries requests, and
	// its answers do not close it.
	w := ka.do("POST", p.url()+"/v1/proxy/svc/bye", "during the delay", "Fencing-Lease", l.LeaseID)
	if w.err != nil || w.code != http.StatusOK || !w.reused || w.close {
		t.Fatalf("write on the kept-alive connection during the delay: %v (reused %v, close %v)", w.answer, w.reused, w.close)
	}
	if g := ka.do("GET", p.url()+"/v1/leases/"+l.LeaseID, ""); g.code != http.StatusOK || !g.reused || g.close {
		t.Fatalf("read on the kept-alive connection during the delay: %v (reused %v, close %v)", g.answer, g.reused, g.close)
	}

	// A write held at the upstream across the end of the delay.
	held := make(chan kaAnswer, 1)
	go func() {
		held <- ka.do("POST", p.url()+"/v1/proxy/svc/hold/bye", "across the end", "Fencing-Lease", l.LeaseID)
	}()
	<-up.entered
	// The listener closes when the delay is over.
	for {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	up.Release()
	h := <-held
	if h.err != nil || h.code != http.StatusOK || !h.close {
		t.Fatalf("write in flight when the delay ended: %v (close %v), want 200 with Connection: close", h.answer, h.close)
	}
	<-p.exited
	if p.err != nil {
		t.Fatalf("exit: %v\n%s", p.err, p.output())
	}
	if !up.received("during the delay") || !up.received("across the end") {
		t.Error("a write answered 200 did not reach the upstream")
	}
}

// A second signal cuts the shutdown delay short; the drain still happens.
func TestSecondSignalCutsShutdownDelay(t *testing.T) {
	p := startProc(t, "--data", t.TempDir(), "--shutdown-delay", "10m")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitShuttingDown(t, p)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-p.exited // the test's own timeout bounds this; ten minutes would fail it
	if p.err != nil {
		t.Fatalf("exit: %v\n%s", p.err, p.output())
	}
	if !strings.Contains(p.output(), "cut short") {
		t.Errorf("the log does not say the delay was cut short:\n%s", p.output())
	}
}
