package torture

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// good is a small correct history: holder A (token 1) writes, stalls, B
// (token 2) takes over, A's late write is refused, B writes; thief C's
// write and release with B's lease are refused; a fault.
func good() History {
	return History{
		Grants: []Grant{
			{Resource: "r", Token: 1, Holder: "A", LeaseID: "LA", Returned: at(0)},
			{Resource: "r", Token: 2, Holder: "B", LeaseID: "LB", Returned: at(500)},
		},
		Writes: []Write{
			{ID: "a1", Resource: "r", Token: 1, Status: 200, Sent: at(10), Returned: at(20)},
			{ID: "a2", Resource: "r", Token: 1, Status: 409, Code: "stale_token", Sent: at(600), Returned: at(601), Late: true},
			// naming its sender and lease: B's own, so not foreign.
			{ID: "b1", Resource: "r", Token: 2, Status: 200, Sent: at(700), Returned: at(710), LeaseID: "LB", By: "B"},
			{ID: "b2", Resource: "r", Token: 2, Status: 504, Code: "upstream_timeout", Sent: at(720), Returned: at(1020)},
			{ID: "c1", Resource: "r", Token: 2, Status: 403, Code: "lease_not_owned", Sent: at(1490), Returned: at(1510), LeaseID: "LB", By: "C"},
			// B's own lease on r, sent to the path of q: refused.
			{ID: "b3", Resource: "r", Token: 2, Status: 403, Code: "resource_mismatch", Sent: at(1515), Returned: at(1516), Route: "q"},
		},
		LeaseOps: []LeaseOp{
			{Op: OpRelease, LeaseID: "LB", By: "C", Resource: "r", Status: 403, Code: "lease_not_owned", Sent: at(1511), Returned: at(1512)},
		},
		Arrivals: []Arrival{
			{Seq: 1, Resource: "r", Token: 1, ID: "a1", Arrived: at(11), Applied: at(12)},
			{Seq: 2, Resource: "r", Token: 2, ID: "b1", Arrived: at(701), Applied: at(702)},
			{Seq: 3, Resource: "r", Token: 2, ID: "b2", Arrived: at(721), Applied: at(1400)},
		},
		Faults: []Fault{{Kind: "kill-gateway", Start: at(300), End: at(400)}},
	}
}

func TestCheckGoodHistoryPasses(t *testing.T) {
	r := Check(good())
	if !r.OK() {
		t.Fatalf("good history failed:\n%s", r)
	}
	if r.Stats.OK != 2 || r.Stats.StaleRejected != 1 || r.Stats.UnknownOutcome != 1 || r.Stats.Applied != 3 || r.Stats.OtherRefused != 2 ||
		r.Stats.ForeignWrites != 1 || r.Stats.ForeignOps != 1 || r.Stats.ForeignRefused != 2 || r.Stats.RouteThefts != 1 || r.Stats.RouteRefused != 1 {
		t.Errorf("stats: %+v", r.Stats)
	}
}

// Each bad history breaks exactly one rule.
func TestCheckCatchesEachRule(t *testing.T) {
	cases := []struct {
		rule   string
		break_ func(h *History)
	}{
		{RuleTokenOrder, func(h *History) {
			// a token-1 write arrives after a token-2 one (it was sent
			// before the grant, so it is not stale-applied by the clock).
			h.Grants[1].Returned = at(2000)
			h.Writes = append(h.Writes, Write{ID: "a3", Resource: "r", Token: 1, Status: 200, Sent: at(720), Returned: at(730)})
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 1, ID: "a3", Arrived: at(725), Applied: at(726)})
			h.Writes[2].Token, h.Arrivals[1].Token = 2, 2
		}},
		{RuleStaleApplied, func(h *History) {
			// a token-1 write applied after grant 2 returned, arriving in
			// order (before any token-2 write).
			h.Writes = append(h.Writes, Write{ID: "a3", Resource: "r", Token: 1, Status: 504, Sent: at(100), Returned: at(400)})
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 0, Resource: "r", Token: 1, ID: "a3", Arrived: at(101), Applied: at(550)})
		}},
		{RuleExactlyOnce, func(h *History) {
			// a 200 write that never arrived.
			h.Writes = append(h.Writes, Write{ID: "b3", Resource: "r", Token: 2, Status: 200, Sent: at(800), Returned: at(810)})
		}},
		{RuleExactlyOnce, func(h *History) {
			// a write applied twice (a retry the gateway should not make).
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 2, ID: "b1", Arrived: at(1500), Applied: at(1501)})
		}},
		{RuleRejectedApplied, func(h *History) {
			// a 503 write that reached the upstream.
			h.Writes = append(h.Writes, Write{ID: "b3", Resource: "r", Token: 2, Status: 503, Code: "store_unavailable", Sent: at(800), Returned: at(810)})
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 2, ID: "b3", Arrived: at(805)})
		}},
		{RuleDuplicateToken, func(h *History) {
			h.Grants = append(h.Grants, Grant{Resource: "r", Token: 2, Holder: "C", Returned: at(1600)})
		}},
		{RuleStoreDown, func(h *History) {
			h.Faults = append(h.Faults, Fault{Kind: "restart-postgres", Start: at(650), End: at(900), DownFrom: at(690), DownTo: at(800)})
		}},
		{RuleStoreDown, func(h *History) {
			// a Redis outage: a write under a lease granted while Redis
			// was down (so its state could only have come from Redis).
			h.Faults = append(h.Faults, Fault{Kind: FaultRestartRedis, Start: at(600), End: at(900), DownFrom: at(690), DownTo: at(800)})
			h.Grants = append(h.Grants, Grant{Resource: "q", Token: 1, Holder: "D", Returned: at(700)})
			h.Writes = append(h.Writes, Write{ID: "d1", Resource: "q", Token: 1, Status: 200, Sent: at(750), Returned: at(760)})
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "q", Token: 1, ID: "d1", Arrived: at(755), Applied: at(756)})
		}},
		{RuleTokenMismatch, func(h *History) {
			// the upstream got another token than the write's lease has.
			h.Arrivals[2].Token = 3
			h.Grants = append(h.Grants, Grant{Resource: "r", Token: 3, Holder: "C", Returned: at(5000)})
		}},
		{RuleForeignLease, func(h *History) {
			// thief C's write with B's (current) lease was forwarded and
			// applied: every other rule holds.
			h.Writes[4].Status, h.Writes[4].Code = 200, ""
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 2, ID: "c1", Arrived: at(1500), Applied: at(1501)})
		}},
		{RuleForeignLease, func(h *History) {
			// the thief's write went unanswered (an unknown outcome may
			// land once) and reached the upstream, not applied: arriving
			// at all is the violation.
			h.Writes[4].Status, h.Writes[4].Code = 0, ""
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 2, ID: "c1", Arrived: at(1500)})
		}},
		{RuleForeignLease, func(h *History) {
			// thief C released B's lease.
			h.LeaseOps[0].Status, h.LeaseOps[0].Code = 204, ""
		}},
		{RuleForeignRoute, func(h *History) {
			// a build that skips the route check: B's write under its
			// lease of r to q's path was forwarded and applied (as a write
			// on r, with r's token: every other rule holds).
			h.Writes[5].Status, h.Writes[5].Code = 200, ""
			h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 2, ID: "b3", Arrived: at(1515), Applied: at(1516)})
		}},
	}
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			h := good()
			c.break_(&h)
			r := Check(h)
			if r.OK() {
				t.Fatalf("bad history passed:\n%s", r)
			}
			for rule, n := range r.Stats.ViolationCounts {
				if rule != c.rule && n > 0 {
					t.Errorf("also flagged %s (%d): the case should break one rule\n%s", rule, n, r)
				}
			}
			if r.Stats.ViolationCounts[c.rule] == 0 {
				t.Errorf("%s not flagged:\n%s", c.rule, r)
			}
		})
	}
}

// A Redis outage in the PostgreSQL + Redis mode does not stop writes a
// replica admits from the fence it already holds in PostgreSQL under a
// lease granted before the outage (good's b1 and b2 arrive at 701 and 721, in the window);
// a PostgreSQL outage does.
func TestCheckRedisOutageKeepsHeldFences(t *testing.T) {
	h := good()
	h.Faults = append(h.Faults, Fault{Kind: FaultRestartRedis, Start: at(600), End: at(900), DownFrom: at(690), DownTo: at(800)})
	if r := Check(h); !r.OK() || r.Stats.HeldInOutage != 2 {
		t.Fatalf("writes under a lease granted before the Redis outage were flagged, or not counted:\n%s", r)
	}
	h = good()
	h.Faults = append(h.Faults, Fault{Kind: FaultRestartPostgres, Start: at(600), End: at(900), DownFrom: at(690), DownTo: at(800)})
	if r := Check(h); r.Stats.ViolationCounts[RuleStoreDown] != 2 {
		t.Fatalf("the writes in a PostgreSQL outage were not both flagged:\n%s", r)
	}
}

func TestCheckVoidRuns(t *testing.T) {
	cases := map[string]func(h *History){
		"no fault": func(h *History) { h.Faults = nil },
		"no stale": func(h *History) {
			h.Writes = append(h.Writes[:1], h.Writes[2:]...)
		},
		"no theft": func(h *History) {
			h.Writes = h.Writes[:4]
		},
		"no thief answered": func(h *History) {
			h.Writes[4].Status, h.Writes[4].Code = 0, "" // the gateway was down
		},
		"no route thief answered": func(h *History) {
			h.Writes[5].Status, h.Writes[5].Code = 0, ""
		},
		"no accepted write": func(h *History) {
			h.Writes = h.Writes[1:2]
			h.Arrivals = nil
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			h := good()
			mutate(&h)
			r := Check(h)
			if r.ViolationCount() != 0 {
				t.Fatalf("unexpected violations:\n%s", r)
			}
			if r.Void == "" || r.OK() {
				t.Fatalf("run should be void:\n%s", r)
			}
			if !strings.Contains(r.String(), "VOID") {
				t.Errorf("summary does not say VOID:\n%s", r)
			}
		})
	}
}

// A write with an unknown outcome that lands after the drain period the
// gateway promised is the upstream's lateness, not a violation; one that
// lands after a grant that returned within that period is.
func TestCheckUnknownOutcomeAndDrain(t *testing.T) {
	late := func(grantAt int) History {
		h := good()
		h.DrainPeriod = time.Second
		// b2 (token 2, 504) was sent at 720 and lands at 1900.
		h.Arrivals[2].Applied = at(1900)
		h.Grants = append(h.Grants, Grant{Resource: "r", Token: 3, Holder: "C", Returned: at(grantAt)})
		return h
	}
	if r := Check(late(1800)); !r.OK() {
		t.Errorf("grant after the drain (sent 720 + 1s) blamed on the gateway:\n%s", r)
	}
	if r := Check(late(1500)); r.Stats.ViolationCounts[RuleStaleApplied] != 1 {
		t.Errorf("grant inside the drain not flagged:\n%s", r)
	}
	h := late(1800)
	h.DrainPeriod = 0 // strict
	if r := Check(h); r.Stats.ViolationCounts[RuleStaleApplied] != 1 {
		t.Errorf("strict check did not flag:\n%s", r)
	}
}

// A keyed write with an open outcome (504) retried under a new lease: the
// refused and replayed retries are not violations; a second arrival is.
func TestCheckKeyedRetries(t *testing.T) {
	h := good()
	h.Grants = append(h.Grants, Grant{Resource: "r", Token: 3, Holder: "B", LeaseID: "LB2", Returned: at(2500)})
	h.Writes = append(h.Writes,
		Write{ID: "k1", Resource: "r", Token: 2, Status: 504, Code: "upstream_timeout", Sent: at(1100), Returned: at(1400), Keyed: true, Attempt: 1},
		Write{ID: "k1", Resource: "r", Token: 2, Status: 409, Code: "lease_expired", Sent: at(2100), Returned: at(2101), Keyed: true, Attempt: 2},
		Write{ID: "k1", Resource: "r", Token: 3, Status: 409, Code: codeOutcomeUnknown, Sent: at(2600), Returned: at(2601), Keyed: true, Attempt: 3},
		Write{ID: "k2", Resource: "r", Token: 3, Status: 0, Sent: at(2700), Returned: at(2800), Keyed: true, Attempt: 1},
		Write{ID: "k2", Resource: "r", Token: 3, Status: 200, Sent: at(2900), Returned: at(2901), Keyed: true, Attempt: 2, Replayed: true},
	)
	h.Arrivals = append(h.Arrivals,
		// k1 lands after token 3 was granted, within a drain period of its sending.
		Arrival{Seq: 4, Resource: "r", Token: 2, ID: "k1", Arrived: at(1101), Applied: at(1500)},
		Arrival{Seq: 5, Resource: "r", Token: 3, ID: "k2", Arrived: at(2701), Applied: at(2702)},
	)
	h.DrainPeriod = 2 * time.Second
	r := Check(h)
	if !r.OK() {
		t.Fatalf("keyed retries failed:\n%s", r)
	}
	if r.Stats.KeyRetries != 3 || r.Stats.KeyReplayed != 1 || r.Stats.KeyUnknown != 1 {
		t.Errorf("stats: %+v", r.Stats)
	}
	// A gateway that forgot k2's record forwarded the retry too.
	h.Arrivals = append(h.Arrivals, Arrival{Seq: 6, Resource: "r", Token: 3, ID: "k2", Arrived: at(2902), Applied: at(2903)})
	r = Check(h)
	if r.Stats.ViolationCounts[RuleKeyOnce] != 1 {
		t.Fatalf("a keyed write that arrived twice: %s", r)
	}
}

// A keyed write whose first attempt never reached the gateway's record,
// retried under a new lease, reaches the upstream once with the new token:
// no violation.
func TestCheckKeyedRetryForwardedUnderNewLease(t *testing.T) {
	h := good()
	h.Grants = append(h.Grants, Grant{Resource: "r", Token: 3, Holder: "B", LeaseID: "LB2", Returned: at(2500)})
	h.Writes = append(h.Writes,
		Write{ID: "k3", Resource: "r", Token: 2, Status: 0, Sent: at(1100), Returned: at(1400), Keyed: true, Attempt: 1},
		Write{ID: "k3", Resource: "r", Token: 2, Status: 409, Code: "lease_expired", Sent: at(2100), Returned: at(2101), Keyed: true, Attempt: 2},
		Write{ID: "k3", Resource: "r", Token: 3, Status: 200, Sent: at(2600), Returned: at(2610), Keyed: true, Attempt: 3},
	)
	h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "r", Token: 3, ID: "k3", Arrived: at(2601), Applied: at(2602)})
	if r := Check(h); !r.OK() {
		t.Fatalf("a keyed write forwarded once, by its third attempt:\n%s", r)
	}
}
