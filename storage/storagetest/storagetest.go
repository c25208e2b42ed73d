// Package storagetest is the conformance suite every tokens.Store backend
// must pass: token order, expiry, renew and release rules, drain periods,
// the rejection log, lease history, concurrency and restarts.
//
// The suite uses real time, since some backends measure lease time with
// their own clock (PostgreSQL's now()). TTLs are short (150–300 ms) and every
// wait is bounded. Each subtest opens a store of its own and uses its own
// resource names, and most run in parallel.
package storagetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// resourceName returns a resource name unique to the test and the run.
func resourceName(t *testing.T, suffix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer(" ", "_", "#", "_").Replace(t.Name())
	return fmt.Sprintf("st/%s/%s-%s", name, suffix, hex.EncodeToString(b[:]))
}

func grant(t *testing.T, s tokens.Store, resource, holder string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: holder, TTL: ttl})
	if err != nil {
		t.Fatalf("Grant(%s, %s): %v", resource, holder, err)
	}
	if l.Resource != resource || l.Holder != holder || l.ID == "" {
		t.Fatalf("Grant returned %+v for resource %s holder %s", l, resource, holder)
	}
	return l
}

func release(t *testing.T, s tokens.Store, l tokens.Lease) tokens.Lease {
	t.Helper()
	out, err := s.Release(t.Context(), l.ID)
	if err != nil {
		t.Fatalf("Release(token %d of %s): %v", l.Token, l.Resource, err)
	}
	return out
}

func resource(t *testing.T, s tokens.Store, name string) tokens.Resource {
	t.Helper()
	r, err := s.Resource(t.Context(), name)
	if err != nil {
		t.Fatalf("Resource(%s): %v", name, err)
	}
	if r.Name != name {
		t.Fatalf("Resource(%s).Name = %q", name, r.Name)
	}
	return r
}

// storeNow is the store's clock as it reports it, or the test's.
func storeNow(r tokens.Resource) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return time.Now()
}

// wantErr checks that err wraps kind and carries *tokens.Error facts.
func wantErr(t *testing.T, err, kind error, what string) *tokens.Error {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got error %v, want %v", what, err, kind)
	}
	f := tokens.ErrorOf(err)
	if f == nil {
		t.Fatalf("%s: error %v carries no *tokens.Error", what, err)
	}
	return f
}

func near(a, b time.Time) bool {
	d := a.Sub(b)
	return -timeSlack <= d && d <= timeSlack
}

// waitExpired waits, by the store's clock, until l has expired.
func waitExpired(t *testing.T, s tokens.Store, l tokens.Lease) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		r := resource(t, s, l.Resource)
		if !storeNow(r).Before(l.ExpiresAt) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease of %s did not expire within %v", l.Resource, waitLimit)
		}
		time.Sleep(min(10*time.Millisecond, l.ExpiresAt.Sub(storeNow(r))+time.Millisecond))
	}
}

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
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
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
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
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
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
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
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
	_, err := s.Release(t.Context(), a.ID)
	wantErr(t, err, tokens.ErrLeaseLost, "Release(expired)")
	r := resource(t, s, name)
	if r.Lease == nil || r.Lease.ID != a.ID || r.Lease.Released() {
		t.Fatalf("Resource after refused release = %+v, want a's lease, not released", r)
	}
}

func testReleaseSuperseded(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	waitExpired(t, s, a)
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

func rejection(resource string, i int) tokens.Rejection {
	r := tokens.Rejection{
		Resource: resource, Code: tokens.CodeStaleToken, Token: int64(i), CurrentToken: int64(i + 1),
		Holder: fmt.Sprintf("holder-%d", i), LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "up",
		Path: fmt.Sprintf("/items/%d", i),
	}
	if i%2 == 1 { // who presented the lease, when there is authentication
		r.Code, r.Principal = tokens.CodeNotOwner, fmt.Sprintf("key-%d", i)
	}
	if i%3 == 0 { // an observing upstream's, forwarded
		r.WouldRefuse = true
	}
	if i%4 == 0 { // a traced write's
		r.TraceID = fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02d", i%100)
	}
	return r
}

func record(t *testing.T, s tokens.Store, r tokens.Rejection) tokens.Rejection {
	t.Helper()
	got, err := s.RecordRejection(t.Context(), r)
	if err != nil {
		t.Fatalf("RecordRejection: %v", err)
	}
	if got.ID <= 0 || got.At.IsZero() {
		t.Fatalf("RecordRejection = %+v, want ID and At set", got)
	}
	want := r
	want.ID, want.At = got.ID, got.At
	if !r.At.IsZero() {
		want.At = r.At
	}
	if !sameRejection(got, want) {
		t.Fatalf("RecordRejection returned %+v, want %+v", got, want)
	}
	return got
}

func sameRejection(a, b tokens.Rejection) bool {
	if !near(a.At, b.At) || !near(a.LeaseEndedAt, b.LeaseEndedAt) {
		return false
	}
	a.At, b.At, a.LeaseEndedAt, b.LeaseEndedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return a == b
}

func rejections(t *testing.T, s tokens.Store, q tokens.RejectionQuery) []tokens.Rejection {
	t.Helper()
	got, err := s.Rejections(t.Context(), q)
	if err != nil {
		t.Fatalf("Rejections(%+v): %v", q, err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].ID >= got[i-1].ID {
			t.Fatalf("Rejections(%+v) not newest first: id %d after %d", q, got[i].ID, got[i-1].ID)
		}
	}
	return got
}

func ids(rs []tokens.Rejection) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testRejections(t *testing.T, h Harness) {
	s := h.Open(t)
	ra, rb := resourceName(t, "a"), resourceName(t, "b")
	var all, onlyA []tokens.Rejection // oldest first
	for i := range 10 {
		name := ra
		if i%3 == 2 {
			name = rb
		}
		r := rejection(name, i)
		if i == 4 {
			r.LeaseEndedAt = time.Now().Add(-time.Second)
		}
		got := record(t, s, r)
		if len(all) > 0 && got.ID <= all[len(all)-1].ID {
			t.Fatalf("rejection ID %d after %d: not increasing", got.ID, all[len(all)-1].ID)
		}
		all = append(all, got)
		if name == ra {
			onlyA = append(onlyA, got)
		}
	}
	newest := func(rs []tokens.Rejection) []int64 {
		out := ids(rs)
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	got := rejections(t, s, tokens.RejectionQuery{})
	if !equalIDs(ids(got), newest(all)) {
		t.Fatalf("Rejections() ids = %v, want %v", ids(got), newest(all))
	}
	for i, r := range got {
		if want := all[len(all)-1-i]; !sameRejection(r, want) {
			t.Fatalf("listed rejection %+v, recorded %+v", r, want)
		}
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: ra}); !equalIDs(ids(got), newest(onlyA)) {
		t.Fatalf("Rejections(resource a) ids = %v, want %v", ids(got), newest(onlyA))
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: resourceName(t, "none")}); len(got) != 0 {
		t.Fatalf("Rejections(unknown resource) = %v, want none", ids(got))
	}
	if got := rejections(t, s, tokens.RejectionQuery{Limit: 3}); !equalIDs(ids(got), newest(all)[:3]) {
		t.Fatalf("Rejections(limit 3) ids = %v, want %v", ids(got), newest(all)[:3])
	}
	// Cursor pagination, with and without a resource filter: the pages
	// concatenate to the whole list, without duplicates or gaps.
	for _, q := range []tokens.RejectionQuery{{Limit: 3}, {Resource: ra, Limit: 2}} {
		want := newest(all)
		if q.Resource != "" {
			want = newest(onlyA)
		}
		var paged []int64
		for range len(want) + 2 {
			page := rejections(t, s, q)
			if len(page) == 0 {
				break
			}
			if len(page) > q.Limit {
				t.Fatalf("page of %d rejections over limit %d", len(page), q.Limit)
			}
			paged = append(paged, ids(page)...)
			q.Before = page[len(page)-1].ID
		}
		if !equalIDs(paged, want) {
			t.Fatalf("paged ids (resource %q) = %v, want %v", q.Resource, paged, want)
		}
	}
	// Before is exclusive.
	mid := all[5].ID
	if got := rejections(t, s, tokens.RejectionQuery{Before: mid, Limit: 1}); len(got) != 1 || got[0].ID != all[4].ID {
		t.Fatalf("Rejections(before %d, limit 1) = %v, want [%d]", mid, ids(got), all[4].ID)
	}
}

func testRejectionsSince(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	first := record(t, s, rejection(name, 1))
	// Both ends of the interval come from the store's clock.
	deadline := time.Now().Add(waitLimit)
	var second tokens.Rejection
	for {
		time.Sleep(20 * time.Millisecond)
		second = record(t, s, rejection(name, 2))
		if second.At.After(first.At.Add(timeSlack)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock did not advance")
		}
	}
	third := record(t, s, rejection(name, 3))
	for _, q := range []tokens.RejectionQuery{{Since: second.At}, {Resource: name, Since: second.At}} {
		got := rejections(t, s, q)
		want := []int64{third.ID, second.ID}
		if !equalIDs(ids(got), want) {
			t.Fatalf("Rejections(resource %q, since the second) ids = %v, want %v", q.Resource, ids(got), want)
		}
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: name}); len(got) < 3 {
		t.Fatalf("Rejections() = %v, want all of %d, %d, %d", ids(got), third.ID, second.ID, first.ID)
	}
}

func testRejectionsLimit(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	const n = 120
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := s.RecordRejection(t.Context(), rejection(name, i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("RecordRejection: %v", err)
	}
	got := rejections(t, s, tokens.RejectionQuery{Resource: name})
	if len(got) != 100 {
		t.Fatalf("Rejections(limit 0) returned %d, want the default 100", len(got))
	}
	got = rejections(t, s, tokens.RejectionQuery{Resource: name, Limit: 5000})
	if len(got) != n {
		t.Fatalf("Rejections(limit 5000) returned %d, want all %d", len(got), n)
	}
	seen := map[int64]bool{}
	for _, r := range got {
		if seen[r.ID] {
			t.Fatalf("rejection ID %d assigned twice", r.ID)
		}
		seen[r.ID] = true
	}
}

func testRejectionAtKept(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	r := rejection(name, 1)
	r.At = time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	got := record(t, s, r)
	if !near(got.At, r.At) {
		t.Fatalf("RecordRejection changed a given At %v to %v", r.At, got.At)
	}
	if list := rejections(t, s, tokens.RejectionQuery{Resource: name}); len(list) != 1 || !near(list[0].At, r.At) {
		t.Fatalf("listed %+v, want one rejection at %v", list, r.At)
	}
}

// A write with a lease id that was never granted has no resource; it is
// still recorded and listed.
func testRejectionUnknownLease(t *testing.T, h Harness) {
	s := h.Open(t)
	r := rejection("", 0)
	r.Code = tokens.CodeUnknownLease
	r.Path = resourceName(t, "/forged")
	got := record(t, s, r)
	found := false
	for _, it := range rejections(t, s, tokens.RejectionQuery{Limit: 1000}) {
		if it.ID == got.ID && it.Path == r.Path && it.Resource == "" {
			found = true
		}
	}
	if !found {
		t.Fatalf("rejection without a resource not listed")
	}
}

func testHistory(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	if _, err := s.Renew(ctx, a.ID, shortTTL); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	a, _ = s.Lease(ctx, a.ID)
	waitExpired(t, s, a)
	if _, err := s.Renew(ctx, a.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(expired): %v, want ErrLeaseLost", err)
	}
	if _, err := s.Release(ctx, a.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release(expired): %v, want ErrLeaseLost", err)
	}
	b := grant(t, s, name, "b", longTTL)
	release(t, s, b)
	type ev struct {
		kind   tokens.EventKind
		token  int64
		holder string
	}
	want := []ev{
		{tokens.EventReleased, b.Token, "b"},
		{tokens.EventGranted, b.Token, "b"},
		{tokens.EventReleaseRefused, a.Token, "a"},
		{tokens.EventRenewRefused, a.Token, "a"},
		{tokens.EventRenewed, a.Token, "a"},
		{tokens.EventGranted, a.Token, "a"},
	}
	got, err := s.History(ctx, name, 0)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	var gotEv []ev
	for i, e := range got {
		gotEv = append(gotEv, ev{e.Kind, e.Token, e.Holder})
		if e.Resource != name || e.At.IsZero() {
			t.Fatalf("event %+v: want resource %s and At set", e, name)
		}
		if i > 0 && e.At.After(got[i-1].At.Add(timeSlack)) {
			t.Fatalf("History not newest first: %v after %v", e.At, got[i-1].At)
		}
	}
	if fmt.Sprint(gotEv) != fmt.Sprint(want) {
		t.Fatalf("History = %v\nwant %v", gotEv, want)
	}
	if got, err := s.History(ctx, name, 2); err != nil || len(got) != 2 || got[0].Kind != tokens.EventReleased {
		t.Fatalf("History(limit 2) = %+v, %v; want the 2 newest", got, err)
	}
}

func testConcurrency(t *testing.T, h Harness) {
	s := h.Open(t)
	resources := []string{resourceName(t, "a"), resourceName(t, "b"), resourceName(t, "c")}
	const workers = 12
	const grantsPerWorker = 8
	var (
		mu      sync.Mutex
		granted = map[string][]int64{} // per resource, in grant order
		leases  = map[string]bool{}
		held    = map[string]bool{} // per resource: a worker holds it
	)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			deadline := time.Now().Add(20 * time.Second)
			for n := 0; n < grantsPerWorker; {
				name := resources[(w+n)%len(resources)]
				l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: fmt.Sprint("w", w), TTL: 5 * time.Second})
				if errors.Is(err, tokens.ErrLeaseHeld) {
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("worker %d starved", w)
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("Grant: %w", err)
					return
				}
				// The resource is ours until we release it, so appends
				// happen in grant order.
				mu.Lock()
				granted[name] = append(granted[name], l.Token)
				dup, overlap := leases[l.ID], held[name]
				leases[l.ID], held[name] = true, true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("lease id granted twice")
					return
				}
				if overlap {
					errs <- fmt.Errorf("%s: token %d granted while another lease was held and unreleased", name, l.Token)
					return
				}
				if n%2 == 0 {
					if _, err := s.Renew(ctx, l.ID, 0); err != nil {
						errs <- fmt.Errorf("Renew of a held lease: %w", err)
						return
					}
				}
				mu.Lock()
				held[name] = false // before Release: a grant may follow it at once
				mu.Unlock()
				if _, err := s.Release(ctx, l.ID); err != nil {
					errs <- fmt.Errorf("Release of a held lease: %w", err)
					return
				}
				n++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, name := range resources {
		toks := granted[name]
		total += len(toks)
		for i := 1; i < len(toks); i++ {
			if toks[i] <= toks[i-1] {
				t.Fatalf("%s: token %d granted after %d (all: %v)", name, toks[i], toks[i-1], toks)
			}
		}
		if r := resource(t, s, name); len(toks) > 0 && r.Token != toks[len(toks)-1] {
			t.Fatalf("%s: Resource.Token = %d, last granted %d", name, r.Token, toks[len(toks)-1])
		}
	}
	if total != workers*grantsPerWorker {
		t.Fatalf("%d grants recorded, want %d", total, workers*grantsPerWorker)
	}
}

func testRestart(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("backend does not support restarts")
	}
	s := h.Open(t)
	ctx := t.Context()
	held, super, freed := resourceName(t, "held"), resourceName(t, "super"), resourceName(t, "freed")
	a := grant(t, s, held, "a", longTTL)
	old := grant(t, s, super, "old", shortTTL)
	waitExpired(t, s, old)
	cur := grant(t, s, super, "cur", longTTL)
	f := grant(t, s, freed, "f", longTTL)
	release(t, s, f)
	rej := record(t, s, rejection(held, 7))

	s = h.Reopen(t, s)

	got, err := s.Lease(ctx, a.ID)
	if err != nil || got.Token != a.Token || !near(got.ExpiresAt, a.ExpiresAt) || got.Released() {
		t.Fatalf("after restart Lease(a) = %+v, %v; want token %d expiring at %v", got, err, a.Token, a.ExpiresAt)
	}
	r := resource(t, s, held)
	if h := r.Holder(storeNow(r)); h == nil || h.ID != a.ID {
		t.Fatalf("after restart the current lease of %s is %+v, want a", held, r.Lease)
	}
	_, err = s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: held, Holder: "b", TTL: longTTL})
	wantErr(t, err, tokens.ErrLeaseHeld, "Grant of a held resource after restart")
	if _, err := s.Renew(ctx, old.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("after restart Renew(superseded): %v, want ErrLeaseLost", err)
	}
	if _, err := s.Release(ctx, old.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("after restart Release(superseded): %v, want ErrLeaseLost", err)
	}
	if r := resource(t, s, super); r.Holder(storeNow(r)) == nil || r.Lease.ID != cur.ID {
		t.Fatalf("after restart %s is held by %+v, want cur", super, r.Lease)
	}
	if _, err := s.Renew(ctx, cur.ID, 0); err != nil {
		t.Fatalf("after restart Renew(current): %v", err)
	}
	if again := release(t, s, f); !again.Released() {
		t.Fatalf("after restart the released lease is %+v, want released", again)
	}
	if next := grant(t, s, freed, "g", longTTL); next.Token <= f.Token {
		t.Fatalf("after restart token %d, want > %d", next.Token, f.Token)
	}
	list := rejections(t, s, tokens.RejectionQuery{Resource: held})
	if len(list) != 1 || !sameRejection(list[0], rej) {
		t.Fatalf("after restart rejections = %+v, want [%+v]", list, rej)
	}
	if next := record(t, s, rejection(held, 8)); next.ID <= rej.ID {
		t.Fatalf("after restart rejection ID %d, want > %d", next.ID, rej.ID)
	}
	if hist, err := s.History(ctx, held, 0); err != nil || len(hist) == 0 {
		t.Fatalf("after restart History = %v, %v; want the grant", hist, err)
	}
}

func testPing(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

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
