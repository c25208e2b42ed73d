package bolt

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// TestOwnerIndex: a file written before the owner index gets it built at
// open, from its live leases (released ones left out), and the owner's
// expired entries are pruned by its grants.
func TestOwnerIndex(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	opts := Options{Now: func() time.Time { return time.Unix(0, now.Load()) }}
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), opts)
	ctx := t.Context()
	grant := func(resource string, max int) (tokens.Lease, error) {
		return s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "h", Owner: "o", MaxLeases: max, TTL: time.Minute})
	}
	for i := range 3 {
		if _, err := grant(fmt.Sprint("r", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	r3, err := grant("r3", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, r3.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket(bucketOwnerLive) }); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, opts)
	if _, err := grant("r4", 3); !errors.Is(err, tokens.ErrTooManyLeases) {
		t.Fatalf("grant under a cap of 3 beside 3 live leases, after the index was rebuilt: %v, want ErrTooManyLeases", err)
	}
	if _, err := grant("r4", 4); err != nil {
		t.Fatalf("grant under a cap of 4 beside 3 live leases (the released one not counted): %v", err)
	}
	if n := ownerEntries(t, s); n != 4 {
		t.Fatalf("owner index holds %d entries, want 4", n)
	}
	// An hour later all four have expired; each grant prunes up to
	// livePrunePerTx of them.
	now.Add(int64(time.Hour))
	if _, err := grant("r5", 1); err != nil {
		t.Fatalf("grant after every lease expired: %v", err)
	}
	if n := ownerEntries(t, s); n != 1 {
		t.Fatalf("owner index holds %d entries after pruning, want the 1 live one", n)
	}
}

func ownerEntries(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.db.View(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketOwnerLive).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
