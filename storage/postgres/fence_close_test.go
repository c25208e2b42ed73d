package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// A replica closed while a write is still in flight (its drain gave up on
// it) closes the sessions that held its fence, and so the fence goes with
// them: the write must learn that, as it would from a session that died.
// Its Lost channel closes, which makes the engine reset a half-sent
// request, and its next proof fails, so no byte of it leaves afterwards.
func TestCloseDropsFencesWithWritesInFlight(t *testing.T) {
	pgtest.Require(t)
	r := pgtest.FenceReplicas(t, 1, storagetest.FenceOptions{SessionCheck: 200 * time.Millisecond, DrainPeriod: time.Second, Idle: time.Minute}, nil)[0]
	fence := r.Fencer.(*postgres.Fence)
	ctx := context.Background()
	lease, err := r.Store.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "closing", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	v, err := fence.Hold(ctx, lease.ID)
	if err != nil || v.Refusal != nil {
		t.Fatalf("admit the write: %v, refusal %v", err, v.Refusal)
	}
	inflight := v.Held
	// Released only after Close, as a write still forwarding would be.
	defer inflight.Release()
	if err := inflight.Check(time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the write just admitted cannot prove its fence: %v", err)
	}
	lost := inflight.Lost()
	select {
	case <-lost:
		t.Fatal("the write just admitted is told its fence is lost")
	default:
	}

	// Close waits a few seconds for the write to finish, then gives up on
	// it; the bound here only keeps a hung Close from hanging the test.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		fence.Close()
	}()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close with a write in flight did not return")
	}
	select {
	case <-lost:
	default:
		t.Fatal("after Close the write in flight was not told its fence is lost (Lost still open): a half-sent request would stay open at the upstream")
	}
	if err := inflight.Check(time.Now().Add(time.Minute)); !errors.Is(err, tokens.ErrFenceLost) {
		t.Fatalf("after Close the write in flight proves its fence: Check = %v, want ErrFenceLost", err)
	}
}
