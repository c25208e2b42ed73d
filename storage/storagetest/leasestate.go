package storagetest

import (
	"context"
	"errors"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

// stateReader is the one read of a lease and its resource's fence state
// that the PostgreSQL modes' fence judges writes on (postgres.StateReader:
// the PostgreSQL Store's own, or the Redis mode's, which also checks the
// Redis claim).
type stateReader interface {
	LeaseState(ctx context.Context, leaseID string) (tokens.Lease, tokens.Resource, error)
}

// testLeaseState: a Store that has the fence's read (stateReader) reads,
// in one step, what Lease and Resource read apart, so that the fence
// refuses on it exactly the writes it would refuse under the lock. The
// states are the ones Judge tells apart: current, drained, expired,
// released, revoked, superseded, and an unknown id. A store without it
// (the embedded one, which has no fence) is skipped.
func testLeaseState(t *testing.T, h Harness) {
	s := h.Open(t)
	ls, ok := s.(stateReader)
	if !ok {
		t.Skipf("%T has no fence read (LeaseState)", s)
	}
	ctx := t.Context()
	check := func(what string, l tokens.Lease, want tokens.LeaseState) {
		t.Helper()
		gotLease, gotState, err := ls.LeaseState(ctx, l.ID)
		if err != nil {
			t.Fatalf("%s: LeaseState: %v", what, err)
		}
		lease, err := s.Lease(ctx, l.ID)
		if err != nil {
			t.Fatalf("%s: Lease: %v", what, err)
		}
		state := resource(t, s, l.Resource)
		if !sameLease(gotLease, lease) {
			t.Fatalf("%s: LeaseState's lease %+v, Lease's %+v", what, gotLease, lease)
		}
		if gotState.Name != state.Name || gotState.Token != state.Token || !near(gotState.DrainUntil, state.DrainUntil) {
			t.Fatalf("%s: LeaseState's resource %+v, Resource's %+v", what, gotState, state)
		}
		// Resource.Lease may be left out for a lease that is not the
		// current one (postgres.StateReader), never made up.
		asked := state.Lease != nil && state.Lease.ID == l.ID
		if asked && (gotState.Lease == nil || !sameLease(*gotState.Lease, *state.Lease)) ||
			!asked && gotState.Lease != nil && (state.Lease == nil || !sameLease(*gotState.Lease, *state.Lease)) {
			t.Fatalf("%s: LeaseState's current lease %+v, Resource's %+v", what, gotState.Lease, state.Lease)
		}
		if gotState.Now.IsZero() != state.Now.IsZero() {
			t.Fatalf("%s: LeaseState's clock %v, Resource's %v: one store, one clock", what, gotState.Now, state.Now)
		}
		if got := gotState.StateOf(gotLease, storeNow(gotState)); got != want {
			t.Fatalf("%s: LeaseState reads the lease as %s, want %s", what, got, want)
		}
		if got := state.StateOf(lease, storeNow(state)); got != want {
			t.Fatalf("%s: Lease and Resource read the lease as %s, want %s", what, got, want)
		}
	}

	if _, _, err := ls.LeaseState(ctx, tokens.NewLeaseID()); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("LeaseState(unknown): %v, want ErrNotFound", err)
	}

	name := resourceName(t, "r")
	a := grant(t, s, name, "a", longTTL)
	check("current", a, tokens.StateCurrent)
	if err := s.Drain(ctx, name, longTTL); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	check("current, draining", a, tokens.StateCurrent)
	release(t, s, a)
	check("released", a, tokens.StateReleased)

	other := resourceName(t, "expired")
	e := grant(t, s, other, "e", shortTTL)
	waitExpired(t, s, e)
	check("expired", e, tokens.StateExpired)
	next := grant(t, s, other, "next", longTTL)
	check("superseded", e, tokens.StateSuperseded)
	if _, err := s.Revoke(ctx, next.ID, "admin"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	check("revoked", next, tokens.StateReleased)
}

// sameLease compares leases as stores keep them (times to timeSlack).
func sameLease(a, b tokens.Lease) bool {
	return a.ID == b.ID && a.Resource == b.Resource && a.Holder == b.Holder && a.Owner == b.Owner &&
		a.Token == b.Token && a.TTL == b.TTL && near(a.GrantedAt, b.GrantedAt) &&
		near(a.ExpiresAt, b.ExpiresAt) && near(a.ReleasedAt, b.ReleasedAt)
}
