package e2e

import (
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mode starts one or more gateway replicas sharing one store. Replicas are
// used round-robin by the stories, so with several replicas a worker's
// acquire and its writes land on different processes.
type mode struct {
	name  string
	start func(t *testing.T, ups map[string]string, o options) []*gw
}

var modes = []mode{{
	name: "embedded",
	start: func(t *testing.T, ups map[string]string, o options) []*gw {
		return []*gw{startEmbedded(t, ups, o)}
	},
}}

func forEachMode(t *testing.T, f func(t *testing.T, m mode)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

// pick returns replica i's URL (round-robin).
func pick(gws []*gw, i int) string { return gws[i%len(gws)].URL }

// The statement-job incident: A's lease expires while it stalls, B takes
// over and writes, A wakes and writes: A gets 409, the upstream never sees
// A's write, and the rejection is listed with both tokens. Then A tries to
// release: it must not free B's lease.
func TestIncidentStaleWriteIsRejected(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		up := newUpstream(t)
		gws := m.start(t, map[string]string{"statements": up.URL}, options{})
		res := "stmt:acct:88213:" + m.name

		// A TTL long enough for A's first write on a loaded CI machine
		// (-race, every package at once).
		const ttl = 2 * time.Second
		asked := time.Now()
		a := acquire(t, pick(gws, 0), res, "worker-A", ttl)
		if got := write(t, pick(gws, 1), "statements", "/lines", a, "A line 1"); got.Status != http.StatusOK {
			t.Fatalf("A's first write: %d %s", got.Status, got.Body)
		}
		time.Sleep(time.Until(asked.Add(ttl + 500*time.Millisecond))) // A stalls past its TTL

		b := acquire(t, pick(gws, 2), res, "worker-B", 10*time.Second)
		if b.Token <= a.Token {
			t.Fatalf("B's token %d is not above A's %d", b.Token, a.Token)
		}
		if got := write(t, pick(gws, 0), "statements", "/lines", b, "B line 1"); got.Status != http.StatusOK {
			t.Fatalf("B's write: %d %s", got.Status, got.Body)
		}

		stale := write(t, pick(gws, 1), "statements", "/lines", a, "A line 2 (stale)")
		wantProblem(t, stale, http.StatusConflict, "stale_token")
		if stale.Problem.Token != a.Token || stale.Problem.CurrentToken != b.Token || stale.Problem.Resource != res {
			t.Fatalf("problem facts: %+v, want token %d current %d resource %s", stale.Problem, a.Token, b.Token, res)
		}
		for _, ar := range up.seen() {
			if ar.Body == "A line 2 (stale)" {
				t.Fatalf("the stale write reached the upstream: %+v", ar)
			}
		}

		list := rejections(t, pick(gws, 2), "?resource="+res)
		if len(list.Items) != 1 {
			t.Fatalf("rejections: %+v", list)
		}
		r := list.Items[0]
		if r.Code != "stale_token" || r.Token != a.Token || r.CurrentToken != b.Token || r.Holder != "worker-A" ||
			r.Method != "POST" || r.Upstream != "statements" || r.Path != "/lines" {
			t.Fatalf("rejection: %+v", r)
		}
		if len(r.LeaseHint) >= len(a.LeaseID) || r.LeaseHint == a.LeaseID {
			t.Fatalf("the rejection log shows the lease id: %q", r.LeaseHint)
		}

		// A releases late: refused, and B's lease is untouched.
		wantProblem(t, do(t, "DELETE", pick(gws, 0)+"/v1/leases/"+a.LeaseID, nil), http.StatusConflict, "lease_lost")
		if got := write(t, pick(gws, 1), "statements", "/lines", b, "B line 2"); got.Status != http.StatusOK {
			t.Fatalf("B's write after A's release attempt: %d %s", got.Status, got.Body)
		}
		var bodies []string
		for _, ar := range up.seen() {
			bodies = append(bodies, ar.Body)
		}
		want := []string{"A line 1", "B line 1", "B line 2"}
		if len(bodies) != len(want) {
			t.Fatalf("upstream saw %q, want %q", bodies, want)
		}
		for i := range want {
			if bodies[i] != want[i] {
				t.Fatalf("upstream saw %q, want %q", bodies, want)
			}
		}
	})
}

// A write forged with a lease id that was never granted: 403, nothing
// forwarded, the attempt recorded. Client-sent token headers change nothing.
func TestForgedLeaseIsForbidden(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		up := newUpstream(t)
		gws := m.start(t, map[string]string{"svc": up.URL}, options{})
		res := "forged:" + m.name
		real := acquire(t, pick(gws, 0), res, "honest", 5*time.Second)

		forged := do(t, "PUT", pick(gws, 1)+"/v1/proxy/svc/x", "evil",
			"Fencing-Lease", "fl_"+"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "Fencing-Token", "999999999999")
		wantProblem(t, forged, http.StatusForbidden, "unknown_lease")
		if n := len(up.seen()); n != 0 {
			t.Fatalf("upstream saw %d requests", n)
		}
		list := rejections(t, pick(gws, 2), "")
		found := false
		for _, r := range list.Items {
			if r.Code == "unknown_lease" && r.Method == "PUT" && r.Upstream == "svc" && r.Path == "/x" {
				found = true
			}
		}
		if !found {
			t.Fatalf("forged write not in the rejection log: %+v", list)
		}

		// A huge client-sent token does not raise the fence: the real holder
		// still writes, and its own token is what reaches the upstream.
		ok := do(t, "POST", pick(gws, 2)+"/v1/proxy/svc/y", "fine", "Fencing-Lease", real.LeaseID, "Fencing-Token", "999999999999")
		if ok.Status != http.StatusOK {
			t.Fatalf("honest write: %d %s", ok.Status, ok.Body)
		}
		seen := up.seen()
		if len(seen) != 1 || seen[0].Token != real.Token {
			t.Fatalf("upstream saw %+v, want one write with token %d", seen, real.Token)
		}
	})
}

// A grant while a write under the previous token is in flight waits for it,
// and no write of the old token reaches the upstream after the grant
// returned. The order is observed, not timed: one sequence numbers the
// events at the upstream (the held write answered) and at the grant's
// gateway (its exclusive lock taken, the grant returned), and the grant's
// events must come after the write's.
func TestGrantWaitsForInFlightWrite(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		res := "inflight:" + m.name
		var seq atomic.Int64
		var exclusiveAt atomic.Int64 // seq of the first exclusive lock of res taken once armed; 0: none yet
		var armed atomic.Bool        // set once A holds the lease: A's own grant took the lock too
		asked := make(chan struct{})
		var askedOnce sync.Once
		up := newUpstream(t)
		gws := m.start(t, map[string]string{"svc": up.URL}, options{onExclusive: func(resource string, acquired bool) {
			if resource != res || !armed.Load() {
				return
			}
			if !acquired {
				askedOnce.Do(func() { close(asked) })
				return
			}
			exclusiveAt.CompareAndSwap(0, seq.Add(1))
		}})
		// Long enough for the write to be admitted on a loaded CI machine;
		// it expires while the write is held at the upstream.
		const ttl = 1500 * time.Millisecond
		a := acquire(t, pick(gws, 0), res, "A", ttl)
		armed.Store(true)

		entered, release := make(chan struct{}), make(chan struct{})
		var once, releaseOnce sync.Once
		var answeredAt atomic.Int64 // seq of the held write's answer at the upstream
		unblock := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unblock) // runs before the upstream closes, even when the test fails
		up.setHold(func(ar arrival) {
			if ar.Body == "slow" {
				once.Do(func() { close(entered) })
				<-release
				answeredAt.Store(seq.Add(1))
			}
		})
		slowDone := make(chan answer, 1)
		go func() { slowDone <- write(t, pick(gws, 1), "svc", "/w", a, "slow") }()
		select {
		case <-entered:
		case got := <-slowDone:
			t.Fatalf("the write answered %d without reaching the upstream: %s", got.Status, got.Body)
		}
		waitLeaseState(t, pick(gws, 0), a.LeaseID, "expired") // A's lease expires while its write is in flight

		type grant struct {
			lease leaseJSON
			at    int64 // seq when it returned
		}
		granted := make(chan grant, 1)
		go func() {
			b := acquire(t, pick(gws, 2), res, "B", 5*time.Second)
			granted <- grant{b, seq.Add(1)}
		}()
		select {
		case <-asked:
		case b := <-granted:
			t.Fatalf("grant %d returned without asking for the exclusive lock while a write of token %d was in flight", b.lease.Token, a.Token)
		}
		// The grant is at the lock. Holding the write a while longer gives a
		// grant that does not wait the chance to return first; the pass does
		// not depend on this span (a slow machine can only hide a bug here,
		// never fail a correct build), the order checks below do the judging.
		select {
		case b := <-granted:
			t.Fatalf("grant %d returned while a write of token %d was in flight", b.lease.Token, a.Token)
		case <-time.After(300 * time.Millisecond):
		}
		unblock()
		if got := <-slowDone; got.Status != http.StatusOK {
			t.Fatalf("in-flight write: %d %s", got.Status, got.Body)
		}
		g := <-granted
		if g.lease.Token <= a.Token {
			t.Fatalf("B token %d <= A token %d", g.lease.Token, a.Token)
		}
		if ex, ans := exclusiveAt.Load(), answeredAt.Load(); ex == 0 || ex < ans || g.at < ans {
			t.Fatalf("order: the held write answered at step %d, the grant's exclusive lock at %d, the grant returned at %d; the grant must follow the write", ans, ex, g.at)
		}
		// After the grant, A is fenced.
		wantProblem(t, write(t, pick(gws, 0), "svc", "/w", a, "late"), http.StatusConflict, "stale_token")
		for _, ar := range up.seen() {
			if ar.Body == "late" || (ar.Token == a.Token && ar.Body != "slow") {
				t.Fatalf("a write of the old token reached the upstream after the grant: %+v", ar)
			}
		}
	})
}

// waitLeaseState polls the lease until its state is want (the gateway's
// clock decides when a TTL ran out, not the test's).
func waitLeaseState(t *testing.T, base, leaseID, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := do(t, "GET", base+"/v1/leases/"+leaseID, nil)
		var l leaseJSON
		if got.Status == http.StatusOK && json.Unmarshal(got.Body, &l) == nil && l.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease %s never became %s: %d %s", leaseID, want, got.Status, got.Body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Release and renew semantics of docs/design.md's "Details that clients rely on".
func TestLeaseLifecycle(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		gws := m.start(t, nil, options{})
		base := pick(gws, 0)
		res := "life/cycle:" + m.name

		a := acquire(t, base, res, "A", 5*time.Second)
		if a.Token < 1 || a.State != "current" || a.TTLms <= 0 || len(a.LeaseID) < 26 {
			t.Fatalf("lease: %+v", a)
		}
		held := do(t, "POST", pick(gws, 1)+"/v1/leases", map[string]any{"resource": res, "holder": "B", "ttl_ms": 1000})
		wantProblem(t, held, http.StatusConflict, "lease_held")
		if held.Header.Get("Retry-After") == "" || held.Problem.Holder != "A" || held.Problem.CurrentToken != a.Token {
			t.Fatalf("lease_held answer: %v %s", held.Header, held.Body)
		}

		renewed := do(t, "POST", pick(gws, 2)+"/v1/leases/"+a.LeaseID+"/renew", map[string]any{"ttl_ms": 8000})
		if renewed.Status != http.StatusOK {
			t.Fatalf("renew: %d %s", renewed.Status, renewed.Body)
		}
		if r := do(t, "POST", base+"/v1/leases/"+a.LeaseID+"/renew", nil); r.Status != http.StatusOK {
			t.Fatalf("renew without body: %d %s", r.Status, r.Body)
		}
		if got := do(t, "GET", base+"/v1/leases/"+a.LeaseID, nil); got.Status != http.StatusOK {
			t.Fatalf("get: %d %s", got.Status, got.Body)
		}
		state := do(t, "GET", base+"/v1/resources/life%2Fcycle:"+m.name, nil)
		if state.Status != http.StatusOK {
			t.Fatalf("resource: %d %s", state.Status, state.Body)
		}

		if r := do(t, "DELETE", base+"/v1/leases/"+a.LeaseID, nil); r.Status != http.StatusNoContent {
			t.Fatalf("release: %d %s", r.Status, r.Body)
		}
		if r := do(t, "DELETE", pick(gws, 1)+"/v1/leases/"+a.LeaseID, nil); r.Status != http.StatusNoContent {
			t.Fatalf("release again (idempotent): %d %s", r.Status, r.Body)
		}
		wantProblem(t, do(t, "POST", base+"/v1/leases/"+a.LeaseID+"/renew", nil), http.StatusConflict, "lease_lost")
		up := newUpstream(t)
		_ = up
		b := acquire(t, pick(gws, 2), res, "B", 300*time.Millisecond)
		if b.Token != a.Token+1 {
			t.Fatalf("token after release: %d, want %d", b.Token, a.Token+1)
		}
		time.Sleep(400 * time.Millisecond)
		wantProblem(t, do(t, "DELETE", base+"/v1/leases/"+b.LeaseID, nil), http.StatusConflict, "lease_lost")
		wantProblem(t, do(t, "POST", base+"/v1/leases/"+b.LeaseID+"/renew", nil), http.StatusConflict, "lease_lost")

		for _, path := range []string{"/v1/leases/fl_nope", "/v1/resources/never-granted-" + m.name} {
			wantProblem(t, do(t, "GET", base+path, nil), http.StatusNotFound, "not_found")
		}
		wantProblem(t, do(t, "DELETE", base+"/v1/leases/fl_nope", nil), http.StatusNotFound, "not_found")
		wantProblem(t, do(t, "POST", base+"/v1/leases/fl_nope/renew", nil), http.StatusNotFound, "not_found")
	})
}
