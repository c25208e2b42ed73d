package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// twoReplicas opens two Stores on one schema: two gateways.
func twoReplicas(t *testing.T) (*postgres.Store, *postgres.Store) {
	schema := pgtest.NewSchema(t)
	return pgtest.Open(t, schema, postgres.Options{}), pgtest.Open(t, schema, postgres.Options{})
}

// acquireAsync starts a lock request and reports its outcome on a channel.
func acquireAsync(ctx context.Context, lock func(context.Context, string) (func(), error), resource string) <-chan func() {
	ch := make(chan func(), 1)
	go func() {
		unlock, err := lock(ctx, resource)
		if err != nil {
			close(ch)
			return
		}
		ch <- unlock
	}()
	return ch
}

func mustNotHappen(t *testing.T, ch <-chan func(), what string) {
	t.Helper()
	select {
	case u, ok := <-ch:
		if ok {
			u()
		}
		t.Fatalf("%s happened too early", what)
	case <-time.After(200 * time.Millisecond):
	}
}

func mustHappen(t *testing.T, ch <-chan func(), what string) func() {
	t.Helper()
	select {
	case u, ok := <-ch:
		if !ok {
			t.Fatalf("%s failed", what)
		}
		return u
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not happen", what)
	}
	return nil
}

// The advisory lock per write (postgres.Store as a tokens.Locker) and the
// fence kept across writes (postgres.Fence, the Locker both PostgreSQL modes
// serve with: the Redis mode locks in PostgreSQL too) pass the Locker
// suite, with each replica on its own pool of one schema.
func TestLockerConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunLocker(t, storagetest.LockerHarness{
		Replicas: func(t *testing.T, n int) []tokens.Locker {
			schema := pgtest.NewSchema(t)
			out := make([]tokens.Locker, n)
			for i := range out {
				out[i] = pgtest.Open(t, schema, postgres.Options{})
			}
			return out
		},
	})
}

func TestFenceLockerConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunLocker(t, storagetest.LockerHarness{
		Replicas: func(t *testing.T, n int) []tokens.Locker {
			var out []tokens.Locker
			for _, r := range pgtest.FenceReplicas(t, n, storagetest.FenceOptions{}, nil) {
				out = append(out, r.Locker)
			}
			return out
		},
		// A replica asked to give its fence up does so even if the
		// exclusive request gives up first: the writes that queued on it
		// meanwhile wait for the ones in flight (bounded by the forward
		// timeout), then take the fence anew.
		YieldIsFinal: true,
	})
}

func TestLockerSessionKilled(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	held, err := a.SharedLock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	ex := acquireAsync(ctx, b.Exclusive, "r")
	mustNotHappen(t, ex, "exclusive while shared held")

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", postgres.LockPID(held)); err != nil {
		t.Fatal(err)
	}
	// The database freed the lock with the session (the documented limit)...
	mustHappen(t, ex, "exclusive after the shared holder's session died")()
	// ...and the holder learns it at unlock.
	if err := held.Unlock(); !errors.Is(err, tokens.ErrUnavailable) {
		t.Fatalf("Unlock of a lost lock: %v, want ErrUnavailable", err)
	}
	if err := held.Unlock(); !errors.Is(err, tokens.ErrUnavailable) {
		t.Fatalf("second Unlock: %v", err)
	}
	// The pool is healthy afterwards.
	u, err := a.Exclusive(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	u()
}
