// Package storagetest is the conformance suite every tokens.Store backend
// must pass: token order, expiry, renew and release rules, drain periods,
// the rejection log, lease history, concurrency and restarts.
//
// The suite uses real time, since some backends measure lease time with
// their own clock (PostgreSQL's now()). Short leases last shortTTL (1 s),
// and every wait is a poll for the event it expects, bounded by waitLimit.
// Each subtest opens a store of its own and uses its own resource names,
// and most run in parallel. The suites are split by concern, one file each:
// leases.go (grant, renew, release, drain), rejections.go, history.go,
// concurrency.go (concurrency, restart, ping), owner.go (owner, revoke),
// caps.go (the owner's lease cap, under concurrency),
// and the other seams' suites (locker.go, feed.go, fence.go,
// idempotency.go).
package storagetest

import (
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Harness tells Run how to get stores of the backend under test.
type Harness struct {
	// Open returns a new, empty, isolated store. It registers its own
	// cleanup (t.Cleanup) to close the store and remove its data.
	Open func(t *testing.T) tokens.Store
	// Reopen closes s and opens the same data again, as a restart of the
	// gateway would; the returned store is cleaned up like Open's. Nil if
	// the backend cannot restart (the restart tests are then skipped).
	Reopen func(t *testing.T, s tokens.Store) tokens.Store
}

// Short lease times keep the suite fast; long ones never expire during a test.
const (
	shortTTL = time.Second // long enough for a grant and a renewal on a loaded CI machine (400 ms was not, at load 13)
	longTTL  = time.Minute
	// waitLimit bounds every poll.
	waitLimit = 5 * time.Second
	// timeSlack tolerates backends that store times with less than
	// nanosecond precision (PostgreSQL: microseconds).
	timeSlack = time.Millisecond
)

// Run runs the conformance suite against the backend h describes.
func Run(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("storagetest: Harness.Open is required")
	}
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"TokensStartAtOneAndIncrease", testTokensIncrease},
		{"GrantHeld", testGrantHeld},
		{"GrantAfterExpiry", testGrantAfterExpiry},
		{"NotFound", testNotFound},
		{"Renew", testRenew},
		{"RenewExpired", testRenewExpired},
		{"RenewReleased", testRenewReleased},
		{"RenewSuperseded", testRenewSuperseded},
		{"Release", testRelease},
		{"ReleaseExpired", testReleaseExpired},
		{"ReleaseSuperseded", testReleaseSuperseded},
		{"Drain", testDrain},
		{"CurrentLeases", testCurrentLeases},
		{"Rejections", testRejections},
		{"RejectionsSince", testRejectionsSince},
		{"RejectionsLimit", testRejectionsLimit},
		{"RejectionAtKept", testRejectionAtKept},
		{"RejectionRepeats", testRejectionRepeats},
		{"RejectionUnknownLease", testRejectionUnknownLease},
		{"History", testHistory},
		{"Concurrency", testConcurrency},
		{"Restart", testRestart},
		{"Ping", testPing},
		{"Owner", testOwner},
		{"Revoke", testRevoke},
		{"RevokeEnded", testRevokeEnded},
		{"WriteCounts", testWriteCounts},
		{"LeaseState", testLeaseState},
		{"LeaseIDFormats", testLeaseIDFormats},
		{"OwnerCapConcurrent", testOwnerCapConcurrent},
		{"OwnerCapFrees", testOwnerCapFrees},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}
