package main

// Acquires whose clients leave while they wait: twenty acquires, spread
// over the replicas, wait on a resource; their clients close or
// half-close their connections; the resource frees. No lease may be
// granted to a client that left (it would close the resource until its
// TTL), in every storage mode, also when a replica was frozen (SIGSTOP)
// while its clients left and the resource freed, and resumes with both
// the clients' closes and the wake-up to hear at once. The acquires wait
// either with wait_ms, for a holder's release, or without it, for a write
// of the previous (expired) lease still in flight at the upstream: the
// grant waits for that write's end, up to the grant wait.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

func TestAbandonedWaitingAcquires(t *testing.T) {
	forEachAbandonMode(t, abandonModes, func(t *testing.T, ps []*proc, _ *recUpstream, freeze bool) {
		res := "abandoned"
		holder, ans := grant(ps[len(ps)-1].url(), res, "holder", time.Minute, 0)
		if ans.code != http.StatusCreated {
			t.Fatalf("the holder's grant: %v", ans)
		}
		body := fmt.Sprintf(`{"resource":%q,"holder":"waiter","ttl_ms":60000,"wait_ms":20000}`, res)
		testAbandonedAcquires(t, ps, freeze, nil, res, body, holder.Token, func() {
			if a := release(ps[len(ps)-1].url(), holder.LeaseID); a.code != http.StatusNoContent {
				t.Fatalf("the holder's release: %v", a)
			}
		})
	})
}

// TestAbandonedAcquiresWithoutWait: acquires without wait_ms wait for a
// write of the previous lease still in flight; their clients leave while
// it is, and none of them may get the lease once the write ends.
func TestAbandonedAcquiresWithoutWait(t *testing.T) {
	forEachAbandonMode(t, abandonModes, func(t *testing.T, ps []*proc, up *recUpstream, freeze bool) {
		res := "abandoned-nowait"
		via := ps[len(ps)-1].url()
		// Long enough for the write to be admitted on a loaded machine;
		// it expires while the write is held at the upstream.
		holder, ans := grant(via, res, "holder", 1500*time.Millisecond, 0)
		if ans.code != http.StatusCreated {
			t.Fatalf("the holder's grant: %v", ans)
		}
		written := holdWrite(t, via, up, holder.LeaseID)
		waitExpired(t, via, holder.LeaseID)
		body := fmt.Sprintf(`{"resource":%q,"holder":"waiter","ttl_ms":60000}`, res)
		testAbandonedAcquires(t, ps, freeze, nil, res, body, holder.Token, func() {
			up.Release()
			if a := <-written; a.err != nil || a.code != http.StatusOK {
				t.Fatalf("the holder's write, held while its lease expired: %v; want the upstream's 200", a)
			}
		})
	})
}

// abandonModes: one embedded replica, and two over PostgreSQL, over
// PostgreSQL and Redis, and over PostgreSQL with the first replica frozen
// while the clients leave.
var abandonModes = []string{"embedded", "postgres", "redis", "postgres/frozen"}

// forEachAbandonMode runs test in each of modes (abandonModes).
func forEachAbandonMode(t *testing.T, modes []string, test func(t *testing.T, ps []*proc, up *recUpstream, freeze bool)) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			up := newUpstream(t) // holds writes to /hold/ until Release (faults_test.go)
			args := []string{"--upstream", "svc=" + up.URL, "--grant-wait", "30s", "--forward-timeout", "30s"}
			var ps []*proc
			switch mode {
			case "embedded":
				ps = startReplicas(t, 1, append(args, "--data", t.TempDir())...)
			default:
				pgtest.Require(t)
				args = append(args, "--postgres", pgtest.URL(), "--pg-schema", pgtest.NewSchema(t))
				if mode == "redis" {
					args = append(args, "--redis", startRedis(t).URL())
				}
				ps = startReplicas(t, 2, args...)
			}
			test(t, ps, up, strings.HasSuffix(mode, "/frozen"))
		})
	}
}

// testAbandonedAcquires sends twenty acquires (body) of res over ps, which
// wait on res, makes their clients leave, then frees res (free), and checks
// that none of them got a lease: the resource still has token, and the
// next grant gets token+1. pause, if set, stops a store before the clients
// leave; what it returns starts it again before res is freed.
func testAbandonedAcquires(t *testing.T, ps []*proc, freeze bool, pause func() (resume func()), res, body string, token int64, free func()) {
	const waiters = 20
	conns := make([]*net.TCPConn, waiters)
	for i := range conns {
		addr := ps[i%len(ps)].addr
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c.(*net.TCPConn)
		if _, err := fmt.Fprintf(c, "POST /v1/leases HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // every acquire is waiting, and (past 50 ms) watches its client
	abandoned := make([]float64, len(ps))
	for i, p := range ps {
		abandoned[i] = abandonedGrants(t, p.url())
	}
	resume := func() {}
	if pause != nil {
		resume = pause()
	}
	if freeze {
		if err := ps[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ps[0].cmd.Process.Signal(syscall.SIGCONT) })
	}
	// The replicas that run hear their clients go before the resource
	// frees, and count each acquire as abandoned (not, say, as the store's
	// failure, if the client's going cut a store call short). A frozen one
	// hears them when it resumes, with the wake-up of the resource freed.
	for i, c := range conns {
		if i%2 == 0 {
			_ = c.Close()
		} else {
			_ = c.CloseWrite()
		}
	}
	// heard waits until replica i has counted its share of the acquires
	// abandoned.
	heard := func(i int) {
		t.Helper()
		base, n := ps[i].url(), waiters/len(ps)
		for deadline := time.Now().Add(10 * time.Second); abandonedGrants(t, base) < abandoned[i]+float64(n); {
			if time.Now().After(deadline) {
				m := call("GET", base+"/metrics", nil)
				t.Fatalf("10 s after their clients went, replica %d counts %v of its %d acquires abandoned (%q)", i,
					abandonedGrants(t, base)-abandoned[i], n, grantsTotal.FindAll(m.body, -1))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i := range ps {
		if !freeze || i != 0 {
			heard(i)
		}
	}
	resume()
	free()
	if freeze {
		time.Sleep(300 * time.Millisecond)
		if err := ps[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		heard(0)
	}
	time.Sleep(time.Second) // a grant still waiting would be made by now

	// Half-closed clients get no answer: their acquires were abandoned.
	for i, c := range conns {
		if i%2 == 0 {
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, _ := io.ReadAll(c); len(got) > 0 {
			t.Errorf("waiter %d (half-closed, on replica %d) was answered: %.200q", i, i%len(ps), got)
		}
	}
	// The resource is free at once, and the next grant's token follows
	// the holder's: no lease went to a client that left.
	for i, p := range ps {
		a := call("GET", p.url()+"/v1/resources/"+res, nil)
		var st struct {
			Token int64 `json:"token"`
		}
		if a.code != http.StatusOK || json.Unmarshal(a.body, &st) != nil {
			t.Fatalf("the resource through replica %d: %v", i, a)
		}
		if st.Token != token {
			t.Errorf("after the waiters left and the resource freed, replica %d reports token %d; want the holder's %d (a lease went to a client that left)", i, st.Token, token)
		}
	}
	next, ans := grant(ps[0].url(), res, "next", time.Minute, 0)
	if ans.code != http.StatusCreated || next.Token != token+1 {
		t.Errorf("the next acquire: %v (token %d); want 201 and token %d", ans, next.Token, token+1)
	}
}

var (
	grantsTotal    = regexp.MustCompile(`(?m)^fencegw_grants_total\{.*$`)
	abandonedTotal = regexp.MustCompile(`(?m)^fencegw_grants_total\{result="abandoned"\} (\S+)$`)
)

// abandonedGrants is the replica's fencegw_grants_total{result="abandoned"}:
// the acquires whose clients went before their answer.
func abandonedGrants(t *testing.T, base string) float64 {
	t.Helper()
	a := call("GET", base+"/metrics", nil)
	match := abandonedTotal.FindSubmatch(a.body)
	if match == nil {
		t.Fatalf("no fencegw_grants_total{result=\"abandoned\"} in %s/metrics: %v", base, a)
	}
	n, err := strconv.ParseFloat(string(match[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAbandonedWriteWaitingForItsFence: a fenced write that Go's server
// serves (its head is over the loop's 4 KiB) waits for its fence, behind
// a change of its resource that waits for a write in flight; its client
// leaves meanwhile. Go's server cancels the request, which ends the wait:
// the write is counted fencegw_writes_total{outcome="abandoned"}, not as a
// bad request or the store's failure, nothing of it reaches the upstream,
// and nothing is logged as an error. The change it waits behind: in the
// PostgreSQL modes, the holder's release (it takes the resource's
// exclusive fence, so it waits for the write in flight); in the embedded
// mode, where a release does not wait, a grant of the resource once the
// holder's lease expired (writes judged there read the lease only once
// their lock is theirs).
func TestAbandonedWriteWaitingForItsFence(t *testing.T) {
	// One replica serves every call: there is none to freeze beside it.
	forEachAbandonMode(t, abandonModes[:3], func(t *testing.T, ps []*proc, up *recUpstream, _ bool) {
		p, embedded := ps[0], len(ps) == 1
		ttl := time.Minute
		if embedded {
			ttl = 1500 * time.Millisecond // long enough for the write to be admitted on a loaded machine
		}
		holder, ans := grant(p.url(), "abandoned-write", "holder", ttl, 0)
		if ans.code != http.StatusCreated {
			t.Fatalf("the holder's grant: %v", ans)
		}
		written := holdWrite(t, p.url(), up, holder.LeaseID)
		changed, want := make(chan answer, 1), http.StatusNoContent
		if embedded {
			waitExpired(t, p.url(), holder.LeaseID)
			want = http.StatusCreated
			go func() { _, a := grant(p.url(), "abandoned-write", "next", time.Minute, 0); changed <- a }()
		} else {
			go func() { changed <- release(p.url(), holder.LeaseID) }()
		}
		time.Sleep(300 * time.Millisecond) // the change waits for the write in flight
		before := writeOutcomes(t, p.url())

		abandonWrite(t, p, holder.LeaseID, before, "it waited for its fence")
		up.Release()
		if a := <-written; a.code != http.StatusOK {
			t.Errorf("the held write: %v; want the upstream's 200", a)
		}
		if a := <-changed; a.code != want {
			t.Errorf("the change the write waited behind: %v; want %d", a, want)
		}
		if n := up.count(); n != 1 {
			t.Errorf("%d writes reached the upstream; want 1, the held one", n)
		}
		if strings.Contains(p.output(), "level=ERROR") {
			t.Errorf("the gateway logged an error for a write its client abandoned:\n%s", p.output())
		}
	})
}

var writesTotal = regexp.MustCompile(`(?m)^fencegw_writes_total\{outcome="([a-z_]+)"\} (\S+)$`)

// writeOutcomes is the replica's fencegw_writes_total, by outcome.
// holdWrite sends a write of leaseID through base that up holds (its path
// is under /hold/) and returns once it reached up, with where its answer
// will come once up releases it.
func holdWrite(t *testing.T, base string, up *recUpstream, leaseID string) <-chan answer {
	t.Helper()
	written := make(chan answer, 1)
	go func() { written <- fencedWrite(base, leaseID, "/hold/held", "held") }()
	select {
	case <-up.entered:
	case a := <-written:
		t.Fatalf("the holder's write answered without reaching the upstream: %v", a)
	}
	return written
}

// abandonWrite sends a fenced write of leaseID that Go's server serves (its
// head is over the loop's 4 KiB) to p, leaves after 300 ms (while, the
// caller has seen to it, the write waits: while says for what), and checks
// that p counts it fencegw_writes_total{outcome="abandoned"} and nothing
// else, against its outcomes before.
func abandonWrite(t *testing.T, p *proc, leaseID string, before map[string]float64, while string) {
	t.Helper()
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	pad := strings.Repeat("p", 5000) // past the loop's 4 KiB: Go's server's request
	if _, err := fmt.Fprintf(c, "POST /v1/proxy/svc/late HTTP/1.1\r\nHost: %s\r\nFencing-Lease: %s\r\nX-Pad: %s\r\nContent-Length: 0\r\n\r\n", p.addr, leaseID, pad); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	_ = c.Close()

	var after map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		after = writeOutcomes(t, p.url())
		if after["abandoned"] > before["abandoned"] || time.Now().After(deadline) {
			break
		}
	}
	for outcome, n := range after {
		want := before[outcome]
		if outcome == "abandoned" {
			want++
		}
		if n != want {
			t.Errorf("fencegw_writes_total{outcome=%q} went from %v to %v; want %v (the write whose client left while %s is abandoned, nothing else)", outcome, before[outcome], n, want, while)
		}
	}
}

func writeOutcomes(t *testing.T, base string) map[string]float64 {
	t.Helper()
	a := call("GET", base+"/metrics", nil)
	out := map[string]float64{}
	for _, m := range writesTotal.FindAllSubmatch(a.body, -1) {
		n, err := strconv.ParseFloat(string(m[2]), 64)
		if err != nil {
			t.Fatal(err)
		}
		out[string(m[1])] = n
	}
	if len(out) == 0 {
		t.Fatalf("no fencegw_writes_total in %s/metrics: %v", base, a)
	}
	return out
}
