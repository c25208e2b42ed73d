package redis_test

import (
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
	envs := envsBy(func(e *env) tokens.IdempotencyStore { return e.ledger })
	storagetest.RunKeys(t, storagetest.KeyHarness{
		Open:    envs.open,
		Reopen:  envs.reopen,
		History: func(s tokens.IdempotencyStore) storagetest.Historian { return envs.of(s).store },
	})
}
