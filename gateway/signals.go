package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/tokens"
)

// The signals an operator is paged on, beyond the write counters of
// metrics.go: leases that ran out while their holder was still working,
// refused renewals and releases, drains, the store's reachability, the
// oldest write in flight. None of them costs the write path more than an
// atomic add on a series resolved at start.

// Causes of a refused renewal or release, the label values of
// fencegw_lease_refusals_total.
const (
	causeExpired    = "expired"    // its time ran out (a newer grant may have followed)
	causeSuperseded = "superseded" // a newer grant took over before it ran out (revoked, then granted)
	causeEnded      = "ended"      // released or revoked, within its time
)

type signals struct {
	refusals map[[2]string]prometheus.Counter // {op, cause}
	lostLive prometheus.Counter
	drains   prometheus.Counter
	ages     *inflightAges

	seenMu sync.Mutex
	seen   map[string]struct{} // leases already counted in lostLive
}

// maxSeenLeases bounds the leases remembered so that one that is refused
// twice (a renewal, then a release) counts once; past it the set starts
// over, and a lease may count twice.
const maxSeenLeases = 4096

func newSignals(reg prometheus.Registerer, svc *tokens.Service, ages *inflightAges) *signals {
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_lease_refusals_total",
		Help: "Renewals and releases refused with lease_lost, by op (renew, release) and cause: expired (its time ran out), superseded (a newer grant before it ran out), ended (released or revoked).",
	}, []string{"op", "cause"})
	lostLive := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencegw_leases_expired_while_held_total",
		Help: "Leases that ended by expiry while their holder was still working: the holder's renewal or release came after the lease ran out and was refused. Counted once per lease (per replica).",
	})
	drains := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencegw_drains_total",
		Help: "Drain periods started because a forwarded write's outcome was unknown (upstream timeout, broken connection): the resource is closed to grants for the drain period.",
	})
	storeUp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencegw_store_up",
		Help: "1 if the token store answered a ping at scrape time (within 1 s), 0 if not: writes and grants fail closed with 503 store_unavailable.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if svc == nil || svc.Ping(ctx) != nil {
			return 0
		}
		return 1
	})
	oldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencegw_inflight_oldest_seconds",
		Help: "Age of the oldest write admitted and not yet answered, to the second (0: none in flight). A grant of its resource waits for it.",
	}, func() float64 { return ages.oldest(time.Now()).Seconds() })
	reg.MustRegister(refusals, lostLive, drains, storeUp, oldest)
	s := &signals{refusals: map[[2]string]prometheus.Counter{}, lostLive: lostLive, drains: drains, ages: ages, seen: map[string]struct{}{}}
	for _, op := range []string{"renew", "release"} {
		for _, c := range []string{causeExpired, causeSuperseded, causeEnded} {
			s.refusals[[2]string{op, c}] = refusals.WithLabelValues(op, c)
		}
	}
	return s
}

// leaseRefused counts a renewal or release (op) of leaseID that the store
// refused with err, at now (the gateway's clock).
func (s *signals) leaseRefused(op, leaseID string, err error, now time.Time) {
	if !errors.Is(err, tokens.ErrLeaseLost) {
		return
	}
	cause := causeEnded
	if f := tokens.ErrorOf(err); f != nil {
		switch {
		case !f.ExpiresAt.IsZero() && !now.Before(f.ExpiresAt):
			cause = causeExpired
		case f.CurrentToken > f.Token:
			cause = causeSuperseded
		}
	}
	s.refusals[[2]string{op, cause}].Inc()
	if cause != causeExpired {
		return
	}
	s.seenMu.Lock()
	_, dup := s.seen[leaseID]
	if !dup {
		if len(s.seen) >= maxSeenLeases {
			clear(s.seen)
		}
		s.seen[leaseID] = struct{}{}
	}
	s.seenMu.Unlock()
	if !dup {
		s.lostLive.Inc()
	}
}

// inflightAges counts writes in flight by the second they were admitted,
// in a ring of seconds longer than any write can stay in flight (its
// answer is bounded by the forward timeout plus the body timeout), so that
// a slot only ever holds writes of one second. Begin and end are one
// atomic add each.
type inflightAges struct {
	slots []atomic.Int64
}

func newInflightAges(longest time.Duration) *inflightAges {
	return &inflightAges{slots: make([]atomic.Int64, int(longest/time.Second)+3)}
}

// begin counts a write admitted at t and returns its slot for end.
func (a *inflightAges) begin(t time.Time) int {
	i := int(t.Unix() % int64(len(a.slots)))
	a.slots[i].Add(1)
	return i
}

// end counts the write of slot as answered.
func (a *inflightAges) end(slot int) { a.slots[slot].Add(-1) }

// oldest is the age, to the second, of the oldest write in flight at now.
func (a *inflightAges) oldest(now time.Time) time.Duration {
	n := int64(len(a.slots))
	sec := now.Unix()
	for back := n - 1; back >= 0; back-- {
		if a.slots[(sec-back)%n].Load() > 0 {
			return time.Duration(back) * time.Second
		}
	}
	return 0
}
