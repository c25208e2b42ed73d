package gateway

import (
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	drains          prometheus.Counter // fencegw_drains_total (signals.go)
	would           *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, inflight func() float64) *metrics {
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencegw_writes_total",
		Help: "Fenced writes by outcome: forwarded, rejected (stale/expired/released/unknown lease), upstream_error, unknown_upstream, bad_request, store_unavailable, fence_lost.",
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

	m := &metrics{
		writes:     map[string]prometheus.Counter{},
		rejections: map[string]prometheus.Counter{},
		grants:     map[string]prometheus.Counter{},
		forwardDur: forwardDur,
		subs:       subs,
		would:      would,
	}
	for _, o := range []string{outcomeForwarded, outcomeRejected, outcomeUpstreamError, outcomeUnknownUpstream, outcomeBadRequest, outcomeUnavailable, outcomeFenceLost} {
		m.writes[o] = writes.WithLabelValues(o)
	}
	for _, c := range tokens.RejectionCodes {
		m.rejections[c] = rejections.WithLabelValues(c)
	}
	m.forwardedWrites = m.writes[outcomeForwarded]
	for _, r := range grantResults {
		m.grants[r] = grants.WithLabelValues(r)
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

// refused counts a write that Admit turned down.
func (m *metrics) refused(err error) {
	p, _ := problemFor(err)
	if c, ok := m.rejections[p.Code]; ok {
		c.Inc()
		m.writes[outcomeRejected].Inc()
		return
	}
	if errors.Is(err, tokens.ErrUnavailable) {
		m.writes[outcomeUnavailable].Inc()
		return
	}
	m.writes[outcomeBadRequest].Inc()
}

func (m *metrics) forwarded(f *forward, d time.Duration) {
	if f.unknown && m.drains != nil {
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
var grantResults = []string{"granted", tokens.CodeLeaseHeld, tokens.CodeFenceBusy, tokens.CodeStoreUnavailable, tokens.CodeInvalidRequest, "other"}

func (m *metrics) grant(err error) {
	if err == nil {
		m.grants["granted"].Inc()
		return
	}
	p, _ := problemFor(err)
	if c, ok := m.grants[p.Code]; ok {
		c.Inc()
		return
	}
	m.grants["other"].Inc()
}
