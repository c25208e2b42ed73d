package bolt

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// The store keeps at most MaxIdempotencyRecords records, dropping the
// oldest, and its count survives a restart.
func TestKeysBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	s := openAt(t, path, Options{MaxIdempotencyRecords: 5})
	scope := func(i int) tokens.KeyScope {
		return tokens.KeyScope{Resource: "r", Upstream: "u", Key: fmt.Sprint("k", i)}
	}
	for i := range 20 {
		if _, fresh, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope(i), Attempt: "a", Fingerprint: "f",
			InFlight: time.Minute, Window: time.Hour}); err != nil || !fresh {
			t.Fatalf("BeginKey %d: fresh %v, %v", i, fresh, err)
		}
	}
	count := func(s *Store) (records, order int) {
		_ = s.db.View(func(tx *bbolt.Tx) error {
			records, order = tx.Bucket(bucketKeys).Stats().KeyN, tx.Bucket(bucketKeyOrder).Stats().KeyN
			return nil
		})
		return
	}
	if r, o := count(s); r != 5 || o != 5 {
		t.Fatalf("%d records, %d order entries; want 5 and 5", r, o)
	}
	if _, err := s.LookupKey(t.Context(), scope(0)); !errors.Is(err, tokens.ErrNotFound) {
		t.Fatalf("oldest key: %v, want ErrNotFound (evicted)", err)
	}
	if _, err := s.LookupKey(t.Context(), scope(19)); err != nil {
		t.Fatalf("newest key: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path, Options{MaxIdempotencyRecords: 5})
	for i := 20; i < 23; i++ {
		if _, _, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope(i), Attempt: "a", Fingerprint: "f",
			InFlight: time.Minute, Window: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if r, o := count(s); r != 5 || o != 5 {
		t.Fatalf("after restart: %d records, %d order entries; want 5 and 5", r, o)
	}
}
