package gateway

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sharedRates is a RateStore that answers as told, or waits out the
// caller's deadline when hang is set.
type sharedRates struct {
	ok    bool
	wait  time.Duration
	err   error
	hang  bool
	calls []take // each take's key, rate and burst
}

func (s *sharedRates) Take(ctx context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	s.calls = append(s.calls, take{key, rate, burst})
	if s.hang {
		<-ctx.Done()
		return false, 0, ctx.Err()
	}
	return s.ok, s.wait, s.err
}

type take struct {
	key   string
	rate  float64
	burst int
}

// localRates is a key's per-replica bucket that refuses, so that a test
// sees which of the two decided.
type localRates struct{ calls int }

func (l *localRates) Authenticate(*http.Request) (*Principal, error) { return nil, ErrUnauthenticated }
func (l *localRates) Allow(*Principal) (bool, time.Duration) {
	l.calls++
	return false, 42 * time.Second
}

// A key with a rate is metered by the shared store; the local bucket
// decides only for keys without a rate and when the store fails or does
// not answer within the deadline, which is counted.
func TestSharedRateAndItsFallback(t *testing.T) {
	limited := &Principal{Name: "billing", Rate: 2.5, Burst: 7}
	cases := []struct {
		name       string
		store      *sharedRates
		p          *Principal
		ok         bool
		wait       time.Duration
		localCalls int
		fallbacks  float64
	}{
		{"store grants", &sharedRates{ok: true}, limited, true, 0, 0, 0},
		{"store refuses", &sharedRates{wait: 3 * time.Second}, limited, false, 3 * time.Second, 0, 0},
		{"store fails", &sharedRates{err: errors.New("connection refused")}, limited, false, 42 * time.Second, 1, 1},
		{"store does not answer", &sharedRates{hang: true}, limited, false, 42 * time.Second, 1, 1},
		{"key without a rate", &sharedRates{ok: true}, &Principal{Name: "free"}, false, 42 * time.Second, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			g := New(nil, Config{Rates: c.store, Registry: reg})
			local := &localRates{}
			ok, wait := g.allow(t.Context(), local, c.p)
			if ok != c.ok || wait != c.wait {
				t.Errorf("allow = %v, %v; want %v, %v", ok, wait, c.ok, c.wait)
			}
			if local.calls != c.localCalls {
				t.Errorf("the local bucket decided %d times, want %d", local.calls, c.localCalls)
			}
			if got := counterValue(t, reg, "fencegw_rate_fallbacks_total"); got != c.fallbacks {
				t.Errorf("fencegw_rate_fallbacks_total = %v, want %v", got, c.fallbacks)
			}
			if c.p.Rate > 0 && (len(c.store.calls) != 1 || c.store.calls[0] != take{"billing", 2.5, 7}) {
				t.Errorf("takes %+v, want one of billing at 2.5/s, burst 7", c.store.calls)
			}
			if c.p.Rate == 0 && len(c.store.calls) != 0 {
				t.Errorf("a key without a rate paid %d round trips", len(c.store.calls))
			}
		})
	}
}

// counterValue reads an unlabelled counter as /metrics serves it.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}
