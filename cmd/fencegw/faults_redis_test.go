package main

// Redis faults that come with another event: Redis killed while a replica
// is in its shutdown delay, and a replica cut from Redis alone (a network
// partition, with the torture's network namespace tool) while PostgreSQL
// and the other replicas still reach it.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/torture"
)

// Redis dies while a replica is in its shutdown delay with a write in
// flight. The replica fails closed meanwhile (a grant answers 503
// store_unavailable with Retry-After, quickly), lets its write in flight
// finish, and still exits 0 at the end of its delay and drain, not held up
// by the dead Redis; once Redis is back (empty) the other replica grants
// the resource with a larger token and the old lease is refused.
func TestFaultRedisKilledDuringShutdownDelay(t *testing.T) {
	pgtest.Require(t)
	rd := startRedis(t)
	up := newUpstream(t)
	args := []string{"--log-level", "warn", "--postgres", pgtest.URL(), "--pg-schema", pgtest.NewSchema(t), "--redis", rd.URL(),
		"--upstream", "svc=" + up.URL, "--forward-timeout", "5s", "--drain-period", "1s", "--grant-wait", "3s"}
	p1 := startProc(t, append(args, "--shutdown-delay", "3s")...)
	p2 := startProc(t, args...)

	a, ans := grant(p1.url(), "bye", "A", 2*time.Second, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	if w := fencedWrite(p1.url(), a.LeaseID, "/bye", "A before"); w.code != http.StatusOK {
		t.Fatalf("A's write: %v", w)
	}
	held := make(chan answer, 1)
	go func() { held <- fencedWrite(p1.url(), a.LeaseID, "/hold/bye", "A held") }()
	<-up.entered

	signalled := time.Now()
	if err := p1.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitShuttingDown(t, p1)
	rd.Kill()

	// The delay goes on with Redis gone: fail closed, at once.
	for name, base := range map[string]string{"the replica shutting down": p1.url(), "the other replica": p2.url()} {
		_, g := grant(base, "fresh", "X", time.Minute, 0)
		want503(t, name+": grant with Redis dead", g, "store_unavailable")
		if g.took > 10*time.Second {
			t.Errorf("%s: the grant took %v to fail", name, g.took)
		}
	}
	select {
	case <-p1.exited:
		t.Fatalf("the replica exited before its write in flight was answered:\n%s", p1.output())
	default:
	}
	up.Release()
	if h := <-held; h.code != http.StatusOK {
		t.Errorf("the write in flight when Redis died: %v, want 200", h)
	}
	select {
	case <-p1.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the replica did not exit 30 s after SIGTERM with Redis dead:\n%s", p1.output())
	}
	if p1.err != nil {
		t.Fatalf("exit with Redis dead: %v\n%s", p1.err, p1.output())
	}
	t.Logf("exited %v after SIGTERM (3 s shutdown delay)", time.Since(signalled).Round(time.Millisecond))

	// Redis comes back empty: the other replica serves again.
	if err := rd.Start(); err != nil {
		t.Fatal(err)
	}
	var b lease
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, ans = grant(p2.url(), "bye", "B", time.Minute, 5*time.Second)
		if ans.code == http.StatusCreated {
			break
		}
		if ans.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("B after Redis is back: %v", ans)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b.Token <= a.Token {
		t.Fatalf("B got token %d after A's %d", b.Token, a.Token)
	}
	if w := fencedWrite(p2.url(), b.LeaseID, "/bye", "B"); w.code != http.StatusOK {
		t.Errorf("B's write: %v", w)
	}
	want409(t, "A after B's grant", fencedWrite(p2.url(), a.LeaseID, "/bye", "A stale"), "stale_token")
	if up.received("A stale") {
		t.Error("A's stale write reached the upstream")
	}
	up.checkOrder(t)
}

// forwarder relays TCP connections from a listener to target, so that a
// process in a network namespace reaches a service of the host's loopback
// through the host's end of the veth.
func forwarder(t *testing.T, listenIP, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(listenIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				_ = c.Close()
				continue
			}
			track(c)
			track(u)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
	return ln.Addr().String()
}

// A replica cut from Redis alone (packets dropped both ways, no RST),
// while it still reaches PostgreSQL and is reached by workers: it fails
// closed for what needs Redis (a grant answers 503 store_unavailable,
// bounded in time), the other replica grants the resource once its lease
// has expired and writes, and the cut replica never forwards the old
// lease's write after that grant (the PostgreSQL fence it held is taken
// from it for the grant). When the cut is restored it serves again.
func TestFaultReplicaPartitionedFromRedis(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "a network namespace needs root")
	}
	pgtest.Require(t)
	rd := startRedis(t)
	up := newUpstream(t)
	ctx := context.Background()

	// The namespace reaches PostgreSQL, Redis and the upstream through
	// forwarders on the host's end of the veth; the cut drops Redis's.
	ns, err := torture.NewNetns(ctx, nil)
	if err != nil {
		missing(t, err.Error())
	}
	t.Cleanup(ns.Remove)
	pgURL, err := url.Parse(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pgPort := pgURL.Port()
	if pgPort == "" {
		pgPort = "5432"
	}
	pgAddr := forwarder(t, ns.HostIP(), net.JoinHostPort(pgURL.Hostname(), pgPort))
	pgURL.Host = pgAddr
	rdAddr := forwarder(t, ns.HostIP(), "127.0.0.1:"+strconv.Itoa(rd.port))
	upAddr := forwarder(t, ns.HostIP(), up.Listener.Addr().String())
	_, rdPort, _ := net.SplitHostPort(rdAddr)
	ns.SetPorts(rdPort)

	schema := pgtest.NewSchema(t)
	common := []string{"--log-level", "warn", "--pg-schema", schema, "--forward-timeout", "3s", "--drain-period", "1s", "--grant-wait", "8s"}
	// Replica 1, in the namespace.
	wrapper := filepath.Join(t.TempDir(), "fencegw-in-netns")
	name, nsArgs := ns.Command(fencegwBinary(t))
	script := "#!/bin/sh\nexec " + name
	for _, a := range nsArgs {
		script += " '" + a + "'"
	}
	if err := os.WriteFile(wrapper, []byte(script+` "$@"`+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p1 := startBinary(t, wrapper, append(common, "--shutdown-delay", "0", "--listen", net.JoinHostPort(ns.NamespaceIP(), "0"),
		"--insecure-no-auth", "--postgres", pgURL.String(), "--redis", "redis://"+rdAddr+"/0", "--upstream", "svc=http://"+upAddr)...)
	p2 := startProc(t, append(common, "--postgres", pgtest.URL(), "--redis", rd.URL(), "--upstream", "svc="+up.URL)...)
	b1, b2 := p1.url(), p2.url()

	a, ans := grant(b1, "cut", "A", 1500*time.Millisecond, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A on the replica to be cut: %v", ans)
	}
	if w := fencedWrite(b1, a.LeaseID, "/cut", "A before"); w.code != http.StatusOK {
		t.Fatalf("A's write before the cut: %v", w)
	}

	if err := ns.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	cut := true
	t.Cleanup(func() {
		if cut {
			_ = ns.Restore(context.Background())
		}
	})
	_, g := grant(b1, "other", "X", time.Minute, 0)
	want503(t, "the cut replica's grant", g, "store_unavailable")
	if g.took > 15*time.Second {
		t.Errorf("the cut replica's grant took %v to fail", g.took)
	}
	t.Logf("the cut replica's grant failed closed in %v", g.took.Round(time.Millisecond))

	// A's lease expires; B is granted on the other replica, which takes
	// the fence from the cut one through PostgreSQL.
	b, ans := grant(b2, "cut", "B", time.Minute, 20*time.Second)
	if ans.code != http.StatusCreated {
		t.Fatalf("B on the other replica during the cut: %v", ans)
	}
	if b.Token <= a.Token {
		t.Fatalf("B got token %d after A's %d", b.Token, a.Token)
	}
	if w := fencedWrite(b2, b.LeaseID, "/cut", "B"); w.code != http.StatusOK {
		t.Fatalf("B's write: %v", w)
	}
	// A writes on through the cut replica: refused or failed closed,
	// never forwarded.
	w := fencedWrite(b1, a.LeaseID, "/cut", "A during the cut")
	if w.code == http.StatusOK || up.received("A during the cut") {
		t.Errorf("A's write through the cut replica after B's grant: %v, and it reached the upstream: %v", w, up.received("A during the cut"))
	}
	t.Logf("A's write through the cut replica after B's grant: %v (%v)", w, w.took.Round(time.Millisecond))

	if err := ns.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	cut = false
	deadline := time.Now().Add(20 * time.Second)
	for {
		w := fencedWrite(b1, b.LeaseID, "/cut", "B through the restored replica")
		if w.code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica does not write 20 s after the cut was restored: %v", w)
		}
		time.Sleep(100 * time.Millisecond)
	}
	want409(t, "A after the cut", fencedWrite(b1, a.LeaseID, "/cut", "A after"), "stale_token")
	up.checkOrder(t)
	if up.received("A after") {
		t.Error("A's stale write reached the upstream")
	}
}
