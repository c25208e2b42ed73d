package storagetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// RunFenceLock runs the lock conformance suite of a tokens.Fencer, driven
// as tokens.Service drives it: a write holds its resource's shared fence
// from Hold (under a lease of the resource that stays current throughout)
// until Held.Release, and grants, releases and revokes take Exclusive. It
// checks what RunLocker checks of a Locker, across two replicas: shared
// holders coexist, exclusive excludes both, a waiting exclusive request is
// not overtaken by later writes (writer preference), a wait ends with its
// context and leaves no one queued behind it, release and unlock may be
// called again, and resources are independent. Where a Fencer differs from
// a Locker: writes that queued behind an exclusive request wait for the
// writes of that time to finish even if the exclusive request gives up (a
// replica that began giving its fence up finishes doing so).
//
// What did not happen is checked by waiting a while for it (lockQuiet): such
// a check can pass wrongly on a slow machine, never fail wrongly.
func RunFenceLock(t *testing.T, h FenceHarness) {
	if h.Replicas == nil {
		t.Fatal("storagetest: FenceHarness.Replicas is required")
	}
	runParallel(t, h, []suiteTest[FenceHarness]{
		{"HeldWritesCoexist", testFenceLockHeldCoexist},
		{"ExclusiveWaitsForHeldWrites", testFenceLockExclusiveWaitsForHeld},
		{"HoldWaitsForExclusive", testFenceLockHoldWaitsForExclusive},
		{"ExclusiveWaitsForExclusive", testFenceLockExclusiveWaitsForExclusive},
		{"WriterPreference", testFenceLockWriterPreference},
		{"ResourcesIndependent", testFenceLockResourcesIndependent},
		{"Deadline", testFenceLockDeadline},
		{"Cancel", testFenceLockCancel},
		{"GivenUpWaitFreesQueue", testFenceLockGivenUpWaitFreesQueue},
		{"ReleaseTwice", testFenceLockReleaseTwice},
		{"MutualExclusion", testFenceLockMutualExclusion},
	})
}

// fenceLock is one replica's Fencer with the leases its writes are under.
type fenceLock struct {
	f      tokens.Fencer
	leases map[string]tokens.Lease // resource -> its current lease
}

// fenceLocks opens two replicas and grants each resource a lease that
// outlasts the test; writes on either replica go under it.
func fenceLocks(t *testing.T, h FenceHarness, resources ...string) []fenceLock {
	t.Helper()
	rs := h.Replicas(t, 2, fenceOpts)
	leases := make(map[string]tokens.Lease)
	for _, r := range resources {
		leases[r] = grant(t, rs[0].Store, r, "w", time.Hour)
	}
	return []fenceLock{{rs[0].Fencer, leases}, {rs[1].Fencer, leases}}
}

// hold admits a write under resource's lease (Fencer.Hold); its unlock is
// the write's Held.Release.
func (l fenceLock) hold(ctx context.Context, resource string) (func(), error) {
	lease, ok := l.leases[resource]
	if !ok {
		return nil, fmt.Errorf("no lease of %s", resource)
	}
	v, err := l.f.Hold(ctx, lease.ID)
	if err != nil {
		return nil, err
	}
	if v.Refusal != nil || v.Held == nil {
		return nil, fmt.Errorf("write under the current lease of %s refused: %w", resource, v.Refusal)
	}
	return v.Held.Release, nil
}

func (l fenceLock) exclusive(ctx context.Context, resource string) (func(), error) {
	return l.f.Exclusive(ctx, resource)
}

func testFenceLockHeldCoexist(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	a1 := lockNow(t, ls[0].hold, r, "first write on a")
	a2 := lockNow(t, ls[0].hold, r, "second write on a")
	b := lockNow(t, ls[1].hold, r, "write on b beside a's")
	a1()
	a2()
	b()
}

func testFenceLockExclusiveWaitsForHeld(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	wa := lockNow(t, ls[0].hold, r, "write on a")
	wb := lockNow(t, ls[1].hold, r, "write on b")
	ex := lockAsync(t.Context(), ls[1].exclusive, r)
	ex.waits(t, "exclusive while a and b have writes in flight")
	wa()
	ex.waits(t, "exclusive while b has a write in flight")
	wb()
	ex.granted(t, "exclusive after the writes finished")()
}

func testFenceLockHoldWaitsForExclusive(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	ex := lockNow(t, ls[0].exclusive, r, "exclusive on a")
	wa := lockAsync(t.Context(), ls[0].hold, r)
	wb := lockAsync(t.Context(), ls[1].hold, r)
	wa.waits(t, "write on a while a holds exclusive")
	wb.waits(t, "write on b while a holds exclusive")
	ex()
	wa.granted(t, "write on a after the exclusive")()
	wb.granted(t, "write on b after the exclusive")()
}

func testFenceLockExclusiveWaitsForExclusive(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	first := lockNow(t, ls[0].exclusive, r, "exclusive on a")
	other := lockAsync(t.Context(), ls[1].exclusive, r)
	same := lockAsync(t.Context(), ls[0].exclusive, r)
	other.waits(t, "exclusive on b while a holds exclusive")
	same.waits(t, "second exclusive on a while a holds exclusive")
	first()
	// One of the two goes first; the other waits for it.
	next, last := other, same
	select {
	case <-other.done:
	case <-same.done:
		next, last = same, other
	case <-time.After(waitLimit):
		t.Fatalf("neither waiting exclusive was granted within %v", waitLimit)
	}
	u := next.granted(t, "the first waiting exclusive")
	last.waits(t, "the other waiting exclusive while the first holds the lock")
	u()
	last.granted(t, "the other waiting exclusive after the first")()
}

// A waiting exclusive request blocks later writes, on every replica,
// although only writes hold the fence: a steady stream of writes must not
// starve a grant.
func testFenceLockWriterPreference(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	ctx := t.Context()
	w := lockNow(t, ls[0].hold, r, "write on a")
	ex := lockAsync(ctx, ls[1].exclusive, r)
	ex.waits(t, "exclusive while a has a write in flight")
	lateA := lockAsync(ctx, ls[0].hold, r)
	lateB := lockAsync(ctx, ls[1].hold, r)
	lateA.waits(t, "a later write on a overtaking the waiting exclusive")
	lateB.waits(t, "a later write on b overtaking the waiting exclusive")
	w()
	u := ex.granted(t, "exclusive after the earlier write finished")
	lateA.waits(t, "a later write on a during the exclusive")
	lateB.waits(t, "a later write on b during the exclusive")
	u()
	lateA.granted(t, "later write on a after the exclusive")()
	lateB.granted(t, "later write on b after the exclusive")()
}

func testFenceLockResourcesIndependent(t *testing.T, h FenceHarness) {
	r, other := resourceName(t, "r"), resourceName(t, "other")
	ls := fenceLocks(t, h, r, other)
	ex := lockNow(t, ls[0].exclusive, r, "exclusive on r")
	wo := lockNow(t, ls[1].hold, other, "write on another resource beside r's exclusive")
	wo()
	eo := lockNow(t, ls[1].exclusive, other, "exclusive on another resource beside r's exclusive")
	eo()
	ex()
}

// A wait ends with its context, with an error that wraps the context's
// (tokens.Service tells a timeout from a broken store by it), for either
// side: past its deadline (DeadlineExceeded) or cancelled (Canceled).
func testFenceLockDeadline(t *testing.T, h FenceHarness) {
	testFenceLockWaitEnds(t, h, context.DeadlineExceeded, func(ctx context.Context) (context.Context, func()) {
		return context.WithTimeout(ctx, lockQuiet)
	})
}

func testFenceLockCancel(t *testing.T, h FenceHarness) {
	testFenceLockWaitEnds(t, h, context.Canceled, func(ctx context.Context) (context.Context, func()) {
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(lockQuiet, cancel)
		return ctx, cancel
	})
}

// testFenceLockWaitEnds: a wait under a context from end fails with want,
// and the fence is usable afterwards.
func testFenceLockWaitEnds(t *testing.T, h FenceHarness, want error, end func(context.Context) (context.Context, func())) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	for _, c := range []struct {
		hold, wait lockFunc
		what       string
	}{
		{ls[0].hold, ls[1].exclusive, "Exclusive while a has a write in flight"},
		{ls[0].exclusive, ls[1].hold, "Hold while a holds exclusive"},
	} {
		unlock := lockNow(t, c.hold, r, "a's lock")
		ctx, cancel := end(t.Context())
		if u, err := c.wait(ctx, r); !errors.Is(err, want) {
			if err == nil {
				u()
			}
			t.Fatalf("%s: %v, want an error wrapping %v", c.what, err, want)
		}
		cancel()
		unlock()
	}
	lockNow(t, ls[1].exclusive, r, "exclusive on b after the waits ended")()
	lockNow(t, ls[0].hold, r, "write on a after the waits ended")()
}

// An exclusive request that gives up while writes queue behind it lets
// them in once the writes it waited for have finished: a replica that
// began giving its fence up finishes doing so, and the queue goes with
// the request.
func testFenceLockGivenUpWaitFreesQueue(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	w := lockNow(t, ls[0].hold, r, "write on a")
	ctx, cancel := context.WithCancel(t.Context())
	ex := lockAsync(ctx, ls[1].exclusive, r)
	ex.waits(t, "exclusive while a has a write in flight")
	queuedA := lockAsync(t.Context(), ls[0].hold, r)
	queuedB := lockAsync(t.Context(), ls[1].hold, r)
	queuedA.waits(t, "write on a behind the waiting exclusive")
	queuedB.waits(t, "write on b behind the waiting exclusive")
	cancel()
	ex.failed(t, "cancelled exclusive")
	w()
	queuedA.granted(t, "write on a after the exclusive gave up")()
	queuedB.granted(t, "write on b after the exclusive gave up")()
	lockNow(t, ls[1].exclusive, r, "exclusive after every write finished")()
}

// Releasing a write again does nothing: in particular a second call for
// one write does not release another write's hold on the same fence; nor
// does unlocking an exclusive lock again.
func testFenceLockReleaseTwice(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	wa := lockNow(t, ls[0].hold, r, "write on a")
	wa2 := lockNow(t, ls[0].hold, r, "second write on a")
	wb := lockNow(t, ls[1].hold, r, "write on b")
	wa()
	wa()
	ex := lockAsync(t.Context(), ls[1].exclusive, r)
	ex.waits(t, "exclusive while a's second and b's writes are in flight, after one release called twice")
	wb()
	ex.waits(t, "exclusive while a's second write is in flight")
	wa2()
	u := ex.granted(t, "exclusive after every write finished")
	wb() // late repeats change nothing
	wa2()
	late := lockAsync(t.Context(), ls[0].hold, r)
	late.waits(t, "write during the exclusive, after repeated releases")
	u()
	u()
	late.granted(t, "write after the exclusive")()
	lockNow(t, ls[0].exclusive, r, "exclusive after every release")()
}

// Under concurrent writes and exclusive requests from two replicas, an
// exclusive holder is always alone.
func testFenceLockMutualExclusion(t *testing.T, h FenceHarness) {
	r := resourceName(t, "r")
	ls := fenceLocks(t, h, r)
	var writes, exclusives atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		l := ls[i%2]
		wg.Go(func() {
			for range 25 {
				ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
				if i%4 == 0 {
					u, err := l.exclusive(ctx, r)
					cancel()
					if err != nil {
						t.Errorf("Exclusive: %v", err)
						return
					}
					if exclusives.Add(1) != 1 || writes.Load() != 0 {
						t.Error("exclusive lock held beside another holder")
					}
					exclusives.Add(-1)
					u()
				} else {
					u, err := l.hold(ctx, r)
					cancel()
					if err != nil {
						t.Errorf("Hold: %v", err)
						return
					}
					writes.Add(1)
					if exclusives.Load() != 0 {
						t.Error("a write admitted beside an exclusive lock")
					}
					writes.Add(-1)
					u()
				}
			}
		})
	}
	wg.Wait()
}
