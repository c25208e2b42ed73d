package postgres_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// A superseded lease's next writes are refused from the stale cache, with
// no store read; a grant through the same service makes the next refusal
// read again and report the new current token. On the production path:
// a Service whose writes the PostgreSQL fence admits.
func TestStaleLeaseIsRefusedFromCache(t *testing.T) {
	t.Parallel()
	r := pgtest.FenceReplicas(t, 1, storagetest.FenceOptions{}, nil)[0]
	svc, rejections := recordingService(r)
	ctx := t.Context()
	acquire := func(ttl time.Duration) tokens.Lease { t.Helper(); return acquireOn(t, svc, "r", ttl) }
	old := acquire(100 * time.Millisecond)
	storagetest.WaitPast(t, r.Store, "r", old.ExpiresAt)
	second := acquire(100 * time.Millisecond)
	write := func() {
		t.Helper()
		if _, err := svc.Admit(ctx, old.ID, tokens.Write{Method: "POST"}); !errors.Is(err, tokens.ErrStaleToken) {
			t.Fatalf("stale write: %v", err)
		}
	}
	before := r.Reads()
	write()
	if r.Reads() == before {
		t.Fatal("the first refusal of a superseded lease read nothing: it must be judged on the store's state")
	}
	reads := r.Reads()
	for range 20 {
		write()
	}
	if n := r.Reads() - reads; n != 0 {
		t.Fatalf("20 more refusals of the same superseded lease read the store %d times, want 0", n)
	}
	storagetest.WaitPast(t, r.Store, "r", second.ExpiresAt)
	third := acquire(time.Minute)
	write()
	recorded := rejections()
	if len(recorded) != 22 || recorded[20].CurrentToken != second.Token || recorded[21].CurrentToken != third.Token {
		t.Fatalf("%d recorded; current tokens %d then %d, want %d then %d", len(recorded),
			recorded[20].CurrentToken, recorded[len(recorded)-1].CurrentToken, second.Token, third.Token)
	}
}

// A write under a lease that has ended (superseded, expired, released) is
// refused by the fence from one read of the lease and its fence state,
// without taking the resource's shared fence; a write under the current
// lease takes it. The refusal is recorded with the facts of the moment.
func TestAdmitRefusesEndedLeasesWithoutAFence(t *testing.T) {
	t.Parallel()
	r := pgtest.FenceReplicas(t, 1, storagetest.FenceOptions{}, nil)[0]
	fence := r.Fencer.(*postgres.Fence)
	svc, rejections := recordingService(r)
	ctx := t.Context()
	acquire := func(res string, ttl time.Duration) tokens.Lease { t.Helper(); return acquireOn(t, svc, res, ttl) }
	superseded := acquire("a", 100*time.Millisecond)
	expired := acquire("b", 100*time.Millisecond)
	released := acquire("c", time.Minute)
	if _, err := svc.Release(ctx, released.ID, ""); err != nil {
		t.Fatal(err)
	}
	storagetest.WaitPast(t, r.Store, "a", superseded.ExpiresAt)
	storagetest.WaitPast(t, r.Store, "b", expired.ExpiresAt)
	current := acquire("a", time.Minute)

	for _, tc := range []struct {
		lease tokens.Lease
		kind  error
	}{{superseded, tokens.ErrStaleToken}, {expired, tokens.ErrLeaseExpired}, {released, tokens.ErrLeaseReleased}} {
		fences, reads := fence.Stats().Acquired.Load(), r.Reads()
		_, err := svc.Admit(ctx, tc.lease.ID, tokens.Write{Method: "POST", Upstream: "up", Path: "/x"})
		if !errors.Is(err, tc.kind) {
			t.Fatalf("write under %s's lease: %v, want %v", tc.lease.Resource, err, tc.kind)
		}
		if n := fence.Stats().Acquired.Load() - fences; n != 0 {
			t.Errorf("refusing %v took %d shared fences, want 0", tc.kind, n)
		}
		if n := r.Reads() - reads; n != 1 {
			t.Errorf("refusing %v read the lease state %d times, want 1", tc.kind, n)
		}
	}
	if recorded := rejections(); len(recorded) != 3 || recorded[0].Code != tokens.CodeStaleToken || recorded[0].Token != superseded.Token || recorded[0].CurrentToken != current.Token ||
		recorded[1].Code != tokens.CodeLeaseExpired || recorded[1].LeaseEndedAt.IsZero() || recorded[2].Code != tokens.CodeLeaseReleased {
		t.Fatalf("recorded %+v", recorded)
	}

	fences := fence.Stats().Acquired.Load()
	p, err := svc.Admit(ctx, current.ID, tokens.Write{Method: "POST", Upstream: "up", Path: "/x"})
	if err != nil {
		t.Fatalf("write under the current lease: %v", err)
	}
	p.Done(tokens.OutcomeKnown)
	if n := fence.Stats().Acquired.Load() - fences; n != 1 {
		t.Fatalf("admitting the current lease took %d shared fences, want 1", n)
	}
	if _, err := svc.Admit(ctx, "fl_unknown", tokens.Write{}); !errors.Is(err, tokens.ErrUnknownLease) {
		t.Fatalf("unknown lease: %v", err)
	}
}

// recordingService is a Service on replica r, as the PostgreSQL mode wires
// one (its fence admits writes and is its exclusive lock), that keeps every
// rejection it reports; rejections returns them so far.
func recordingService(r *storagetest.FenceReplica) (svc *tokens.Service, rejections func() []tokens.Rejection) {
	var mu sync.Mutex
	var recorded []tokens.Rejection
	svc = tokens.New(tokens.Config{Store: r.Store, Fencer: r.Fencer, OnRejection: func(r tokens.Rejection) {
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
