package gateway

// The gateway's Prometheus series, every one registered here (newMetrics):
//
//   - the write counters: fenced writes by outcome, refusals by reason,
//     grants by result, the forward's duration, the writes in flight,
//     writes an observing upstream let through;
//   - the signals an operator is paged on: leases that ran out while their
//     holder was still working, refused renewals and releases, drains, the
//     store's reachability, the oldest write in flight;
//   - the attribution of refused writes to the principal (API key) that
//     presented the lease;
//   - configuration reloads, applied or refused (live.go).
//
// Their names, labels and help text are an interface: the alert rules and
// their tests in deploy/prometheus, the Grafana dashboard and the docs
// rely on them. Every series the write path touches is resolved at start:
// none costs it more than an atomic add (the by-principal counts, on
// refused writes only, take a mutex).
//
// Two kinds of series live beside what they count, each registered with
// it: the holders' clock offsets (fencegw_holder_clock_offset_seconds,
// clock.go) and the Idempotency-Key results (fencegw_idempotent_writes_total,
// idempotency.go).

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/tokens"
)

// Write outcomes, the label values of fencegw_writes_total.
const (
	outcomeForwarded       = "forwarded"
	outcomeRejected        = "rejected"
	outcomeUpstreamError   = "upstream_error"
	outcomeUnknownUpstream = "unknown_upstream"
	outcomeBadRequest      = "bad_request"
	outcomeUnavailable     = "store_unavailable"
	outcomeFenceLost       = "fence_lost" // the fence could not be proven before a send (sendcheck.go)
	outcomeAbandoned       = "abandoned"  // its client went (Go's server cancelled it) while the store was asked or its fence awaited
)

// Causes of a refused renewal or release, the label values of
// fencegw_lease_refusals_total.
const (
	causeExpired    = "expired"    // its time ran out (a newer grant may have followed)
	causeSuperseded = "superseded" // a newer grant took over before it ran out (revoked, then granted)
	causeEnded      = "ended"      // released or revoked, within its time
)

// metrics holds pre-resolved series so the write path does no label lookups.
type metrics struct {
	// forwardedWrites is writes[outcomeForwarded], the one every forwarded
	// write counts, without the map lookup.
	forwardedWrites prometheus.Counter
	writes          map[string]prometheus.Counter
	rejections      map[string]prometheus.Counter
	grants          map[string]prometheus.Counter
	forwardDur      prometheus.Observer
	subs            prometheus.Gauge
	would           *prometheus.CounterVec

	// The operator's signals.
	leaseRefusals map[[2]string]prometheus.Counter // {op, cause}
	lostLive      prometheus.Counter
	drains        prometheus.Counter
	seenMu        sync.Mutex
	seen          map[string]struct{} // leases already counted in lostLive

	byPrincipal *principalCounts

	reloads map[bool]prometheus.Counter // applied (true) or refused
}

// maxSeenLeases bounds the leases remembered so that one that is refused
// twice (a renewal, then a release) counts once; past it the set starts
// over, and a lease may count twice.
const maxSeenLeases = 4096

// newMetrics registers the gateway's series with reg. svc answers the
// store's ping (nil: the store is never up), ages the oldest write in
// flight, inflight the number of writes in flight.
func newMetrics(reg prometheus.Registerer, svc *tokens.Service, ages *inflightAges, inflight func() float64) *metrics {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_writes_total",
		Help: "Fenced writes by outcome: forwarded, rejected (stale/expired/released/unknown lease), upstream_error, unknown_upstream, bad_request, store_unavailable, fence_lost, abandoned (its client went while the store was asked or its fence awaited).",
	}, []string{"outcome"})
	rejections := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_rejections_total",
		Help: "Refused writes by reason (the problem code).",
	}, []string{"reason"})
	grants := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_grants_total",
		Help: "Lease acquisitions by result: " + strings.Join(grantResults, ", ") + ".",
	}, []string{"result"})
	forwardDur := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencegw_forward_duration_seconds",
		Help:    "Time from admission to the upstream's answer for forwarded writes (the shared lock is held that long).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	subs := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencegw_rejection_stream_subscribers",
		Help: "Open live rejection streams.",
	})
	inflightGauge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencegw_inflight_writes",
		Help: "Writes admitted and not yet answered by the upstream.",
	}, inflight)
	would := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_would_refuse_total",
		Help: "Writes to an upstream that only observes (--observe) that an enforcing one would have refused, by upstream and reason (the problem code). They were forwarded: nothing was blocked.",
	}, []string{"upstream", "reason"})
	reg.MustRegister(writes, rejections, grants, forwardDur, subs, inflightGauge, would)

	leaseRefusals := prometheus.NewCounterVec(prometheus.CounterOpts{
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
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fencegw_drains_pending",
		Help: "Drain periods of unknown outcomes this replica is still keeping: each holds its resource's fence until the store has recorded it or it has passed. Above 0 for more than a moment: the store refuses to record drains.",
	}, func() float64 {
		if svc == nil {
			return 0
		}
		return float64(svc.Draining())
	})
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_config_reloads_total",
		Help: "Configuration reloads (SIGHUP, or a configuration, auth, certificate or key file replaced) by result: ok (applied as a whole) or error (refused: the configuration before it stays).",
	}, []string{"result"})
	reg.MustRegister(leaseRefusals, lostLive, drains, storeUp, oldest, pending, reloads)

	m := &metrics{
		writes:        map[string]prometheus.Counter{},
		rejections:    map[string]prometheus.Counter{},
		grants:        map[string]prometheus.Counter{},
		forwardDur:    forwardDur,
		subs:          subs,
		would:         would,
		leaseRefusals: map[[2]string]prometheus.Counter{},
		lostLive:      lostLive,
		drains:        drains,
		seen:          map[string]struct{}{},
		byPrincipal:   newPrincipalCounts(reg),
		reloads:       map[bool]prometheus.Counter{true: reloads.WithLabelValues("ok"), false: reloads.WithLabelValues("error")},
	}
	for _, o := range []string{outcomeForwarded, outcomeRejected, outcomeUpstreamError, outcomeUnknownUpstream, outcomeBadRequest, outcomeUnavailable, outcomeFenceLost, outcomeAbandoned} {
		m.writes[o] = writes.WithLabelValues(o)
	}
	for _, c := range tokens.RejectionCodes {
		m.rejections[c] = rejections.WithLabelValues(c)
	}
	m.forwardedWrites = m.writes[outcomeForwarded]
	for _, r := range grantResults {
		m.grants[r] = grants.WithLabelValues(r)
	}
	for _, op := range []string{"renew", "release"} {
		for _, c := range []string{causeExpired, causeSuperseded, causeEnded} {
			m.leaseRefusals[[2]string{op, c}] = leaseRefusals.WithLabelValues(op, c)
		}
	}
	return m
}

func (m *metrics) write(outcome string) { m.writes[outcome].Inc() }

// wouldRefuse counts a write to an observing upstream that Admit let
// through with the refusal an enforcing one would have given.
func (m *metrics) wouldRefuse(upstream string, refusal error) {
	p, _ := problemFor(refusal)
	m.would.WithLabelValues(upstream, p.Code).Inc()
}

// refused counts a write turned down with err while serving the request
// whose context is ctx.
func (m *metrics) refused(ctx context.Context, err error) {
	p, _ := problemFor(err)
	if c, ok := m.rejections[p.Code]; ok {
		c.Inc()
		m.writes[outcomeRejected].Inc()
		return
	}
	if errors.Is(ctx.Err(), context.Canceled) && (errors.Is(err, tokens.ErrStoreUnavailable) || errors.Is(err, context.Canceled)) {
		// The client's going cut the store call, or the wait for the
		// write's fence, short (a write Go's server serves: the loop never
		// cancels one): neither the store's failure nor a bad request.
		m.writes[outcomeAbandoned].Inc()
		return
	}
	if errors.Is(err, tokens.ErrStoreUnavailable) {
		m.writes[outcomeUnavailable].Inc()
		return
	}
	m.writes[outcomeBadRequest].Inc()
}

// refusedBy counts a refused write by the principal that presented the
// lease, under the problem code it got, if that is a rejection code (see
// principalCounts).
func (m *metrics) refusedBy(principal string, err error) {
	if pr, _ := problemFor(err); slices.Contains(tokens.RejectionCodes, pr.Code) {
		m.byPrincipal.count(principal, pr.Code)
	}
}

func (m *metrics) forwarded(f *forward, d time.Duration) {
	if f.unknown {
		m.drains.Inc() // Permit.Done(OutcomeUnknown) put the resource in a drain period
	}
	if f.failed {
		if f.fenceLost.Load() {
			m.writes[outcomeFenceLost].Inc()
			return
		}
		if f.badRequest {
			m.writes[outcomeBadRequest].Inc()
			return
		}
		m.writes[outcomeUpstreamError].Inc()
		return
	}
	m.forwardedWrites.Inc()
	m.forwardDur.Observe(d.Seconds())
}

// grantResults are the values of fencegw_grants_total's result label; its
// help text lists them from here.
var grantResults = []string{"granted", tokens.CodeLeaseHeld, tokens.CodeFenceBusy, tokens.CodeStoreUnavailable, tokens.CodeInvalidRequest, "abandoned", "other"}

func (m *metrics) grant(err error) {
	if err == nil {
		m.grants["granted"].Inc()
		return
	}
	if errors.Is(err, framing.ErrClientGone) {
		m.grants["abandoned"].Inc() // its client went: not the store's failure
		return
	}
	p, _ := problemFor(err)
	if c, ok := m.grants[p.Code]; ok {
		c.Inc()
		return
	}
	m.grants["other"].Inc()
}

// leaseRefused counts a renewal or release (op) of leaseID that the store
// refused with err, at now (the gateway's clock).
func (m *metrics) leaseRefused(op, leaseID string, err error, now time.Time) {
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
	m.leaseRefusals[[2]string{op, cause}].Inc()
	if cause != causeExpired {
		return
	}
	m.seenMu.Lock()
	_, dup := m.seen[leaseID]
	if !dup {
		if len(m.seen) >= maxSeenLeases {
			clear(m.seen)
		}
		m.seen[leaseID] = struct{}{}
	}
	m.seenMu.Unlock()
	if !dup {
		m.lostLive.Inc()
	}
}

// Attribution: every refused write is recorded with the
// principal that presented the lease (tokens.Rejection.Principal, shown by
// the API, the stream and the dashboard), and counted by principal here.
// Principals are the API keys of the auth file, so the series are bounded
// by the configuration; maxPrincipalSeries caps them anyway (a key file of
// thousands of keys must not make thousands of series per reason), and
// later principals are counted as "(other)". Writes without authentication
// count under principal="".

const (
	maxPrincipalSeries = 64
	otherPrincipal     = "(other)"
)

// principalCounts is fencegw_rejections_by_principal_total, its series
// capped at maxPrincipalSeries principals.
type principalCounts struct {
	vec   *prometheus.CounterVec
	mu    sync.Mutex
	known map[string]struct{}
	c     map[[2]string]prometheus.Counter // principal, reason
}

func newPrincipalCounts(reg prometheus.Registerer) *principalCounts {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_rejections_by_principal_total",
		Help: "Refused writes by the API key that presented the lease (\"\" without authentication; at most 64 keys, then \"(other)\") and reason.",
	}, []string{"principal", "reason"})
	reg.MustRegister(vec)
	return &principalCounts{vec: vec, known: map[string]struct{}{}, c: map[[2]string]prometheus.Counter{}}
}

func (p *principalCounts) count(principal, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.known[principal]; !ok {
		if len(p.known) >= maxPrincipalSeries {
			principal = otherPrincipal
		} else {
			p.known[principal] = struct{}{}
		}
	}
	k := [2]string{principal, reason}
	c, ok := p.c[k]
	if !ok {
		c = p.vec.WithLabelValues(principal, reason)
		p.c[k] = c
	}
	c.Inc()
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
