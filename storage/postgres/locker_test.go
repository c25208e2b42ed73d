package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

// The fence (postgres.Fence, whose lock both PostgreSQL modes serve with:
// the Redis mode locks in PostgreSQL too) passes the Locker suite as the
// Service takes it: writes through Hold, grants with Exclusive
// (RunFenceLock), each replica on its own pool of one schema.
func TestFenceLockConformance(t *testing.T) {
	pgtest.Require(t)
	storagetest.RunFenceLock(t, storagetest.FenceHarness{
		Replicas: func(t *testing.T, n int, opts storagetest.FenceOptions) []*storagetest.FenceReplica {
			return pgtest.FenceReplicas(t, n, opts, nil)
		},
	})
}

// An exclusive lock (a grant's, a release's, a revoke's) dies with its
// session: the database frees it, the next exclusive taker proceeds, and
// the holder learns it at unlock.
func TestLockerSessionKilled(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	held, err := a.ExclusiveFence(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	ex := acquireAsync(ctx, func(ctx context.Context, r string) (func(), error) {
		l, err := b.ExclusiveFence(ctx, r)
		if err != nil {
			return nil, err
		}
		return func() { _ = l.Unlock() }, nil
	}, "r")
	mustNotHappen(t, ex, "exclusive while another exclusive held")

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", postgres.LockPID(held)); err != nil {
		t.Fatal(err)
	}
	// The database freed the lock with the session...
	mustHappen(t, ex, "exclusive after the holder's session died")()
	// ...and the holder learns it at unlock.
	if err := held.Unlock(); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Unlock of a lost lock: %v, want ErrStoreUnavailable", err)
	}
	if err := held.Unlock(); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("second Unlock: %v", err)
	}
	// The pool is healthy afterwards.
	l, err := a.ExclusiveFence(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// A lock wait whose lock_timeout fires just as the holder lets go may be
// granted all the same: PostgreSQL then reports the timeout and keeps the
// lock (LockErrorCleanup in proc.c), and a session-level lock outlives the
// error. A Store that put such a connection back in its pool held the
// resource's lock for good: its next grant drew it and got the lock at
// once, every other session's writes waited for it until their own
// lock_timeout and were answered 503 (TestConcurrentWorkersUpstreamLog
// under load). Here holders let go around the waiters' lock_timeout, again
// and again: after every timed-out wait, nobody may hold the lock.
func TestLockTimeoutRacingTheGrantKeepsNoLock(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	const (
		lockTimeout = 5 * time.Millisecond
		resources   = 4
		rounds      = 150
	)
	holders := pgtest.Open(t, schema, postgres.Options{})
	waiters := pgtest.Open(t, schema, postgres.Options{LockTimeout: lockTimeout, MaxLockConns: resources})
	ctx := t.Context()
	var timedOut atomic.Int64
	var wg sync.WaitGroup
	for r := range resources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resource := fmt.Sprintf("race-%d", r)
			key := holders.LockKey(resource)
			for i := range rounds {
				held, err := holders.ExclusiveFence(ctx, resource)
				if err != nil {
					t.Error(err)
					return
				}
				let := make(chan struct{})
				go func() {
					defer close(let)
					// Around the waiter's lock_timeout, a little later each round.
					time.Sleep(lockTimeout - time.Millisecond + time.Duration(i%8)*250*time.Microsecond)
					_ = held.Unlock()
				}()
				// No deadline: the wait ends by lock_timeout alone.
				got, err := waiters.ExclusiveFence(context.WithoutCancel(ctx), resource)
				<-let
				switch {
				case err == nil:
					if err := got.Unlock(); err != nil {
						t.Error(err)
						return
					}
					continue
				case !errors.Is(err, context.DeadlineExceeded):
					t.Errorf("lock wait: %v, want a timeout", err)
					return
				}
				timedOut.Add(1)
				var n int
				err = holders.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks
					WHERE locktype = 'advisory' AND granted AND objsubid = 1
						AND classid::bigint = $1 AND objid::bigint = $2`,
					int64(uint64(key)>>32), int64(uint32(key))).Scan(&n)
				if err != nil {
					t.Error(err)
					return
				}
				if n != 0 {
					t.Errorf("%s, round %d: the wait timed out, yet a session holds the lock", resource, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	if timedOut.Load() == 0 {
		t.Fatal("void run: no lock wait timed out")
	}
	t.Logf("%d of %d lock waits timed out", timedOut.Load(), resources*rounds)
}
