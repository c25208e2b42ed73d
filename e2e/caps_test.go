package e2e

// The lease cap of a key (max_leases) under concurrent acquires, through
// the HTTP API, with the acquires spread over two replicas that share one
// store.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// TestLeaseCapAcrossReplicas sends n acquires of n resources at once with
// the capped key (max_leases: 1), for leases that outlast the burst,
// alternately to two gateways on one
// PostgreSQL schema (and one Redis prefix): exactly one is granted, every
// other is 429 too_many_leases with Retry-After (or, on a loaded machine,
// 503 fence_busy: then none may be granted, never two). The embedded mode
// has one gateway, which gets them all.
func TestLeaseCapAcrossReplicas(t *testing.T) {
	modes := []struct {
		name  string
		start func(t *testing.T, ups map[string]string) []*gw
	}{
		{"embedded", func(t *testing.T, ups map[string]string) []*gw {
			return []*gw{startSecureEmbedded(t, ups, secureOptions{})}
		}},
		{"postgres", func(t *testing.T, ups map[string]string) []*gw {
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			var gws []*gw
			for i := range 2 {
				gws = append(gws, startSecure(t, pgMode(t, storagemode.Config{Schema: schema}, i), ups, secureOptions{}))
			}
			return gws
		}},
		{"postgres-redis", func(t *testing.T, ups map[string]string) []*gw {
			pgtest.Require(t)
			requireRedis(t)
			schema := pgtest.NewSchema(t)
			var gws []*gw
			for i := range 2 {
				cfg := storagemode.Config{Schema: schema, Redis: redisURL(), RedisPrefix: "fencegw-e2e-cap:" + schema + ":"}
				gws = append(gws, startSecure(t, pgMode(t, cfg, i), ups, secureOptions{}))
			}
			return gws
		}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			up := newUpstream(t)
			gws := m.start(t, map[string]string{"statements": up.URL})
			for _, n := range []int{20, 200} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					answers := acquireAtOnce(t, gws, n)
					var granted []string
					busy := 0
					for i, a := range answers {
						switch {
						case a.err != nil:
							t.Fatalf("acquire %d: %v", i, a.err)
						case a.status == http.StatusCreated:
							granted = append(granted, a.leaseID)
						case a.status == http.StatusServiceUnavailable && a.code == "fence_busy" && a.retryAfter != "":
							// A grant that waited past --grant-wait for
							// the resource's fence (a loaded machine, 200
							// grants queued on the store's connections):
							// not granted, and said so.
							busy++
						case a.status != http.StatusTooManyRequests || a.code != "too_many_leases" || a.retryAfter == "":
							t.Fatalf("acquire %d: %d %q (Retry-After %q), want 201, 429 too_many_leases or 503 fence_busy, with Retry-After", i, a.status, a.code, a.retryAfter)
						}
					}
					// Released first (on either replica), so that the next burst
					// finds the slot free whatever this one found.
					for _, id := range granted {
						if rel := do(t, "DELETE", gws[len(gws)-1].URL+"/v1/leases/"+id, nil, bearer(keyCapped)...); rel.Status != http.StatusNoContent {
							t.Fatalf("release: %d %s", rel.Status, rel.Body)
						}
					}
					if busy > 0 {
						t.Logf("%d of %d acquires answered fence_busy", busy, n)
					}
					// Never more than the cap; fewer only if a grant gave
					// up waiting (the one that would have had the slot).
					if len(granted) > 1 || len(granted) == 0 && busy == 0 {
						t.Fatalf("%d concurrent acquires over %d replicas under max_leases 1: %d granted (%d fence_busy), want exactly 1", n, len(gws), len(granted), busy)
					}
				})
			}
		})
	}
}

type capAnswer struct {
	status     int
	code       string
	retryAfter string
	leaseID    string
	err        error
}

// acquireAtOnce sends n acquires of n resources with the capped key, the
// i-th to gws[i%len(gws)], all released at once.
func acquireAtOnce(t *testing.T, gws []*gw, n int) []capAnswer {
	t.Helper()
	out := make([]capAnswer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		body, _ := json.Marshal(map[string]any{"resource": fmt.Sprintf("stmt:cap/%s/%d", t.Name(), i), "holder": "h", "ttl_ms": time.Minute.Milliseconds()})
		wg.Go(func() {
			<-start
			out[i] = postLease(t.Context(), gws[i%len(gws)].URL, body)
		})
	}
	close(start)
	wg.Wait()
	return out
}

func postLease(ctx context.Context, base string, body []byte) capAnswer {
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/leases", bytes.NewReader(body))
	if err != nil {
		return capAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+keyCapped)
	resp, err := httpClient.Do(req)
	if err != nil {
		return capAnswer{err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return capAnswer{err: err}
	}
	var fields struct {
		Code    string `json:"code"`
		LeaseID string `json:"lease_id"`
	}
	if err := json.Unmarshal(data, &fields); err != nil {
		return capAnswer{err: fmt.Errorf("%d %q: %w", resp.StatusCode, data, err)}
	}
	return capAnswer{status: resp.StatusCode, code: fields.Code, retryAfter: resp.Header.Get("Retry-After"), leaseID: fields.LeaseID}
}
