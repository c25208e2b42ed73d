package e2e

// A key's request rate holds across replicas: in the replicated modes
// every replica takes from the key's one bucket in the store.

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/gateway"
	"github.com/fencegw/fencegw/replica"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// A key with rate 1/s and burst 5 sends 20 requests at once, half to each of
// two replicas: together they let through its burst and what the time
// taken refilled, not a burst each; the rest are 429 rate_limited with
// Retry-After. A take the store does not answer within its bound falls
// back to the replica's own bucket, by design (rate_fallback_test.go), and
// says so in fencegw_rate_fallbacks_total: an attempt that met one (a
// loaded machine) proves nothing about sharing and is made again with a
// fresh key, at most three times.
func TestRateSharedAcrossReplicas(t *testing.T) {
	const rate, burst, requests, attempts = 1.0, 5, 20, 3
	const scraperKey = "fgk_test-shared-rate-scraper"
	authFile := fmt.Appendf(nil, "keys:\n  - {name: scraper, sha256: %s, role: viewer}\n", auth.Hash(scraperKey))
	for i := range attempts {
		authFile = fmt.Appendf(authFile, "  - {name: shared-%d, sha256: %s, role: worker, rate: %v, burst: %d}\n",
			i, auth.Hash(sharedRateKey(i)), rate, burst)
	}
	for _, m := range sharedStoreModes("fencegw-e2e-rate:") {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			gws := startKeyedReplicas(t, authFile, m.config(t, schema))
			for i := range attempts {
				before := rateFallbacks(t, gws[0], scraperKey) + rateFallbacks(t, gws[1], scraperKey)
				// All at once, half on each replica: the shared take must
				// hold under concurrency, not only in sequence. The answers
				// are judged on the test's goroutine.
				byReplica, took := sendAtOnce(t, gws, sharedRateKey(i), requests/2, 30*time.Second)
				ok := judgeRateAnswers(t, byReplica[0]) + judgeRateAnswers(t, byReplica[1])
				if fell := rateFallbacks(t, gws[0], scraperKey) + rateFallbacks(t, gws[1], scraperKey) - before; fell > 0 {
					t.Logf("attempt %d: %v takes fell back to a replica's own bucket (the store answered too late); again with a fresh key", i+1, fell)
					continue
				}
				// The burst, and what refilled while the requests went
				// out, rounded up: 6 when they take under a second, where a
				// bucket per replica would let through 10.
				most := burst + int(math.Ceil(took.Seconds()*rate))
				t.Logf("%d of %d requests let through in %v", ok, requests, took.Round(time.Millisecond))
				if ok < burst || ok > most {
					t.Fatalf("%d of %d requests over two replicas let through in %v; want the burst, %d, and at most %d",
						ok, requests, took.Round(time.Millisecond), burst, most)
				}
				return
			}
			t.Fatalf("in each of %d attempts the store answered a take too late for the shared bucket to be tested", attempts)
		})
	}
}

// sharedRateKey is the key of TestRateSharedAcrossReplicas' attempt i.
func sharedRateKey(i int) string { return fmt.Sprintf("fgk_test-shared-rate-%d", i) }

// startKeyedReplicas starts two replicas on one store (cfg), each with the
// keys of authFile read by itself, as separate processes do: one Keys would
// share its rate buckets.
func startKeyedReplicas(t *testing.T, authFile []byte, cfg storagemode.Config) []*gw {
	t.Helper()
	var gws []*gw
	for i := range 2 {
		keys, err := auth.Parse(authFile)
		if err != nil {
			t.Fatal(err)
		}
		gws = append(gws, startReplica(t, replica.Config{
			Mode: pgMode(t, cfg, i),
			Live: gateway.Live{Auth: keys.Keys},
		}))
	}
	return gws
}
