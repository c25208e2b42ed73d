package redis_test

import (
	"testing"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// The PostgreSQL fence with leases in Redis: the same rules, with the fence
// reading the lease state through the Redis store (claims included).
func TestFenceConformance(t *testing.T) {
	rdb := client(t, -1)
	pgtest.Require(t)
	storagetest.RunFence(t, storagetest.FenceHarness{
		Replicas: func(t *testing.T, n int, opts storagetest.FenceOptions) []*storagetest.FenceReplica {
			p := prefix(t)
			return pgtest.FenceReplicas(t, n, opts, func(t *testing.T, pg *postgres.Store) (tokens.Store, postgres.StateReader) {
				s := redis.New(rdb, pg, redis.Options{Prefix: p})
				return s, s
			})
		},
	})
}
