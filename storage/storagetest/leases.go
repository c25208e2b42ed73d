package storagetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

func testTokensIncrease(t *testing.T, h Harness) {
	s := h.Open(t)
	r1, r2 := resourceName(t, "a"), resourceName(t, "b")
	var last int64
	for i := range 3 {
		l := grant(t, s, r1, "w", longTTL)
		if i == 0 && l.Token != 1 {
			t.Fatalf("first token = %d, want 1", l.Token)
		}
		if l.Token <= last {
			t.Fatalf("token %d after %d: not increasing", l.Token, last)
		}
		last = l.Token
		if l.TTL != longTTL || l.GrantedAt.IsZero() || l.Released() {
			t.Fatalf("granted lease %+v: want TTL %v, GrantedAt set, not released", l, longTTL)
		}
		if d := l.ExpiresAt.Sub(l.GrantedAt); d < longTTL-timeSlack || d > longTTL+timeSlack {
			t.Fatalf("ExpiresAt-GrantedAt = %v, want %v", d, longTTL)
		}
		got, err := s.Lease(t.Context(), l.ID)
		if err != nil || got.Token != l.Token || got.Resource != r1 || !near(got.ExpiresAt, l.ExpiresAt) {
			t.Fatalf("Lease(id) = %+v, %v; want the granted lease %+v", got, err, l)
		}
		r := resource(t, s, r1)
		if r.Token != l.Token || r.Lease == nil || r.Lease.ID != l.ID || r.Holder(storeNow(r)) == nil {
			t.Fatalf("Resource after grant = %+v, want token %d held by the lease", r, l.Token)
		}
		release(t, s, l)
	}
	if l := grant(t, s, r2, "w", longTTL); l.Token != 1 {
		t.Fatalf("first token of another resource = %d, want 1 (tokens are per resource)", l.Token)
	}
	if r := resource(t, s, r1); r.Token != last {
		t.Fatalf("token of %s = %d after granting another resource, want %d", r1, r.Token, last)
	}
}

func testGrantHeld(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "holder-a", longTTL)
	id := tokens.NewLeaseID()
	_, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: id, Resource: name, Holder: "holder-b", TTL: longTTL})
	f := wantErr(t, err, tokens.ErrLeaseHeld, "Grant of a held resource")
	if f.Holder != "holder-a" || f.CurrentToken != a.Token || !near(f.ExpiresAt, a.ExpiresAt) {
		t.Fatalf("ErrLeaseHeld facts = holder %q token %d expires %v; want %q %d %v", f.Holder, f.CurrentToken, f.ExpiresAt, "holder-a", a.Token, a.ExpiresAt)
	}
	if f.RetryAfter <= 0 || f.RetryAfter > longTTL {
		t.Fatalf("ErrLeaseHeld RetryAfter = %v, want the remaining time (0, %v]", f.RetryAfter, longTTL)
	}
	if _, err := s.Lease(t.Context(), id); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Lease of a refused grant: %v, want ErrNotFound", err)
	}
	r := resource(t, s, name)
	if r.Token != a.Token || r.Lease == nil || r.Lease.ID != a.ID {
		t.Fatalf("Resource after refused grant = %+v, want still token %d of holder-a", r, a.Token)
	}
}

func testGrantAfterExpiry(t *testing.T, h Harness) {
	s, name, a := expiredLease(t, h)
	if r := resource(t, s, name); r.Holder(storeNow(r)) != nil {
		t.Fatalf("Resource after expiry has a holder: %+v", r)
	}
	b := grant(t, s, name, "b", longTTL)
	if b.Token <= a.Token {
		t.Fatalf("token after expiry = %d, want > %d", b.Token, a.Token)
	}
	r := resource(t, s, name)
	if r.Token != b.Token || r.Lease == nil || r.Lease.ID != b.ID {
		t.Fatalf("Resource = %+v, want token %d held by b", r, b.Token)
	}
	if old, err := s.Lease(t.Context(), a.ID); err != nil || old.Token != a.Token {
		t.Fatalf("Lease(superseded) = %+v, %v; want it still known with token %d", old, err, a.Token)
	}
}

func testNotFound(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	if _, err := s.Resource(ctx, resourceName(t, "never")); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Resource(never granted): %v, want ErrNotFound", err)
	}
	unknown := tokens.NewLeaseID()
	if _, err := s.Lease(ctx, unknown); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Lease(unknown): %v, want ErrNotFound", err)
	}
	if _, err := s.Renew(ctx, unknown, 0); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Renew(unknown): %v, want ErrNotFound", err)
	}
	if _, err := s.Release(ctx, unknown); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Release(unknown): %v, want ErrNotFound", err)
	}
}

func testRenew(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", longTTL)
	b, err := s.Renew(ctx, a.ID, 2*longTTL)
	if err != nil {
		t.Fatalf("Renew(current, 2m): %v", err)
	}
	if b.ID != a.ID || b.Token != a.Token || b.TTL != 2*longTTL || !b.ExpiresAt.After(a.ExpiresAt) {
		t.Fatalf("Renew(2m) = %+v; want same id and token, TTL 2m, later expiry than %v", b, a.ExpiresAt)
	}
	c, err := s.Renew(ctx, a.ID, 0)
	if err != nil {
		t.Fatalf("Renew(current, 0): %v", err)
	}
	if c.TTL != 2*longTTL || c.ExpiresAt.Before(b.ExpiresAt.Add(-timeSlack)) {
		t.Fatalf("Renew(0) = %+v; want the lease's TTL (2m) reused, expiry >= %v", c, b.ExpiresAt)
	}
	r := resource(t, s, name)
	if r.Token != a.Token || r.Lease == nil || !near(r.Lease.ExpiresAt, c.ExpiresAt) {
		t.Fatalf("Resource after renew = %+v, want expiry %v", r, c.ExpiresAt)
	}
	if got, err := s.Lease(ctx, a.ID); err != nil || !near(got.ExpiresAt, c.ExpiresAt) || got.TTL != c.TTL {
		t.Fatalf("Lease after renew = %+v, %v; want expiry %v", got, err, c.ExpiresAt)
	}
	// A short renew shortens the lease: the TTL is the new one.
	d, err := s.Renew(ctx, a.ID, shortTTL)
	if err != nil || d.TTL != shortTTL || !d.ExpiresAt.Before(c.ExpiresAt) {
		t.Fatalf("Renew(short) = %+v, %v; want TTL %v", d, err, shortTTL)
	}
}

func testRenewExpired(t *testing.T, h Harness) {
	s, name, a := expiredLease(t, h)
	_, err := s.Renew(t.Context(), a.ID, 0)
	f := wantErr(t, err, tokens.ErrLeaseLost, "Renew(expired)")
	if f.Resource != name || f.Token != a.Token {
		t.Fatalf("ErrLeaseLost facts = %+v, want resource %s token %d", f, name, a.Token)
	}
	if r := resource(t, s, name); r.Holder(storeNow(r)) != nil || r.Token != a.Token {
		t.Fatalf("a refused renew changed the resource: %+v", r)
	}
	if b := grant(t, s, name, "b", longTTL); b.Token <= a.Token {
		t.Fatalf("token after expiry = %d, want > %d", b.Token, a.Token)
	}
}

func testRenewReleased(t *testing.T, h Harness) {
	s := h.Open(t)
	a := grant(t, s, resourceName(t, "r"), "a", longTTL)
	release(t, s, a)
	_, err := s.Renew(t.Context(), a.ID, 0)
	wantErr(t, err, tokens.ErrLeaseLost, "Renew(released)")
	if got, err := s.Lease(t.Context(), a.ID); err != nil || !got.Released() {
		t.Fatalf("Lease after refused renew = %+v, %v; want still released", got, err)
	}
}

func testRenewSuperseded(t *testing.T, h Harness) {
	s, name, a := expiredLease(t, h)
	b := grant(t, s, name, "b", longTTL)
	_, err := s.Renew(t.Context(), a.ID, longTTL)
	f := wantErr(t, err, tokens.ErrLeaseLost, "Renew(superseded)")
	if f.CurrentToken != 0 && f.CurrentToken != b.Token {
		t.Fatalf("ErrLeaseLost CurrentToken = %d, want %d", f.CurrentToken, b.Token)
	}
	r := resource(t, s, name)
	if h := r.Holder(storeNow(r)); h == nil || h.ID != b.ID || !near(h.ExpiresAt, b.ExpiresAt) {
		t.Fatalf("after a superseded renew the holder is %+v, want b unchanged", h)
	}
}

func testRelease(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", longTTL)
	rel := release(t, s, a)
	if rel.ID != a.ID || rel.Token != a.Token || !rel.Released() {
		t.Fatalf("Release = %+v, want the lease with ReleasedAt set", rel)
	}
	r := resource(t, s, name)
	if r.Token != a.Token || r.Lease == nil || !r.Lease.Released() || r.Holder(storeNow(r)) != nil {
		t.Fatalf("Resource after release = %+v, want token %d, lease released, no holder", r, a.Token)
	}
	again := release(t, s, a)
	if !again.Released() || !near(again.ReleasedAt, rel.ReleasedAt) {
		t.Fatalf("second Release = %+v, want the same release (idempotent) at %v", again, rel.ReleasedAt)
	}
	b := grant(t, s, name, "b", longTTL)
	if b.Token <= a.Token {
		t.Fatalf("token after release = %d, want > %d", b.Token, a.Token)
	}
	// Releasing the old, released lease again never frees b.
	release(t, s, a)
	if r := resource(t, s, name); r.Holder(storeNow(r)) == nil || r.Lease.ID != b.ID {
		t.Fatalf("re-releasing an old lease freed the new holder: %+v", r)
	}
}

func testReleaseExpired(t *testing.T, h Harness) {
	s, name, a := expiredLease(t, h)
	_, err := s.Release(t.Context(), a.ID)
	wantErr(t, err, tokens.ErrLeaseLost, "Release(expired)")
	r := resource(t, s, name)
	if r.Lease == nil || r.Lease.ID != a.ID || r.Lease.Released() {
		t.Fatalf("Resource after refused release = %+v, want a's lease, not released", r)
	}
}

func testReleaseSuperseded(t *testing.T, h Harness) {
	s, name, a := expiredLease(t, h)
	b := grant(t, s, name, "b", longTTL)
	_, err := s.Release(t.Context(), a.ID)
	wantErr(t, err, tokens.ErrLeaseLost, "Release(superseded)")
	r := resource(t, s, name)
	if h := r.Holder(storeNow(r)); h == nil || h.ID != b.ID || h.Released() {
		t.Fatalf("a superseded release freed the new holder: holder %+v", h)
	}
	if got, err := s.Lease(t.Context(), b.ID); err != nil || got.Released() {
		t.Fatalf("Lease(b) = %+v, %v; want unreleased", got, err)
	}
}

func testDrain(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	const drain = 300 * time.Millisecond
	a := grant(t, s, name, "a", longTTL)
	if err := s.Drain(ctx, name, drain); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	release(t, s, a)
	r := resource(t, s, name)
	if !r.DrainUntil.After(storeNow(r)) {
		t.Fatalf("DrainUntil = %v, want after the store's now %v", r.DrainUntil, storeNow(r))
	}
	// A shorter drain never shortens a longer one.
	if err := s.Drain(ctx, name, time.Millisecond); err != nil {
		t.Fatalf("Drain(short): %v", err)
	}
	if r2 := resource(t, s, name); r2.DrainUntil.Before(r.DrainUntil.Add(-timeSlack)) {
		t.Fatalf("a shorter Drain moved DrainUntil from %v back to %v", r.DrainUntil, r2.DrainUntil)
	}
	_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: "b", TTL: longTTL})
	f := wantErr(t, err, tokens.ErrFenceBusy, "Grant while draining")
	if f.RetryAfter <= 0 || f.RetryAfter > drain {
		t.Fatalf("ErrFenceBusy RetryAfter = %v, want in (0, %v]", f.RetryAfter, drain)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: "b", TTL: longTTL})
		if err == nil {
			if l.Token <= a.Token {
				t.Fatalf("token after drain = %d, want > %d", l.Token, a.Token)
			}
			break
		}
		f := wantErr(t, err, tokens.ErrFenceBusy, "Grant while draining")
		if time.Now().After(deadline) {
			t.Fatalf("still draining after %v", waitLimit)
		}
		time.Sleep(min(f.RetryAfter, 20*time.Millisecond) + time.Millisecond)
	}
}

func testCurrentLeases(t *testing.T, h Harness) {
	s := h.Open(t)
	long := grant(t, s, resourceName(t, "long"), "a", 2*longTTL)
	soon := grant(t, s, resourceName(t, "soon"), "b", longTTL)
	gone := grant(t, s, resourceName(t, "gone"), "c", longTTL)
	release(t, s, gone)
	got, err := s.CurrentLeases(t.Context(), 10)
	if err != nil {
		t.Fatalf("CurrentLeases: %v", err)
	}
	if len(got) != 2 || got[0].ID != soon.ID || got[1].ID != long.ID {
		t.Fatalf("CurrentLeases = %v, want [soon, long] (soonest expiry first, released left out)", leaseNames(got))
	}
	if got, err := s.CurrentLeases(t.Context(), 1); err != nil || len(got) != 1 || got[0].ID != soon.ID {
		t.Fatalf("CurrentLeases(1) = %v, %v; want [soon]", leaseNames(got), err)
	}
}

func leaseNames(ls []tokens.Lease) []string {
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%s#%d", l.Resource, l.Token))
	}
	return out
}

// expiredLease grants holder "a" a lease on a fresh resource of a store of
// h, and returns once the store's clock says it has expired.
func expiredLease(t *testing.T, h Harness) (tokens.Store, string, tokens.Lease) {
	t.Helper()
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
	return s, name, a
}
