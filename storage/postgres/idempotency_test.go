package postgres_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// Prune keeps at most MaxIdempotencyRecords records, the newest, and
// deletes expired ones.
func TestKeysBounded(t *testing.T) {
	t.Parallel()
	s := pgtest.Open(t, pgtest.NewSchema(t), postgres.Options{MaxIdempotencyRecords: 5, PruneInterval: -1})
	scope := func(i int) tokens.KeyScope {
		return tokens.KeyScope{Resource: "r", Upstream: "u", Key: fmt.Sprint("k", i)}
	}
	for i := range 20 {
		window := time.Hour
		if i == 19 {
			window = time.Microsecond // expired at once
		}
		if _, fresh, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope(i), Attempt: "a", Fingerprint: "f",
			InFlight: time.Minute, Window: window}); err != nil || !fresh {
			t.Fatalf("BeginKey %d: fresh %v, %v", i, fresh, err)
		}
	}
	p, err := s.Prune(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p.Keys != 15 {
		t.Fatalf("Prune deleted %d idempotency records, want 15 (1 expired, 14 beyond the bound)", p.Keys)
	}
	for i := range 20 {
		_, err := s.LookupKey(t.Context(), scope(i))
		kept := i >= 14 && i < 19
		if kept && err != nil || !kept && !errors.Is(err, tokens.ErrNotFound) {
			t.Fatalf("key %d after prune: %v (kept: %v)", i, err, kept)
		}
	}
}
