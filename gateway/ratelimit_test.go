package gateway

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// sharedRates is a RateStore that answers as told, or, when hang is set,
// not until the test ends, whatever its context says (a Redis client
// bounds reads by its own timeout, not the context's deadline).
type sharedRates struct {
	ok   bool
	wait time.Duration
	err  error
	hang chan struct{}
	hung chan struct{} // a take is waiting on hang

	mu    sync.Mutex
	calls []take // each take's key, rate and burst
}

func (s *sharedRates) Take(_ context.Context, key string, rate float64, burst int) (bool, time.Duration, error) {
	s.mu.Lock()
	s.calls = append(s.calls, take{key, rate, burst})
	s.mu.Unlock()
	if s.hang != nil {
		s.hung <- struct{}{}
		<-s.hang
		return false, 0, errors.New("read timeout")
	}
	return s.ok, s.wait, s.err
}

func (s *sharedRates) takes() []take {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
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
		{"store does not answer", &sharedRates{hang: make(chan struct{}), hung: make(chan struct{}, 1)}, limited, false, 42 * time.Second, 1, 1},
		{"key without a rate", &sharedRates{ok: true}, &Principal{Name: "free"}, false, 42 * time.Second, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.store.hang != nil {
				t.Cleanup(func() { close(c.store.hang) })
			}
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
			if c.store.hang != nil {
				<-c.store.hung // the take allow gave up on did start
			}
			takes := c.store.takes()
			if c.p.Rate > 0 && (len(takes) != 1 || takes[0] != take{"billing", 2.5, 7}) {
				t.Errorf("takes %+v, want one of billing at 2.5/s, burst 7", takes)
			}
			if c.p.Rate == 0 && len(takes) != 0 {
				t.Errorf("a key without a rate paid %d round trips", len(takes))
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
