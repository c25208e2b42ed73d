package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

// The database calls of an acquire and a renewal carry the client's bound
// (its wait; --grant-wait for a renewal), not only the statement timeout:
// with the resource's rows locked by another session (a long transaction,
// a migration), both answer store_unavailable by their bound.
func TestStoreCallsEndByTheClientsBound(t *testing.T) {
	schema := pgtest.NewSchema(t)
	// A statement timeout far past the bounds: only the bounds can end
	// the calls in time.
	s := pgtest.Open(t, schema, postgres.Options{StatementTimeout: time.Minute})
	ctx := t.Context()
	// Wired as the PostgreSQL mode wires it: its fence admits writes and
	// is its lock.
	fence, err := s.NewFence(ctx, postgres.FenceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fence.Close) // before the store's Close
	const grantWait = time.Second
	svc := tokens.New(tokens.Config{Store: s, Fencer: fence, GrantWait: grantWait})
	held, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: "held", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	free, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: "free", Holder: "w", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Release(ctx, free.ID, ""); err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	for _, q := range []string{
		`SELECT 1 FROM ` + pgx.Identifier{schema, "fences"}.Sanitize() + ` WHERE resource IN ('held', 'free') FOR UPDATE`,
		`SELECT 1 FROM ` + pgx.Identifier{schema, "leases"}.Sanitize() + ` WHERE resource IN ('held', 'free') FOR UPDATE`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	// The bound is the behaviour: without it the calls would wait for the
	// rows (a minute's statement timeout). Generous margin.
	const wait, margin = 500 * time.Millisecond, 5 * time.Second
	start := time.Now()
	_, err = svc.Acquire(ctx, tokens.AcquireRequest{Resource: "free", Holder: "w", TTL: time.Minute, Wait: wait})
	took := time.Since(start)
	if !errors.Is(err, tokens.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) || took > wait+margin {
		t.Fatalf("acquire of a locked resource: %v after %v; want store_unavailable by its wait %v", err, took, wait)
	}
	start = time.Now()
	_, err = svc.Renew(ctx, tokens.RenewRequest{LeaseID: held.ID})
	took = time.Since(start)
	if !errors.Is(err, tokens.ErrStoreUnavailable) || !errors.Is(err, context.DeadlineExceeded) || took > grantWait+margin {
		t.Fatalf("renewal of a locked lease: %v after %v; want store_unavailable by the grant wait %v", err, took, grantWait)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Renew(ctx, tokens.RenewRequest{LeaseID: held.ID}); err != nil {
		t.Fatalf("renewal once the rows are free: %v", err)
	}
}
