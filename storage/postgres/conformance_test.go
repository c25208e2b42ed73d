package postgres_test

import (
	"sync"
	"testing"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// TestConformance runs the store conformance suite (storagetest.Run) on
// the PostgreSQL store, each store on a schema of its own; Reopen closes
// it and opens the same schema again.
func TestConformance(t *testing.T) {
	pgtest.Require(t)
	var mu sync.Mutex
	schemas := map[tokens.Store]string{}
	schemaOf := func(s tokens.Store) string { mu.Lock(); defer mu.Unlock(); return schemas[s] }
	storagetest.Run(t, storagetest.Harness{
		Open: func(t *testing.T) tokens.Store {
			schema := pgtest.NewSchema(t)
			s := pgtest.Open(t, schema, postgres.Options{})
			mu.Lock()
			schemas[s] = schema
			mu.Unlock()
			return s
		},
		Reopen: func(t *testing.T, s tokens.Store) tokens.Store {
			schema := schemaOf(s)
			if err := s.(*postgres.Store).Close(); err != nil {
				t.Fatal(err)
			}
			re := pgtest.Open(t, schema, postgres.Options{})
			mu.Lock()
			schemas[re] = schema
			mu.Unlock()
			return re
		},
	})
}

func TestKeysConformance(t *testing.T) {
	pgtest.Require(t)
	var mu sync.Mutex
	schemas := map[tokens.IdempotencyStore]string{}
	storagetest.RunKeys(t, storagetest.KeyHarness{
		Open: func(t *testing.T) tokens.IdempotencyStore {
			schema := pgtest.NewSchema(t)
			s := pgtest.Open(t, schema, postgres.Options{})
			mu.Lock()
			schemas[s] = schema
			mu.Unlock()
			return s
		},
		Reopen: func(t *testing.T, s tokens.IdempotencyStore) tokens.IdempotencyStore {
			mu.Lock()
			schema := schemas[s]
			mu.Unlock()
			if err := s.(*postgres.Store).Close(); err != nil {
				t.Fatal(err)
			}
			re := pgtest.Open(t, schema, postgres.Options{})
			mu.Lock()
			schemas[re] = schema
			mu.Unlock()
			return re
		},
	})
}

// TestRatesConformance runs the shared rate-limit suite on two stores in
// one schema, as two replicas.
func TestRatesConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunRates(t, storagetest.RateHarness{
		Replicas: func(t *testing.T) (a, b storagetest.RateTaker) {
			schema := pgtest.NewSchema(t)
			return pgtest.Open(t, schema, postgres.Options{}), pgtest.Open(t, schema, postgres.Options{})
		},
	})
}
