package e2e

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway"
)

// keyed counts the arrivals that carried an Idempotency-Key.
func keyed(u *upstream, key string) int {
	n := 0
	for _, a := range u.seen() {
		if a.Header.Get(gateway.HeaderIdempotencyKey) == `"`+key+`"` {
			n++
		}
	}
	return n
}

// The seed story with a key: a charge times out at the gateway (504) and
// lands at the upstream anyway; the worker, not knowing, retries it with
// its key on another replica, and the charge lands once. A retry that was
// answered is replayed on any replica, also under a newer lease.
func TestIdempotentRetryLandsOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		up := newUpstream(t)
		gws := m.start(t, map[string]string{"payments": up.URL}, options{forwardTimeout: 300 * time.Millisecond, drainPeriod: 300 * time.Millisecond})
		res := "acct:88213:" + m.name
		lease := acquire(t, pick(gws, 0), res, "worker-A", 10*time.Second)
		charge := func(replica int, l leaseJSON, key, body string) answer {
			return do(t, "POST", pick(gws, replica)+"/v1/proxy/payments/charges", body,
				gateway.HeaderLease, l.LeaseID, gateway.HeaderIdempotencyKey, `"`+key+`"`)
		}

		var landed sync.WaitGroup
		landed.Add(1)
		up.setHold(func(a arrival) {
			if a.Header.Get(gateway.HeaderIdempotencyKey) == `"charge-1"` {
				time.Sleep(600 * time.Millisecond) // the upstream is slow; the charge lands after the 504
				landed.Done()
			}
		})
		wantProblem(t, charge(0, lease, "charge-1", `{"amount":500}`), http.StatusGatewayTimeout, "upstream_timeout")
		landed.Wait()
		for i := 1; i <= 2; i++ {
			wantProblem(t, charge(i, lease, "charge-1", `{"amount":500}`), http.StatusConflict, "idempotency_outcome_unknown")
		}
		if n := keyed(up, "charge-1"); n != 1 {
			t.Fatalf("charge-1 reached the upstream %d times, want 1", n)
		}

		// An answered write is replayed on every replica, without the upstream.
		first := charge(1, lease, "charge-2", `{"amount":700}`)
		if first.Status != http.StatusOK || first.Header.Get(gateway.HeaderReplayed) != "" {
			t.Fatalf("charge-2: %d %s", first.Status, first.Body)
		}
		for i := range len(gws) + 1 {
			again := charge(i, lease, "charge-2", `{"amount":700}`)
			if again.Status != http.StatusOK || string(again.Body) != string(first.Body) || again.Header.Get(gateway.HeaderReplayed) != "true" {
				t.Fatalf("retry %d of charge-2: %d %q replayed=%q; want %q replayed", i, again.Status, again.Body, again.Header.Get(gateway.HeaderReplayed), first.Body)
			}
		}
		wantProblem(t, charge(0, lease, "charge-2", `{"amount":701}`), http.StatusUnprocessableEntity, "idempotency_key_mismatch")

		// Under the next holder's lease the key still applies once; the
		// superseded lease is refused whatever its key.
		if a := do(t, "DELETE", pick(gws, 2)+"/v1/leases/"+lease.LeaseID, nil); a.Status != http.StatusNoContent {
			t.Fatalf("release: %d %s", a.Status, a.Body)
		}
		var next leaseJSON
		deadline := time.Now().Add(5 * time.Second)
		for { // the resource drains after charge-1's unknown outcome
			a := do(t, "POST", pick(gws, 0)+"/v1/leases", map[string]any{"resource": res, "holder": "worker-B", "ttl_ms": 10000, "wait_ms": 2000})
			if a.Status == http.StatusCreated {
				next = acquireDecode(t, a)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("acquire after release: %d %s", a.Status, a.Body)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if a := charge(1, next, "charge-2", `{"amount":700}`); a.Status != http.StatusOK || a.Header.Get(gateway.HeaderReplayed) != "true" {
			t.Fatalf("charge-2 under the next lease: %d %s replayed=%q", a.Status, a.Body, a.Header.Get(gateway.HeaderReplayed))
		}
		wantProblem(t, charge(2, lease, "charge-2", `{"amount":700}`), http.StatusConflict, "stale_token")
		if n := keyed(up, "charge-2"); n != 1 {
			t.Fatalf("charge-2 reached the upstream %d times, want 1", n)
		}
	})
}

func acquireDecode(t *testing.T, a answer) leaseJSON {
	t.Helper()
	var l leaseJSON
	if err := json.Unmarshal(a.Body, &l); err != nil {
		t.Fatal(err)
	}
	return l
}
