package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// BenchmarkHeldCheck is the cost of the proof the gateway takes before each
// write system call of a write (tokens.Held.Check): two atomic loads and a
// monotonic clock compare, no allocation. Run alone:
//
//	go test -run '^$' -bench HeldCheck ./storage/postgres/
func BenchmarkHeldCheck(b *testing.B) {
	s := pgtest.OpenFresh(b)
	ctx := context.Background()
	fence, err := s.NewFence(ctx, postgres.FenceOptions{Idle: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer fence.Close()
	lease, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "bench", Holder: "w", TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	v, err := fence.Hold(ctx, lease.ID)
	if err != nil || v.Refusal != nil {
		b.Fatal(err, v.Refusal)
	}
	held := v.Held
	defer held.Release()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := held.Check(time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}
