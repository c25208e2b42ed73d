package gateway

// A key's request rate across replicas: in the replicated modes each
// request of a key with a rate takes from one bucket in the store
// (RateStore), so two replicas do not let a key through at twice its rate;
// when the store does not answer in time, the key's bucket in this process
// decides (Authenticator.Allow), and fencegw_rate_fallbacks_total counts it.

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RateStore takes from request budgets that every replica shares: one
// token bucket per key name, refilled by the store's clock, taken in one
// atomic step there (storage/postgres, storage/redis).
type RateStore interface {
	// Take refills key's bucket at rate tokens a second up to burst and
	// takes one token. ok is false when there is none, and retryAfter then
	// says how long until there is. The bucket keeps no rate or burst of
	// its own: each call's apply, so a reload's take effect at once.
	Take(ctx context.Context, key string, rate float64, burst int) (ok bool, retryAfter time.Duration, err error)
}

// Bounds of the shared take: a request waits this long at most for the
// store before its key's local bucket decides; and a store that keeps
// failing is logged once per rateFallbackLogEvery, not once per request.
const (
	rateTakeTimeout      = 250 * time.Millisecond
	rateFallbackLogEvery = 5 * time.Second
)

// rateLimiter meters authenticated callers: by the shared bucket when
// there is a RateStore and the key has a rate, else by the local one.
type rateLimiter struct {
	store     RateStore // nil: the local buckets are exact (one replica)
	fallbacks prometheus.Counter
	lastLog   atomic.Int64 // unix nanoseconds of the last fallback logged
}

func newRateLimiter(store RateStore, reg prometheus.Registerer) *rateLimiter {
	l := &rateLimiter{store: store, fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencegw_rate_fallbacks_total",
		Help: "Requests metered by their key's per-replica bucket because the store's shared rate limit did not answer in time.",
	})}
	reg.MustRegister(l.fallbacks)
	return l
}

// allow takes one request from p's budget. A store that fails or is slow
// never fails the request: the limiter is not worth an outage, and the
// local bucket still bounds the key per replica.
func (g *Gateway) allow(ctx context.Context, keys Authenticator, p *Principal) (bool, time.Duration) {
	l := g.rates
	if l.store == nil || p.Rate <= 0 {
		return keys.Allow(p)
	}
	ctx, cancel := context.WithTimeout(ctx, rateTakeTimeout)
	defer cancel()
	// The take runs beside the request, which waits for it only until the
	// deadline: not every client stops at its context's deadline (go-redis
	// bounds a read by its own ReadTimeout unless ContextTimeoutEnabled),
	// and the take left behind ends within the client's own bounds.
	type taken struct {
		ok   bool
		wait time.Duration
		err  error
	}
	done := make(chan taken, 1)
	go func() {
		ok, wait, err := l.store.Take(ctx, p.Name, p.Rate, p.Burst)
		done <- taken{ok, wait, err}
	}()
	var err error
	select {
	case t := <-done:
		if t.err == nil {
			return t.ok, t.wait
		}
		err = t.err
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.fallbacks.Inc()
	now := time.Now().UnixNano()
	if last := l.lastLog.Load(); now-last >= int64(rateFallbackLogEvery) && l.lastLog.CompareAndSwap(last, now) {
		g.log.Warn("shared rate limit unavailable: keys are metered per replica until the store answers",
			"key", p.Name, "err", err)
	}
	return keys.Allow(p)
}
