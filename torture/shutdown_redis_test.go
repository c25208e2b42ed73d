package torture

import (
	"context"
	"errors"
	"testing"
)

// redis-down-in-shutdown is a Redis outage for the checker (writes under a
// lease granted before it may go on, one granted in it may not), and not
// applicable without Redis, a replica or in another mode; other faults
// pass it by.
func TestRedisDownInShutdownFault(t *testing.T) {
	h := good()
	h.Faults = append(h.Faults, Fault{Kind: FaultRedisDownInShutdown, Start: at(600), End: at(900), DownFrom: at(690), DownTo: at(800)})
	if r := Check(h); !r.OK() || r.Stats.HeldInOutage != 2 {
		t.Fatalf("writes under a lease granted before the Redis outage were flagged, or not counted:\n%s", r)
	}
	h.Grants = append(h.Grants, Grant{Resource: "q", Token: 1, Holder: "D", Returned: at(700)})
	h.Writes = append(h.Writes, Write{ID: "d1", Resource: "q", Token: 1, Status: 200, Sent: at(750), Returned: at(760)})
	h.Arrivals = append(h.Arrivals, Arrival{Seq: 4, Resource: "q", Token: 1, ID: "d1", Arrived: at(755), Applied: at(756)})
	if r := Check(h); r.Stats.ViolationCounts[RuleStoreDown] != 1 {
		t.Fatalf("a write under a lease granted in the outage was not flagged:\n%s", r)
	}

	for _, n := range []*nemesis{
		{cfg: Config{Mode: ModeRedis}},                  // no Redis of the torture's
		{cfg: Config{Mode: ModePostgres}, rd: &Redis{}}, // another mode
		{cfg: Config{Mode: ModeRedis}, rd: &Redis{}},    // the replica is not running
	} {
		if ok, err := n.injectShutdownRedis(context.Background(), &Fault{Kind: FaultRedisDownInShutdown}, &Replica{}); !ok || !errors.Is(err, errNotApplicable) {
			t.Errorf("%+v: %v %v, want not applicable", n.cfg, ok, err)
		}
	}
	n := &nemesis{cfg: Config{Mode: ModeRedis}, rd: &Redis{}}
	if ok, _ := n.injectShutdownRedis(context.Background(), &Fault{Kind: FaultRestartRedis}, &Replica{}); ok {
		t.Error("redis-down-in-shutdown took the restart-redis fault")
	}
}
