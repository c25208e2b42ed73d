package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The fence holds until the bytes leave (guarantee 1): a write admitted on
// replica 1 whose body arrives slowly, while replica 1's PostgreSQL
// sessions are terminated (a failover, a network blip that resets
// connections, an operator) and the resource is granted to B on replica 2,
// never reaches the upstream after B's write: replica 1 can no longer
// prove its fence when the body's end comes, so it sends nothing and
// answers 503 fence_lost. The same with replica 1 frozen (SIGSTOP) while
// its sessions are killed. Afterwards replica 1 serves again within
// seconds. In both PostgreSQL modes.
func TestFaultSlowBodyAfterSessionsKilled(t *testing.T) {
	eachFenceMode(t, func(t *testing.T, pg *pgCluster, frozen bool, args []string) {
		testSlowBody(t, func(t *testing.T, pid int) {
			t.Logf("terminated replica 1's %d fence sessions", killFenceSessions(t, pg, pid))
		}, frozen, args...)
	})
}

// eachFenceMode runs test in both PostgreSQL modes (--postgres, and
// --postgres --redis), with replica 1 running and frozen, each on a
// PostgreSQL (and Redis) of its own: args are the gateway's storage flags.
func eachFenceMode(t *testing.T, test func(t *testing.T, pg *pgCluster, frozen bool, args []string)) {
	for _, mode := range []string{"postgres", "redis"} {
		for _, frozen := range []bool{false, true} {
			name := mode
			if frozen {
				name += "/frozen"
			}
			t.Run(name, func(t *testing.T) {
				pg := startPostgres(t)
				args := []string{"--postgres", pg.URL()}
				if mode == "redis" {
					args = append(args, "--redis", startRedis(t).URL())
				}
				test(t, pg, frozen, args)
			})
		}
	}
}

// The same with a failover of PostgreSQL while the body is arriving: the
// primary is killed (immediate stop, as a crash) and its synchronous
// standby promoted; the replicas are on a multi-host URL. Replica 1 lost
// its fence with the old primary; the write must not be sent after B's
// grant on the new one.
func TestFaultSlowBodyDuringFailover(t *testing.T) {
	for _, mode := range []string{"postgres", "redis"} {
		t.Run(mode, func(t *testing.T) {
			primary := startPostgres(t)
			standby := startStandby(t, primary)
			url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2&target_session_attrs=read-write",
				primary.port, standby.port)
			args := []string{"--postgres", url, "--pg-statement-timeout", "2s"}
			if mode == "redis" {
				args = append(args, "--redis", startRedis(t).URL())
			}
			testSlowBody(t, func(t *testing.T, _ int) {
				if err := primary.run("pg_ctl", "-D", primary.dir, "-m", "immediate", "-w", "stop"); err != nil {
					t.Fatal(err)
				}
				if err := standby.run("pg_ctl", "-D", standby.dir, "-w", "promote"); err != nil {
					t.Fatal(err)
				}
				t.Log("primary killed, standby promoted")
			}, false, args...)
		})
	}
}

// testSlowBody runs fault (given replica 1's pid) while A's write on
// replica 1 is admitted and its body half arrived; frozen: with replica 1
// stopped (SIGSTOP) across the fault.
func testSlowBody(t *testing.T, fault func(t *testing.T, pid int), frozen bool, args ...string) {
	up := newUpstream(t)
	ps := startReplicas(t, 2, append(args, "--upstream", "svc="+up.URL,
		"--forward-timeout", "3s", "--drain-period", "3s", "--grant-wait", "8s")...)
	bases := []string{ps[0].url(), ps[1].url()}

	// A holds the resource and has written through replica 1, which holds
	// its fence.
	a, ans := grant(bases[0], "slow", "A", 800*time.Millisecond, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A: %v", ans)
	}
	if w := fencedWrite(bases[0], a.LeaseID, "/slow", "A first"); w.code != http.StatusOK {
		t.Fatalf("A's first write: %v", w)
	}
	// A's second write: its head and half its body, then nothing.
	body := "A late " + strings.Repeat("x", 233)
	c, err := net.Dial("tcp", ps[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	head := fmt.Sprintf("POST /v1/proxy/svc/slow HTTP/1.1\r\nHost: %s\r\nFencing-Lease: %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n",
		ps[0].addr, a.LeaseID, len(body))
	if _, err := io.WriteString(c, head+body[:120]); err != nil {
		t.Fatal(err)
	}
	// The head is admitted when it arrives: wait until replica 1 counts
	// the write in flight.
	waitInflight(t, bases[0], 1)

	if frozen {
		if err := ps[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ps[0].cmd.Process.Signal(syscall.SIGCONT) })
	}
	fault(t, ps[0].cmd.Process.Pid)

	// A's lease expires; B is granted on replica 2 after the orphan drain
	// (and, after a failover, once replica 2 reaches the new primary: 503
	// until then).
	var b lease
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, ans = grant(bases[1], "slow", "B", time.Minute, 20*time.Second)
		if ans.code == http.StatusCreated {
			break
		}
		if ans.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("B: %v", ans)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b.Token <= a.Token {
		t.Fatalf("B got token %d after A's %d", b.Token, a.Token)
	}
	if w := fencedWrite(bases[1], b.LeaseID, "/slow", "B"); w.code != http.StatusOK {
		t.Fatalf("B's write: %v", w)
	}
	if frozen {
		if err := ps[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}

	// The rest of A's body arrives; replica 1 must not send it.
	if _, err := io.WriteString(c, body[120:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("A's slow write: no answer: %v", err)
	}
	defer resp.Body.Close()
	var p struct {
		Code string `json:"code"`
		Sent *bool  `json:"sent"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&p)
	if up.received(body) {
		t.Errorf("A's write (token %d) reached the upstream after B's grant (token %d)", a.Token, b.Token)
	}
	up.checkOrder(t)
	if resp.StatusCode != http.StatusServiceUnavailable || p.Code != "fence_lost" || p.Sent == nil || *p.Sent {
		t.Errorf("A's slow write: %d %+v, want 503 fence_lost with sent: false", resp.StatusCode, p)
	}

	// Liveness: replica 1 grants and writes again within seconds.
	deadline = time.Now().Add(15 * time.Second)
	for {
		w := fencedWrite(bases[0], b.LeaseID, "/slow", "B again")
		if w.code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica 1 does not write again 15 s after its sessions were killed: %v", w)
		}
		time.Sleep(100 * time.Millisecond)
	}
	l, ans := grant(bases[0], "slow-after", "C", 10*time.Second, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("replica 1 grants again: %v", ans)
	}
	// A store call that times out on a loaded machine answers 503 (fail
	// closed), which a worker retries; liveness asks for a 200 in time.
	for {
		w := fencedWrite(bases[0], l.LeaseID, "/after", "C")
		if w.code == http.StatusOK {
			break
		}
		if w.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("replica 1 writes under a new lease: %v", w)
		}
		t.Logf("replica 1 writes under a new lease: %v; again", w)
		time.Sleep(100 * time.Millisecond)
	}
	up.checkOrder(t)
}

// killFenceSessions terminates the fence sessions (lock sessions and
// listener) of the replica with process id pid, as an operator would: they
// are named after the replica (application_name "fencegw-fence HOST/PID").
func killFenceSessions(t *testing.T, pg *pgCluster, pid int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name LIKE 'fencegw-fence %' AND application_name LIKE $1`, fmt.Sprintf("%%/%d", pid)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no fence session of the replica found")
	}
	return n
}

// waitInflight waits until the replica at base has n writes in flight
// (its fencegw_inflight_writes gauge).
func waitInflight(t *testing.T, base string, n int) {
	t.Helper()
	want := fmt.Sprintf("fencegw_inflight_writes %d", n)
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := call("GET", base+"/metrics", nil)
		if strings.Contains(string(a.body), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never had %d writes in flight", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
