package redis_test

import (
	"sync"
	"testing"

	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// The Redis mode keeps its idempotency records in the PostgreSQL ledger
// (cmd/fencegw wires the ledger as the gateway's IdempotencyStore); the
// lease history the dashboard reads comes through the Redis store. This
// runs the record suite so, with the history read as the Redis mode reads
// it.
func TestKeysConformance(t *testing.T) {
	client(t, -1)
	var mu sync.Mutex
	envs := map[tokens.IdempotencyStore]*env{}
	storagetest.RunKeys(t, storagetest.KeyHarness{
		Open: func(t *testing.T) tokens.IdempotencyStore {
			e := open(t, -1)
			mu.Lock()
			envs[e.ledger] = e
			mu.Unlock()
			return e.ledger
		},
		Reopen: func(t *testing.T, s tokens.IdempotencyStore) tokens.IdempotencyStore {
			mu.Lock()
			old := envs[s]
			mu.Unlock()
			old.ledger.Close()
			e := &env{rdb: old.rdb, schema: old.schema, prefix: old.prefix}
			e.reopen(t)
			mu.Lock()
			envs[e.ledger] = e
			mu.Unlock()
			return e.ledger
		},
		History: func(s tokens.IdempotencyStore) storagetest.Historian {
			mu.Lock()
			defer mu.Unlock()
			return envs[s].store
		},
	})
}
