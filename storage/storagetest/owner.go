package storagetest

// The store suite's tests of a lease's owner (principal) and of
// revocation.

import (
	"errors"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

// testOwner: the principal a lease was granted to comes back from every
// read, across renewals, releases and restarts, and is never changed.
func testOwner(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name, other := resourceName(t, "r"), resourceName(t, "none")
	a, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: "a", Owner: "worker-1", TTL: longTTL})
	if err != nil || a.Owner != "worker-1" {
		t.Fatalf("Grant with an owner = %+v, %v; want Owner worker-1", a, err)
	}
	anon := grant(t, s, other, "b", longTTL)
	if anon.Owner != "" {
		t.Fatalf("Grant without an owner = %+v, want Owner empty", anon)
	}
	check := func(when string) {
		t.Helper()
		if got, err := s.Lease(ctx, a.ID); err != nil || got.Owner != "worker-1" {
			t.Fatalf("%s: Lease = %+v, %v; want Owner worker-1", when, got, err)
		}
		if r := resource(t, s, name); r.Lease == nil || r.Lease.Owner != "worker-1" {
			t.Fatalf("%s: Resource lease = %+v; want Owner worker-1", when, r.Lease)
		}
	}
	check("after grant")
	if got, err := s.Renew(ctx, a.ID, longTTL); err != nil || got.Owner != "worker-1" {
		t.Fatalf("Renew = %+v, %v; want Owner worker-1", got, err)
	}
	if live, err := s.CurrentLeases(ctx, 1000); err != nil {
		t.Fatalf("CurrentLeases: %v", err)
	} else {
		for _, l := range live {
			if l.ID == a.ID && l.Owner != "worker-1" {
				t.Fatalf("CurrentLeases lists %+v; want Owner worker-1", l)
			}
		}
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		check("after restart")
	}
	if got := release(t, s, tokens.Lease{ID: a.ID}); got.Owner != "worker-1" {
		t.Fatalf("Release = %+v; want Owner worker-1", got)
	}
	check("after release")
}

// testRevoke: revoking the current lease releases it at once, whoever holds
// it; the history names the administrator; the token does not move; a
// second revoke changes nothing.
func testRevoke(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	a, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: "a", Owner: "worker-1", TTL: longTTL})
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	rev, err := s.Revoke(ctx, a.ID, "alice")
	if err != nil || !rev.Released() || rev.ID != a.ID || rev.Token != a.Token || rev.Owner != "worker-1" {
		t.Fatalf("Revoke = %+v, %v; want a, released, token and owner unchanged", rev, err)
	}
	r := resource(t, s, name)
	if r.Token != a.Token || r.Holder(storeNow(r)) != nil || r.StateOf(a, storeNow(r)) != tokens.StateReleased {
		t.Fatalf("Resource after revoke = %+v; want token %d, no holder, a released", r, a.Token)
	}
	if again, err := s.Revoke(ctx, a.ID, "bob"); err != nil || !near(again.ReleasedAt, rev.ReleasedAt) {
		t.Fatalf("second Revoke = %+v, %v; want the first revocation unchanged", again, err)
	}
	if _, err := s.Renew(ctx, a.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew after revoke: %v, want ErrLeaseLost", err)
	}
	hist, err := s.History(ctx, name, 0)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	var revoked []tokens.Event
	for _, e := range hist {
		if e.Kind == tokens.EventRevoked {
			revoked = append(revoked, e)
		}
	}
	if len(revoked) != 1 || revoked[0].Actor != "alice" || revoked[0].Token != a.Token || revoked[0].Holder != "a" {
		t.Fatalf("History = %+v; want one revoked event by alice for token %d", hist, a.Token)
	}
	if b := grant(t, s, name, "b", longTTL); b.Token != a.Token+1 {
		t.Fatalf("token after revoke = %d, want %d", b.Token, a.Token+1)
	}
}

// testRevokeEnded: revoking an expired, superseded or unknown lease frees
// nobody and changes no token.
func testRevokeEnded(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	if _, err := s.Revoke(ctx, tokens.NewLeaseID(), "alice"); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Revoke(unknown): %v, want ErrNotFound", err)
	}
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
	_, err := s.Revoke(ctx, a.ID, "alice")
	wantErr(t, err, tokens.ErrLeaseLost, "Revoke(expired)")
	b := grant(t, s, name, "b", longTTL)
	_, err = s.Revoke(ctx, a.ID, "alice")
	wantErr(t, err, tokens.ErrLeaseLost, "Revoke(superseded)")
	r := resource(t, s, name)
	if h := r.Holder(storeNow(r)); h == nil || h.ID != b.ID || r.Token != b.Token {
		t.Fatalf("revoking an old lease touched the new holder: %+v", r)
	}
}
