package gateway

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/tokens"
)

// A write or an acquire whose client went while the store was asked is
// counted as abandoned, not as the store's failure (the dashboard's
// "store unavailable" panel), whatever the cut-short store call answered;
// a store that failed a client still there is store_unavailable.
func TestAbandonedIsNotStoreUnavailable(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry(), nil, newInflightAges(0), func() float64 { return 0 })
	count := func(c prometheus.Counter) float64 {
		var d dto.Metric
		if err := c.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetCounter().GetValue()
	}
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	cut := tokens.Unavailable("admit", context.Canceled)

	m.refused(gone, cut)
	m.refused(gone, context.Canceled) // the wait for its shared lock, cut short (tokens.Service.AdmitInto)
	m.refused(t.Context(), tokens.Unavailable("admit", errors.New("connection refused")))
	if a, u, b := count(m.writes[outcomeAbandoned]), count(m.writes[outcomeUnavailable]), count(m.writes[outcomeBadRequest]); a != 2 || u != 1 || b != 0 {
		t.Errorf("writes: %v abandoned, %v store_unavailable and %v bad_request; want 2, 1 and 0", a, u, b)
	}

	m.grant(errors.Join(framing.ErrClientGone, cut)) // as control.AcquireLease wraps it
	m.grant(cut)
	if a, u := count(m.grants["abandoned"]), count(m.grants[tokens.CodeStoreUnavailable]); a != 1 || u != 1 {
		t.Errorf("grants: %v abandoned and %v store_unavailable; want 1 and 1", a, u)
	}
}
