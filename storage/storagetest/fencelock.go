package storagetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// RunFenceLock runs the lock suite of RunLocker on a tokens.Fencer, driven
// as tokens.Service drives it: a write holds its resource's shared fence
// from Hold (under a lease of the resource that stays current throughout)
// until Held.Release, and grants, releases and revokes take Exclusive. So
// writes admitted on two replicas coexist, an exclusive holder is alone, a
// waiting exclusive request is not overtaken by later writes (writer
// preference), a wait ends with its context and leaves no one queued
// behind it, Release and unlock may be called again, and resources are
// independent. Where a Fencer differs from a Locker: writes that queued
// behind an exclusive request wait for the writes of that time to finish
// even if the exclusive request gives up (a replica that began giving its
// fence up finishes doing so).
func RunFenceLock(t *testing.T, h FenceHarness) {
	if h.Replicas == nil {
		t.Fatal("storagetest: FenceHarness.Replicas is required")
	}
	runLockSuite(t, lockHarness{
		replicas: func(t *testing.T, resources ...string) []lockSides {
			rs := h.Replicas(t, 2, fenceOpts)
			leases := make(map[string]tokens.Lease)
			for _, r := range resources {
				leases[r] = grant(t, rs[0].Store, r, "w", time.Hour)
			}
			var out []lockSides
			for _, r := range rs {
				out = append(out, lockSides{holdUnder(r.Fencer, leases), r.Fencer.Exclusive})
			}
			return out
		},
		yieldIsFinal: true,
	})
}

// holdUnder is a Fencer's shared side as a write takes it: Hold under the
// resource's lease in leases, whose Held.Release is the unlock. A refusal
// is an error: the suite's leases stay current.
func holdUnder(f tokens.Fencer, leases map[string]tokens.Lease) lockFunc {
	return func(ctx context.Context, resource string) (func(), error) {
		lease, ok := leases[resource]
		if !ok {
			return nil, fmt.Errorf("no lease of %s", resource)
		}
		v, err := f.Hold(ctx, lease.ID)
		if err != nil {
			return nil, err
		}
		if v.Refusal != nil || v.Held == nil {
			return nil, fmt.Errorf("write under the current lease of %s refused: %w", resource, v.Refusal)
		}
		return v.Held.Release, nil
	}
}
