package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

// countingReads counts the reads of the embedded write path.
type countingReads struct {
	*Store
	reads atomic.Int64
}

func (c *countingReads) Lease(ctx context.Context, id string) (tokens.Lease, error) {
	c.reads.Add(1)
	return c.Store.Lease(ctx, id)
}

func (c *countingReads) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	c.reads.Add(1)
	return c.Store.Resource(ctx, name)
}

// countingShared counts the shared locks writes take.
type countingShared struct {
	*tokens.LocalLocker
	shared atomic.Int64
}

func (c *countingShared) Shared(ctx context.Context, resource string) (func(), error) {
	c.shared.Add(1)
	return c.LocalLocker.Shared(ctx, resource)
}

// The embedded mode's admission, as it is wired (bolt and a LocalLocker,
// no Fencer): a write is judged on the state read under its resource's
// shared lock, ended leases included; a superseded lease's later writes are
// refused from the stale cache, with no read and no lock, until a grant
// through the Service makes the next refusal read again and report the new
// current token.
func TestEmbeddedAdmission(t *testing.T) {
	t.Parallel()
	st := &countingReads{Store: openAt(t, filepath.Join(t.TempDir(), "f.db"), Options{})}
	locker := &countingShared{LocalLocker: tokens.NewLocalLocker()}
	var mu sync.Mutex
	var recorded []tokens.Rejection
	svc := tokens.New(tokens.Config{Store: st, Locker: locker, Logger: quiet, OnRejection: func(r tokens.Rejection) {
		mu.Lock()
		recorded = append(recorded, r)
		mu.Unlock()
	}})
	ctx := t.Context()
	acquire := func(res string, ttl time.Duration) tokens.Lease {
		t.Helper()
		l, err := svc.Acquire(ctx, tokens.AcquireRequest{Resource: res, Holder: "w", TTL: ttl, Wait: 5 * time.Second})
		if err != nil {
			t.Fatalf("acquire %s: %v", res, err)
		}
		return l
	}
	write := func(l tokens.Lease, want error) {
		t.Helper()
		p, err := svc.Admit(ctx, l.ID, tokens.Write{Method: "POST", Upstream: "up", Path: "/x"})
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("write under %s's token %d: %v, want %v", l.Resource, l.Token, err, want)
		}
		if p != nil {
			p.Done(tokens.OutcomeKnown)
		}
	}
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
	}{{current, nil}, {superseded, tokens.ErrStaleToken}, {expired, tokens.ErrLeaseExpired}, {released, tokens.ErrLeaseReleased}} {
		before := locker.shared.Load()
		write(tc.lease, tc.kind)
		if n := locker.shared.Load() - before; n != 1 {
			t.Errorf("judging a write under %s's lease (%v) took %d shared locks, want 1", tc.lease.Resource, tc.kind, n)
		}
	}

	reads, locks := st.reads.Load(), locker.shared.Load()
	for range 20 {
		write(superseded, tokens.ErrStaleToken)
	}
	if n, m := st.reads.Load()-reads, locker.shared.Load()-locks; n != 0 || m != 0 {
		t.Fatalf("20 more refusals of the same superseded lease read the store %d times and took %d locks, want 0", n, m)
	}
	if _, err := svc.Release(ctx, current.ID, ""); err != nil {
		t.Fatal(err)
	}
	third := acquire("a", time.Minute)
	write(superseded, tokens.ErrStaleToken)

	mu.Lock()
	defer mu.Unlock()
	if len(recorded) != 24 || recorded[0].Code != tokens.CodeStaleToken || recorded[0].CurrentToken != current.Token ||
		recorded[1].Code != tokens.CodeLeaseExpired || recorded[1].LeaseEndedAt.IsZero() || recorded[2].Code != tokens.CodeLeaseReleased ||
		recorded[22].CurrentToken != current.Token || recorded[23].CurrentToken != third.Token {
		t.Fatalf("recorded %d: %+v", len(recorded), recorded)
	}
}
