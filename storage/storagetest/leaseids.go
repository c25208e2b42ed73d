package storagetest

// Conformance for lease ids made before ids were time-ordered: a store
// still finds, renews and releases them after an upgrade.

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

// oldLeaseID makes a lease id as fencegw did before ids were time-ordered:
// "fl_" and 160 random bits in lowercase standard base32. Stores written
// then hold such ids; they must keep working next to the new ones.
func oldLeaseID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return tokens.LeaseIDPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// testLeaseIDFormats: a store holding leases with old-format ids (written
// before a restart, as by an older gateway) serves, renews, releases and
// supersedes them as before, next to leases with new ids.
func testLeaseIDFormats(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	grantOld := func(name string) tokens.Lease {
		t.Helper()
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: oldLeaseID(), Resource: name, Holder: "old", TTL: longTTL})
		if err != nil {
			t.Fatalf("Grant(%s) with an old-format id: %v", name, err)
		}
		return l
	}
	held, freed, renewed := resourceName(t, "held"), resourceName(t, "freed"), resourceName(t, "renewed")
	a, f, r := grantOld(held), grantOld(freed), grantOld(renewed)
	fresh := grant(t, s, resourceName(t, "fresh"), "new", longTTL)
	if h.Reopen != nil {
		s = h.Reopen(t, s)
	}

	for _, l := range []tokens.Lease{a, f, r, fresh} {
		got, err := s.Lease(ctx, l.ID)
		if err != nil || got.ID != l.ID || got.Token != l.Token || got.Resource != l.Resource {
			t.Fatalf("Lease(%s) = %+v, %v; want token %d of %s", tokens.LeaseHint(l.ID), got, err, l.Token, l.Resource)
		}
	}
	if cur := resource(t, s, held); cur.Holder(storeNow(cur)) == nil || cur.Lease.ID != a.ID {
		t.Fatalf("%s is held by %+v, want its old-format lease", held, cur.Lease)
	}
	_, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: held, Holder: "new", TTL: longTTL})
	wantErr(t, err, tokens.ErrLeaseHeld, "Grant of a resource held under an old-format id")
	if _, err := s.Renew(ctx, r.ID, 2*longTTL); err != nil {
		t.Fatalf("Renew(old-format id): %v", err)
	}
	release(t, s, f)
	next := grant(t, s, freed, "new", longTTL)
	if next.Token <= f.Token {
		t.Fatalf("token after releasing an old-format lease = %d, want > %d", next.Token, f.Token)
	}
	if _, err := s.Renew(ctx, f.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(superseded old-format id): %v, want ErrLeaseLost", err)
	}
	if _, err := s.Lease(ctx, oldLeaseID()); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("Lease(unknown old-format id): %v, want ErrNotFound", err)
	}
	live, err := s.CurrentLeases(ctx, 100)
	if err != nil {
		t.Fatalf("CurrentLeases: %v", err)
	}
	var ids []string
	for _, l := range live {
		ids = append(ids, l.ID)
	}
	for _, want := range []string{a.ID, r.ID, fresh.ID, next.ID} {
		if !slices.Contains(ids, want) {
			t.Fatalf("CurrentLeases = %v, want %s among them", leaseNames(live), tokens.LeaseHint(want))
		}
	}
}
