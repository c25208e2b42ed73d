package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// countingLocker counts shared locks taken through it.
type countingLocker struct {
	tokens.Locker
	shared atomic.Int64
}

func (c *countingLocker) Shared(ctx context.Context, resource string) (func(), error) {
	c.shared.Add(1)
	return c.Locker.Shared(ctx, resource)
}

// countingStore counts the lease reads of the write path.
type countingStore struct {
	*postgres.Store
	reads atomic.Int64
}

func (c *countingStore) LeaseState(ctx context.Context, id string) (tokens.Lease, tokens.Resource, error) {
	c.reads.Add(1)
	return c.Store.LeaseState(ctx, id)
}

// A superseded lease's next writes are refused from the stale cache, with
// no store read; a grant through the same service makes the next refusal
// read again and report the new current token.
func TestStaleLeaseIsRefusedFromCache(t *testing.T) {
	t.Parallel()
	pg := pgtest.OpenFresh(t)
	st := &countingStore{Store: pg}
	svc, rejections := recordingService(st, pg)
	ctx := t.Context()
	acquire := func(ttl time.Duration) tokens.Lease { t.Helper(); return acquireOn(t, svc, "r", ttl) }
	old := acquire(100 * time.Millisecond)
	storagetest.WaitPast(t, pg, "r", old.ExpiresAt)
	second := acquire(100 * time.Millisecond)
	write := func() {
		t.Helper()
		if _, err := svc.Admit(ctx, old.ID, tokens.Write{Method: "POST"}); !errors.Is(err, tokens.ErrStaleToken) {
			t.Fatalf("stale write: %v", err)
		}
	}
	write()
	reads := st.reads.Load()
	for range 20 {
		write()
	}
	if n := st.reads.Load() - reads; n != 0 {
		t.Fatalf("20 more refusals of the same superseded lease read the store %d times, want 0", n)
	}
	storagetest.WaitPast(t, pg, "r", second.ExpiresAt)
	third := acquire(time.Minute)
	write()
	recorded := rejections()
	if len(recorded) != 22 || recorded[20].CurrentToken != second.Token || recorded[21].CurrentToken != third.Token {
		t.Fatalf("%d recorded; current tokens %d then %d, want %d then %d", len(recorded),
			recorded[20].CurrentToken, recorded[len(recorded)-1].CurrentToken, second.Token, third.Token)
	}
}

// On PostgreSQL a write under a lease that has ended (superseded, expired,
// released) is refused from one read of the lease and its fence, without
// the resource's shared lock; a write under the current lease still takes
// it. The refusal is recorded with the facts of the moment.
func TestAdmitRefusesEndedLeasesWithoutTheLock(t *testing.T) {
	t.Parallel()
	st := pgtest.OpenFresh(t)
	locker := &countingLocker{Locker: st}
	svc, rejections := recordingService(st, locker)
	ctx := t.Context()
	acquire := func(res string, ttl time.Duration) tokens.Lease { t.Helper(); return acquireOn(t, svc, res, ttl) }
	superseded := acquire("a", 100*time.Millisecond)
	expired := acquire("b", 100*time.Millisecond)
	released := acquire("c", time.Minute)
	if _, err := svc.Release(ctx, released.ID, ""); err != nil {
		t.Fatal(err)
	}
	storagetest.WaitPast(t, st, "a", superseded.ExpiresAt)
	storagetest.WaitPast(t, st, "b", expired.ExpiresAt)
	current := acquire("a", time.Minute)

	for _, tc := range []struct {
		lease tokens.Lease
		kind  error
	}{{superseded, tokens.ErrStaleToken}, {expired, tokens.ErrLeaseExpired}, {released, tokens.ErrLeaseReleased}} {
		before := locker.shared.Load()
		_, err := svc.Admit(ctx, tc.lease.ID, tokens.Write{Method: "POST", Upstream: "up", Path: "/x"})
		if !errors.Is(err, tc.kind) {
			t.Fatalf("write under %s's lease: %v, want %v", tc.lease.Resource, err, tc.kind)
		}
		if n := locker.shared.Load() - before; n != 0 {
			t.Errorf("refusing %v took %d shared locks, want 0", tc.kind, n)
		}
	}
	if recorded := rejections(); len(recorded) != 3 || recorded[0].Code != tokens.CodeStaleToken || recorded[0].Token != superseded.Token || recorded[0].CurrentToken != current.Token ||
		recorded[1].Code != tokens.CodeLeaseExpired || recorded[1].LeaseEndedAt.IsZero() || recorded[2].Code != tokens.CodeLeaseReleased {
		t.Fatalf("recorded %+v", recorded)
	}

	before := locker.shared.Load()
	p, err := svc.Admit(ctx, current.ID, tokens.Write{Method: "POST", Upstream: "up", Path: "/x"})
	if err != nil {
		t.Fatalf("write under the current lease: %v", err)
	}
	p.Done(tokens.OutcomeKnown)
	if n := locker.shared.Load() - before; n != 1 {
		t.Fatalf("admitting the current lease took %d shared locks, want 1", n)
	}
	if _, err := svc.Admit(ctx, "fl_unknown", tokens.Write{}); !errors.Is(err, tokens.ErrUnknownLease) {
		t.Fatalf("unknown lease: %v", err)
	}
}

// recordingService is a Service on store and locker that keeps every
// rejection it reports; rejections returns them so far.
func recordingService(store tokens.Store, locker tokens.Locker) (svc *tokens.Service, rejections func() []tokens.Rejection) {
	var mu sync.Mutex
	var recorded []tokens.Rejection
	svc = tokens.New(tokens.Config{Store: store, Locker: locker, OnRejection: func(r tokens.Rejection) {
		mu.Lock()
		recorded = append(recorded, r)
		mu.Unlock()
	}})
	return svc, func() []tokens.Rejection {
		mu.Lock()
		defer mu.Unlock()
		return append([]tokens.Rejection(nil), recorded...)
	}
}

func acquireOn(t *testing.T, svc *tokens.Service, resource string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "w", TTL: ttl, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire %s: %v", resource, err)
	}
	return l
}
