package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// lateUpstream applies each write after a delay (a write to /slow after
// slow, others at once), whatever happens to the connection meanwhile, as
// most handlers do once they have the whole request; and records when.
type lateUpstream struct {
	*httptest.Server
	slow time.Duration
	// barrier, if set, holds each slow write until that many are in
	// flight (or 20 s passed), so that a test sees them all at once on a
	// loaded machine.
	barrier  int64
	all      chan struct{}
	allOnce  sync.Once
	arrived  chan string
	mu       sync.Mutex
	applied  map[string]time.Time
	inflight atomic.Int64
}

func newLateUpstream(t *testing.T, slow time.Duration) *lateUpstream {
	u := &lateUpstream{slow: slow, arrived: make(chan string, 4096), applied: map[string]time.Time{}, all: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.inflight.Add(1)
		defer u.inflight.Add(-1)
		b, _ := io.ReadAll(r.Body)
		body := string(b) + " token " + r.Header.Get("Fencing-Token")
		select {
		case u.arrived <- body:
		default:
		}
		if r.URL.Path == "/slow" {
			if u.barrier > 0 {
				if n >= u.barrier {
					u.allOnce.Do(func() { close(u.all) })
				}
				select {
				case <-u.all:
				case <-time.After(20 * time.Second):
				}
			}
			time.Sleep(u.slow)
		}
		u.mu.Lock()
		u.applied[body] = time.Now()
		u.mu.Unlock()
		_, _ = io.WriteString(w, "applied")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *lateUpstream) appliedAt(body string) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.applied[body]
	return at, ok
}

// The issue-10 scenario, with real processes: a replica is kill -9ed while
// the upstream holds its write, which lands 2.5 s later; a worker asks the
// other replica for the resource as soon as the first lease expired. Its
// grant must wait until the old write can no longer land, so that the old
// token's write is applied before the new token's. Resources the dead
// replica never fenced are granted at once.
func TestPostgresReplicaKilledInWrite(t *testing.T) {
	for _, mode := range []string{"postgres", "postgres+redis"} {
		t.Run(mode, func(t *testing.T) {
			pg := startPostgres(t)
			args := []string{"--postgres", pg.URL()}
			if mode == "postgres+redis" {
				args = append(args, "--redis", startRedis(t).URL())
			}
			up := newLateUpstream(t, 2500*time.Millisecond)
			ps := startReplicas(t, 2, append(args, "--upstream", "svc="+up.URL,
				"--forward-timeout", "10s", "--drain-period", "3s", "--grant-wait", "10s")...)
			r1, r2 := ps[0].url(), ps[1].url()

			a, ans := grant(r1, "stmt:acct:1", "A", 500*time.Millisecond, 0)
			if ans.code != http.StatusCreated {
				t.Fatalf("A: %v", ans)
			}
			if _, ans := grant(r1, "stmt:acct:2", "A", 500*time.Millisecond, 0); ans.code != http.StatusCreated {
				t.Fatalf("A on another resource: %v", ans)
			}
			go fencedWrite(r1, a.LeaseID, "/slow", "A")
			<-up.arrived
			time.Sleep(300 * time.Millisecond)
			_ = ps[0].cmd.Process.Kill()
			killed := time.Now()

			waitExpired(t, r2, a.LeaseID)
			// A's lease on acct:2 ends by the lease store's clock (Redis's
			// TTL in that mode), so B asks until it is no longer held; a
			// drain (fence_busy) or anything else fails at once.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				_, ans := grant(r2, "stmt:acct:2", "B", 10*time.Second, 0)
				if ans.code == http.StatusCreated {
					break
				}
				if ans.problemCode() != "lease_held" || time.Now().After(deadline) {
					t.Fatalf("a resource the dead replica had granted but never fenced: %v", ans)
				}
			}
			b, ans := grant(r2, "stmt:acct:1", "B", 10*time.Second, 9*time.Second)
			if ans.code != http.StatusCreated {
				t.Fatalf("B: %v", ans)
			}
			grantedAfter := time.Since(killed)
			if w := fencedWrite(r2, b.LeaseID, "/fast", "B"); w.code != http.StatusOK {
				t.Fatalf("B's write: %v", w)
			}
			aAt, ok := up.appliedAt("A token " + strconv.FormatInt(a.Token, 10))
			bAt, _ := up.appliedAt("B token " + strconv.FormatInt(b.Token, 10))
			if !ok || !aAt.Before(bAt) {
				t.Fatalf("token %d's write was applied after token %d's (B granted %v after the kill): a stale write landed",
					a.Token, b.Token, grantedAfter.Round(time.Millisecond))
			}
			t.Logf("B granted %v after the kill; A's write landed %v before B's",
				grantedAfter.Round(time.Millisecond), bAt.Sub(aAt).Round(time.Millisecond))
		})
	}
}

// 512 slow writes in flight through one replica on 64 resources all
// succeed, on a bounded number of PostgreSQL connections.
func TestPostgresConnectionsBoundedUnderSlowWrites(t *testing.T) {
	pg := startPostgres(t)
	up := newLateUpstream(t, 2*time.Second)
	up.barrier = 512
	p := startReplicas(t, 1, "--postgres", pg.URL(), "--upstream", "svc="+up.URL, "--forward-timeout", "10s")[0]
	leases := make([]lease, 64)
	for i := range leases {
		l, ans := grant(p.url(), fmt.Sprintf("conns:%02d", i), "w", time.Minute, 0)
		if ans.code != http.StatusCreated {
			t.Fatalf("grant %d: %v", i, ans)
		}
		leases[i] = l
		// The first write after idle takes the fence (a round trip);
		// the 512 below are the steady state.
		if w := fencedWrite(p.url(), l.LeaseID, "/fast", "warm"+strconv.Itoa(i)); w.code != http.StatusOK {
			t.Fatalf("warm-up write %d: %v", i, w)
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 512 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w := fencedWrite(p.url(), leases[i%64].LeaseID, "/slow", "w"+strconv.Itoa(i)); w.code != http.StatusOK {
				if failed.Add(1) <= 5 {
					t.Errorf("write %d: %v", i, w)
				}
			}
		}()
	}
	select {
	case <-up.all:
	case <-time.After(20 * time.Second):
	}
	held := up.inflight.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fencegw%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of 512 slow writes failed", failed.Load())
	}
	if held < 512 {
		t.Fatalf("only %d writes were in flight at once; the test needs 512", held)
	}
	if n > 32 {
		t.Fatalf("%d PostgreSQL connections with 512 writes in flight; want at most 32", n)
	}
	t.Logf("512 writes in flight: %d PostgreSQL connections (pg_stat_activity)", n)

	// They were admitted on the replica's fences, without a round trip,
	// but for at most one per resource whose fence went idle (10 s) during
	// the warm-up.
	m := call("GET", p.url()+"/metrics", nil)
	match := regexp.MustCompile(`(?m)^fencegw_fence_local_admits_total (\S+)$`).FindSubmatch(m.body)
	if match == nil {
		t.Fatalf("no fencegw_fence_local_admits_total in /metrics")
	}
	if local, _ := strconv.ParseFloat(string(match[1]), 64); local < 512-64 {
		t.Fatalf("%v writes admitted without a round trip; want at least 448 of the 512 after the warm-up", local)
	}
}
