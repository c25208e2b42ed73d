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

// A retry while the first attempt is in flight is answered without a
// commit; a replay commits (its history event), as does a first attempt.
func TestKeyInFlightRetryCommitsNothing(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{})
	scope := tokens.KeyScope{Resource: "r", Upstream: "u", Key: "k"}
	begin := func(attempt string) (tokens.KeyRecord, bool) {
		t.Helper()
		rec, fresh, err := s.BeginKey(t.Context(), tokens.KeyBegin{Scope: scope, Attempt: attempt, Fingerprint: "f", Token: 3,
			InFlight: time.Hour, Window: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return rec, fresh
	}
	before := s.KeyCommits()
	if _, fresh := begin("a1"); !fresh {
		t.Fatal("first BeginKey not fresh")
	}
	if n := s.KeyCommits() - before; n != 1 {
		t.Fatalf("a first attempt made %d commits, want 1", n)
	}
	for i := range 3 {
		rec, fresh := begin(fmt.Sprint("r", i))
		if fresh || rec.Attempt != "a1" || rec.State != tokens.KeyInProgress || rec.Now.IsZero() {
			t.Fatalf("retry in flight = %+v fresh %v; want a1's in-progress record with the store's clock", rec, fresh)
		}
	}
	if n := s.KeyCommits() - before; n != 1 {
		t.Fatalf("three retries in flight made %d commits, want none", n-1)
	}
	if err := s.FinishKey(t.Context(), scope, "a1", tokens.KeyOutcome{State: tokens.KeyCompleted, Status: 200, Window: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if rec, fresh := begin("r9"); fresh || rec.State != tokens.KeyCompleted {
		t.Fatalf("retry after finish = %+v fresh %v", rec, fresh)
	}
	if n := s.KeyCommits() - before; n != 3 {
		t.Fatalf("begin, finish and a replay made %d commits, want 3", n)
	}
	evs, err := s.History(t.Context(), "r", 10)
	if err != nil || len(evs) != 1 || evs[0].Kind != tokens.EventReplayed {
		t.Fatalf("history = %+v, %v; want the replay alone", evs, err)
	}
}
