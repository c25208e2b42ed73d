package bolt

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// oldLeaseID is a lease id as fencegw made them before they were
// time-ordered: "fl_" and 160 random bits in lowercase standard base32.
func oldLeaseID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return tokens.LeaseIDPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// TestOldLeaseIDsAfterUpgrade: a file whose leases have old-format ids
// (random, spread over the whole key space) keeps working once new,
// time-ordered ids are added to the same bucket: every lease of either
// format is found from the file (the cache is tiny), and lease collection
// walks both.
func TestOldLeaseIDsAfterUpgrade(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	opts := Options{Now: clock, CacheEntries: 16}
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), opts)
	ctx := t.Context()
	const n = 400 // a few dozen pages of leases per format
	type granted struct {
		lease      tokens.Lease
		superseded bool
	}
	var all []granted
	// Every other resource is released and granted again, so that half the
	// leases end superseded, for collection.
	grantAll := func(prefix string, id func() string) {
		for i := range n {
			name := fmt.Sprintf("%s/%d", prefix, i)
			l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: id(), Resource: name, Holder: prefix, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				if l, err = s.Release(ctx, l.ID); err != nil {
					t.Fatal(err)
				}
				all = append(all, granted{l, true})
				if l, err = s.Grant(ctx, tokens.GrantRequest{LeaseID: id(), Resource: name, Holder: prefix, TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
			}
			all = append(all, granted{l, false})
		}
	}
	grantAll("old", oldLeaseID)
	s = reopen(t, s, opts)
	grantAll("new", tokens.NewLeaseID)
	s = reopen(t, s, opts)

	for _, g := range all {
		l, err := s.Lease(ctx, g.lease.ID)
		if err != nil || l.ID != g.lease.ID || l.Resource != g.lease.Resource || l.Token != g.lease.Token || l.Released() != g.superseded {
			t.Fatalf("Lease(%s) = %+v, %v; want %+v", tokens.LeaseHint(g.lease.ID), l, err, g.lease)
		}
		if g.superseded {
			continue
		}
		r, err := s.Resource(ctx, g.lease.Resource)
		if err != nil || r.Lease == nil || r.Lease.ID != g.lease.ID {
			t.Fatalf("Resource(%s) = %+v, %v; want its lease %s", g.lease.Resource, r, err, tokens.LeaseHint(g.lease.ID))
		}
	}
	// Past the retention every superseded lease of either format is
	// collected, and no current one.
	now.Add(int64(LeaseRetention + 2*time.Hour))
	if got, err := s.collectLeases(); err != nil || got != n {
		t.Fatalf("collectLeases = %d, %v; want the %d superseded leases", got, err, n)
	}
	for _, g := range all {
		_, err := s.Lease(ctx, g.lease.ID)
		if gone := errors.Is(err, tokens.ErrNotFound); gone != g.superseded || (err != nil && !gone) {
			t.Fatalf("after collection Lease(%s of %s, superseded %v): %v", tokens.LeaseHint(g.lease.ID), g.lease.Resource, g.superseded, err)
		}
	}
}

// leasesFillRatio is the share of the leases bucket's leaf pages in use.
func leasesFillRatio(t *testing.T, s *Store) float64 {
	t.Helper()
	var st bbolt.BucketStats
	if err := s.db.View(func(tx *bbolt.Tx) error {
		st = tx.Bucket(bucketLeases).Stats()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return float64(st.LeafInuse) / float64(st.LeafPageN*s.db.Info().PageSize)
}

// TestLeasesAppended: leases granted one after another fill the leases
// bucket's pages to leasesFill, as their time-ordered ids are appended.
// Random ids (the old format), or pages split half full, leave them around
// 50-70 % used, which is what made the file and its resident pages grow.
func TestLeasesAppended(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	var ids []string
	for i := range 600 { // ~20 pages
		l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: fmt.Sprint("r", i), Holder: "h", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	if got := leasesFillRatio(t, s); got < 0.8 {
		t.Fatalf("the leases bucket's leaf pages are %.0f%% used, want >= 80%% (leasesFill %.2f)", 100*got, leasesFill)
	}
	// Releasing every lease makes each record longer (ReleasedAt): the room
	// left in each page takes it without splitting pages into slivers.
	for _, id := range ids {
		if _, err := s.Release(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if got := leasesFillRatio(t, s); got < 0.8 {
		t.Fatalf("after releases the leases bucket's leaf pages are %.0f%% used, want >= 80%%", 100*got)
	}
}
