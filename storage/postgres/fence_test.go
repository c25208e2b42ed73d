package postgres_test

import (
	"testing"

	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
)

// TestFenceConformance runs the fence conformance suite
// (storagetest.RunFence) on PostgreSQL replicas sharing one schema.
func TestFenceConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunFence(t, storagetest.FenceHarness{
		Replicas: func(t *testing.T, n int, opts storagetest.FenceOptions) []*storagetest.FenceReplica {
			return pgtest.FenceReplicas(t, n, opts, nil)
		},
	})
}
