package main

// Waiting acquires whose clients leave: twenty acquires with wait_ms,
// spread over the replicas, wait on a held resource; their clients close
// or half-close their connections; the holder releases. No lease may be
// granted to a client that left (it would close the resource until its
// TTL), in every storage mode, also when a replica was frozen (SIGSTOP)
// while its clients left and the holder released, and resumes with both
// the clients' closes and the release's wake-up to hear at once.

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
	for _, mode := range []string{"embedded", "postgres", "redis", "postgres/frozen"} {
		t.Run(mode, func(t *testing.T) {
			var ps []*proc
			switch mode {
			case "embedded":
				ps = startReplicas(t, 1, "--data", t.TempDir())
			default:
				pgtest.Require(t)
				args := []string{"--postgres", pgtest.URL(), "--pg-schema", pgtest.NewSchema(t)}
				if mode == "redis" {
					args = append(args, "--redis", startRedis(t).URL())
				}
				ps = startReplicas(t, 2, args...)
			}
			testAbandonedWaitingAcquires(t, ps, strings.HasSuffix(mode, "/frozen"))
		})
	}
}

func testAbandonedWaitingAcquires(t *testing.T, ps []*proc, freeze bool) {
	const waiters = 20
	res := "abandoned"
	holder, ans := grant(ps[len(ps)-1].url(), res, "holder", time.Minute, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("the holder's grant: %v", ans)
	}
	body := fmt.Sprintf(`{"resource":%q,"holder":"waiter","ttl_ms":60000,"wait_ms":20000}`, res)
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
	time.Sleep(500 * time.Millisecond) // every acquire is waiting for the holder
	abandoned := make([]float64, len(ps))
	for i, p := range ps {
		abandoned[i] = abandonedGrants(t, p.url())
	}
	if freeze {
		if err := ps[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ps[0].cmd.Process.Signal(syscall.SIGCONT) })
	}
	// The replicas that run hear their clients go before the release, and
	// count each acquire as abandoned (not, say, as the store's failure, if
	// the client's going cut a store call short). A frozen one hears them
	// when it resumes, with the release's wake-up.
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
	if a := release(ps[len(ps)-1].url(), holder.LeaseID); a.code != http.StatusNoContent {
		t.Fatalf("the holder's release: %v", a)
	}
	if freeze {
		time.Sleep(300 * time.Millisecond)
		if err := ps[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	if freeze {
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
		if st.Token != holder.Token {
			t.Errorf("after the waiters left and the holder released, replica %d reports token %d; want the holder's %d (a lease went to a client that left)", i, st.Token, holder.Token)
		}
	}
	next, ans := grant(ps[0].url(), res, "next", time.Minute, 0)
	if ans.code != http.StatusCreated || next.Token != holder.Token+1 {
		t.Errorf("the next acquire: %v (token %d); want 201 and token %d", ans, next.Token, holder.Token+1)
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
