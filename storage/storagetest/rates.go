package storagetest

// The conformance suite of the API keys' shared request budgets
// (gateway.RateStore), run on every store that keeps them for many
// replicas: PostgreSQL and Redis.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// RateTaker is the store side of gateway.RateStore (storagetest imports
// no gateway).
type RateTaker interface {
	Take(ctx context.Context, key string, rate float64, burst int) (ok bool, retryAfter time.Duration, err error)
}

// RateHarness opens the stores under test.
type RateHarness struct {
	// Replicas opens two stores that share their buckets, as two replicas
	// of one deployment do, and share nothing with any other test's.
	Replicas func(t *testing.T) (a, b RateTaker)
}

// slowRate refills one token in over a quarter of an hour: no test here
// runs long enough to see one, so counts of granted takes are exact.
const slowRate = 0.001

// RunRates runs the rate-limit suite.
func RunRates(t *testing.T, h RateHarness) {
	t.Run("BurstThenRefusalAcrossReplicas", func(t *testing.T) { t.Parallel(); testRateBurst(t, h) })
	t.Run("ConcurrentTakesNeverOvershoot", func(t *testing.T) { t.Parallel(); testRateConcurrent(t, h) })
	t.Run("RefillsWithTime", func(t *testing.T) { t.Parallel(); testRateRefill(t, h) })
	t.Run("EachCallsLimitsApply", func(t *testing.T) { t.Parallel(); testRateReload(t, h) })
}

func take(t *testing.T, s RateTaker, key string, rate float64, burst int) (bool, time.Duration) {
	t.Helper()
	ok, wait, err := s.Take(t.Context(), key, rate, burst)
	if err != nil {
		t.Fatalf("Take(%s, %v, %d): %v", key, rate, burst, err)
	}
	if ok && wait != 0 {
		t.Fatalf("Take(%s) granted with a retryAfter of %v", key, wait)
	}
	return ok, wait
}

// testRateBurst: takes alternating between two replicas get the burst
// between them, then a refusal saying how long until the next token;
// another key's bucket is its own.
func testRateBurst(t *testing.T, h RateHarness) {
	a, b := h.Replicas(t)
	key := resourceName(t, "key")
	for i := range 4 {
		s := []RateTaker{a, b}[i%2]
		if ok, _ := take(t, s, key, slowRate, 4); !ok {
			t.Fatalf("take %d of a burst of 4 refused", i+1)
		}
	}
	for i, s := range []RateTaker{a, b} {
		ok, wait := take(t, s, key, slowRate, 4)
		if ok {
			t.Fatalf("replica %d: a take past the burst was granted", i)
		}
		if wait <= 0 || wait > time.Duration(float64(time.Second)/slowRate) {
			t.Fatalf("replica %d: retryAfter %v, want in (0, %v]", i, wait, time.Duration(float64(time.Second)/slowRate))
		}
	}
	if ok, _ := take(t, b, resourceName(t, "other"), slowRate, 1); !ok {
		t.Fatal("another key's first take was refused")
	}
}

// testRateConcurrent: concurrent takes on two replicas grant exactly the
// burst, never more.
func testRateConcurrent(t *testing.T, h RateHarness) {
	a, b := h.Replicas(t)
	key := resourceName(t, "key")
	const burst, takers = 10, 40
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range takers {
		s := []RateTaker{a, b}[i%2]
		wg.Go(func() {
			ok, _, err := s.Take(t.Context(), key, slowRate, burst)
			if err != nil {
				t.Errorf("Take: %v", err)
			}
			if ok {
				granted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := granted.Load(); got != burst {
		t.Fatalf("%d concurrent takes granted %d, want the burst, %d", takers, got, burst)
	}
}

// testRateRefill: an empty bucket refills by the store's clock, and a
// refusal's retryAfter is at most one token's time.
func testRateRefill(t *testing.T, h RateHarness) {
	a, b := h.Replicas(t)
	key := resourceName(t, "key")
	const rate = 4.0
	if ok, _ := take(t, a, key, rate, 1); !ok {
		t.Fatal("first take refused")
	}
	// Poll the other replica until the bucket has a token again; each
	// refusal in between says it will within a token's time.
	waitUntil(t, 10*time.Second, "a token refilled", func() bool {
		ok, wait := take(t, b, key, rate, 1)
		if !ok && (wait <= 0 || wait > time.Second/rate) {
			t.Fatalf("retryAfter %v, want in (0, %v]", wait, time.Second/rate)
		}
		return ok
	})
}

// testRateReload: the bucket keeps no limits of its own; a lowered burst
// (a reloaded auth file) cuts what is saved up at the next take.
func testRateReload(t *testing.T, h RateHarness) {
	a, b := h.Replicas(t)
	key := resourceName(t, "key")
	if ok, _ := take(t, a, key, slowRate, 5); !ok { // 4 left
		t.Fatal("first take refused")
	}
	for i := range 2 { // burst 2 now: 4 cut to 2, and both taken
		if ok, _ := take(t, b, key, slowRate, 2); !ok {
			t.Fatalf("take %d under the lowered burst refused", i+1)
		}
	}
	if ok, _ := take(t, a, key, slowRate, 2); ok {
		t.Fatal("a take past the lowered burst was granted")
	}
}
