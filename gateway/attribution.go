package gateway

import (
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/tokens"
)

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

// refused counts a refused write by principal under the problem code it
// got, if that is a rejection code.
func (p *principalCounts) refused(principal string, err error) {
	if pr, _ := problemFor(err); slices.Contains(tokens.RejectionCodes, pr.Code) {
		p.count(principal, pr.Code)
	}
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
