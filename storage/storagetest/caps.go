package storagetest

// The store suite's tests of an owner's cap on live leases: enforced under
// concurrent grants, and freed as leases end.

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// ownerName returns an owner unique to the test and the run, so that
// backends whose stores share data across tests count nobody else's leases.
func ownerName(t *testing.T, suffix string) string { return "owner/" + resourceName(t, suffix) }

func capped(owner, resource string, max int, ttl time.Duration) tokens.GrantRequest {
	return tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "h", Owner: owner, MaxLeases: max, TTL: ttl}
}

// testOwnerCapConcurrent: n grants of n different resources, sent at once by
// one owner under a cap, grant exactly the cap; the others are refused with
// ErrTooManyLeases, and a grant of another owner is not.
func testOwnerCapConcurrent(t *testing.T, h Harness) {
	s := h.Open(t)
	for _, tc := range []struct{ max, n int }{{1, 20}, {1, 200}, {3, 20}, {3, 200}} {
		t.Run(fmt.Sprintf("cap%d_of_%d", tc.max, tc.n), func(t *testing.T) {
			owner := ownerName(t, "o")
			start := make(chan struct{})
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				granted []tokens.Lease
				refused int
				failed  []error
			)
			for i := range tc.n {
				wg.Go(func() {
					<-start
					l, err := s.Grant(t.Context(), capped(owner, resourceName(t, fmt.Sprint(i)), tc.max, longTTL))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						granted = append(granted, l)
					case errors.Is(err, tokens.ErrTooManyLeases):
						if f := tokens.ErrorOf(err); f == nil || f.RetryAfter <= 0 {
							failed = append(failed, fmt.Errorf("refusal without Retry-After: %v", err))
						}
						refused++
					default:
						failed = append(failed, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if len(failed) > 0 {
				t.Fatalf("%d grants failed otherwise, first: %v", len(failed), failed[0])
			}
			if len(granted) != tc.max || refused != tc.n-tc.max {
				t.Fatalf("%d concurrent grants under a cap of %d: %d granted, %d refused; want exactly %d granted",
					tc.n, tc.max, len(granted), refused, tc.max)
			}
			for _, l := range granted {
				if l.Owner != owner {
					t.Fatalf("granted %+v, want owner %s", l, owner)
				}
			}
			// The cap is the owner's: another's grant under the same cap passes.
			if _, err := s.Grant(t.Context(), capped(ownerName(t, "other"), resourceName(t, "other"), tc.max, longTTL)); err != nil {
				t.Fatalf("another owner's grant: %v", err)
			}
		})
	}
}

// testOwnerCapFrees: a released, an expired and a revoked lease free their
// slot, a renewed one keeps it; the count survives a restart; a grant
// without a cap is not refused, and counts toward the owner's capped ones.
func testOwnerCapFrees(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	owner := ownerName(t, "o")
	wantRefused := func(what string, max int) {
		t.Helper()
		_, err := s.Grant(ctx, capped(owner, resourceName(t, "refused"), max, longTTL))
		wantErr(t, err, tokens.ErrTooManyLeases, what)
	}

	// Released.
	a, err := s.Grant(ctx, capped(owner, resourceName(t, "a"), 1, longTTL))
	if err != nil {
		t.Fatalf("first grant under a cap of 1: %v", err)
	}
	wantRefused("second grant under a cap of 1", 1)
	// An owner whose name starts with this one's is another owner.
	if _, err := s.Grant(ctx, capped(owner+"x", resourceName(t, "longer"), 1, longTTL)); err != nil {
		t.Fatalf("grant of an owner whose name extends the capped one's: %v", err)
	}
	wantRefused("second grant under a cap of 1, beside another owner's", 1)
	release(t, s, a)
	b, err := s.Grant(ctx, capped(owner, resourceName(t, "b"), 1, shortTTL))
	if err != nil {
		t.Fatalf("grant after the release: %v", err)
	}
	wantRefused("grant beside the lease granted after the release", 1)

	// Renewed: still counted.
	if b, err = s.Renew(ctx, b.ID, shortTTL); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	wantRefused("grant beside a renewed lease", 1)

	// Counted across a restart.
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		wantRefused("grant after a restart", 1)
	}

	// Expired.
	waitExpired(t, s, b)
	c, err := s.Grant(ctx, capped(owner, resourceName(t, "c"), 1, longTTL))
	if err != nil {
		t.Fatalf("grant after the expiry of the owner's only lease: %v", err)
	}

	// Revoked.
	wantRefused("grant beside the lease granted after the expiry", 1)
	if _, err := s.Revoke(ctx, c.ID, "admin"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}

	// A larger cap admits more; a grant without a cap is not refused, and
	// counts toward the next capped one.
	for i := range 2 {
		if _, err := s.Grant(ctx, capped(owner, resourceName(t, fmt.Sprint("d", i)), 2, longTTL)); err != nil {
			t.Fatalf("grant %d under a cap of 2: %v", i+1, err)
		}
	}
	wantRefused("third grant under a cap of 2", 2)
	if _, err := s.Grant(ctx, capped(owner, resourceName(t, "uncapped"), 0, longTTL)); err != nil {
		t.Fatalf("grant without a cap: %v", err)
	}
	wantRefused("grant under a cap of 3 beside 3 live leases", 3)
}
