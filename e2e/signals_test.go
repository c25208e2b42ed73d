package e2e

// The signals an operator is paged on, read from a real gateway's /metrics
// after the events that must move them.

import (
	"bufio"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape reads /metrics into series -> value; a series is the name and
// its labels as the gateway prints them (`fencegw_drains_total`,
// `fencegw_lease_refusals_total{cause="expired",op="renew"}`). header:
// do's, as a key for a gateway with authentication.
func scrape(t testing.TB, base string, header ...string) map[string]float64 {
	t.Helper()
	a := do(t, "GET", base+"/metrics", nil, header...)
	if a.Status != 200 {
		t.Fatalf("GET /metrics: %d", a.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(a.Body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func wantSeries(t *testing.T, m map[string]float64, series string, want float64) {
	t.Helper()
	got, ok := m[series]
	if !ok {
		t.Errorf("/metrics has no %s", series)
		return
	}
	if got != want {
		t.Errorf("%s = %v, want %v", series, got, want)
	}
}

func TestSignalsLeaseLostRefusalsDrainsInflightStore(t *testing.T) {
	up := newUpstream(t)
	g := startEmbedded(t, map[string]string{"up": up.URL}, options{forwardTimeout: 300 * time.Millisecond, drainPeriod: 200 * time.Millisecond})

	m := scrape(t, g.URL)
	for _, s := range []string{
		`fencegw_lease_refusals_total{cause="expired",op="renew"}`, `fencegw_lease_refusals_total{cause="superseded",op="release"}`,
		`fencegw_leases_expired_while_held_total`, `fencegw_drains_total`, `fencegw_inflight_oldest_seconds`, `fencegw_drains_pending`,
	} {
		wantSeries(t, m, s, 0)
	}
	wantSeries(t, m, "fencegw_store_up", 1)

	// A holder whose lease ran out renews, then releases: two refusals,
	// one lease lost while held.
	l := acquire(t, g.URL, "job:1", "worker-1", 150*time.Millisecond)
	waitLeaseState(t, g.URL, l.LeaseID, "expired")
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+l.LeaseID+"/renew", map[string]any{}), 409, "lease_lost")
	wantProblem(t, do(t, "DELETE", g.URL+"/v1/leases/"+l.LeaseID, nil), 409, "lease_lost")
	// A lease released by its holder, then renewed: refused, not lost by expiry.
	r := acquire(t, g.URL, "job:2", "worker-2", time.Minute)
	do(t, "DELETE", g.URL+"/v1/leases/"+r.LeaseID, nil)
	wantProblem(t, do(t, "POST", g.URL+"/v1/leases/"+r.LeaseID+"/renew", map[string]any{}), 409, "lease_lost")

	// A write held by the upstream: in flight, and the oldest one's age
	// grows; then it times out, its outcome unknown: a drain.
	up.setHold(func(arrival) { time.Sleep(600 * time.Millisecond) })
	w := acquire(t, g.URL, "job:3", "worker-3", time.Minute)
	done := make(chan answer, 1)
	go func() { done <- write(t, g.URL, "up", "/x", w, `{}`) }()
	if a := <-done; a.Status != 504 {
		t.Fatalf("held write: %d %s, want 504", a.Status, a.Body)
	}

	m = scrape(t, g.URL)
	wantSeries(t, m, `fencegw_lease_refusals_total{cause="expired",op="renew"}`, 1)
	wantSeries(t, m, `fencegw_lease_refusals_total{cause="expired",op="release"}`, 1)
	wantSeries(t, m, `fencegw_lease_refusals_total{cause="ended",op="renew"}`, 1)
	wantSeries(t, m, `fencegw_leases_expired_while_held_total`, 1)
	wantSeries(t, m, `fencegw_drains_total`, 1)
	wantSeries(t, m, `fencegw_inflight_oldest_seconds`, 0)

	// The oldest in-flight write, while it is in flight. (The forward
	// timeout above is short, so this one uses a gateway of its own.)
	release := make(chan struct{})
	up.setHold(func(arrival) { <-release })
	g2 := startEmbedded(t, map[string]string{"up": up.URL}, options{})
	w2 := acquire(t, g2.URL, "job:4", "worker-4", time.Minute)
	go func() { done <- write(t, g2.URL, "up", "/y", w2, `{}`) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		age := scrape(t, g2.URL)["fencegw_inflight_oldest_seconds"]
		if age >= 2 {
			t.Logf("oldest in-flight write: %v s", age)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fencegw_inflight_oldest_seconds stayed at %v with a write held for 10 s", age)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(release)
	if a := <-done; a.Status != 200 {
		t.Fatalf("released write: %d", a.Status)
	}
	wantSeries(t, scrape(t, g2.URL), `fencegw_inflight_oldest_seconds`, 0)

	// The store goes away: fencegw_store_up reads 0.
	g2.store.(interface{ Close() error }).Close()
	wantSeries(t, scrape(t, g2.URL), "fencegw_store_up", 0)
}
