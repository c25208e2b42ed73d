package storagetest

// The Locker suite (RunLocker): shared and exclusive locks per resource,
// writer preference, and contexts that end a wait.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// LockerHarness tells RunLocker how to get lockers of the implementation
// under test.
type LockerHarness struct {
	// Replicas returns n lockers over one lock space, as n gateway
	// replicas would have them: a lock taken on one is seen by all. An
	// in-process locker returns one locker n times (one process is one
	// replica). Cleanup is registered with t.
	Replicas func(t *testing.T, n int) []tokens.Locker
}

// lockHarness is what the lock suite runs on: a Locker's two sides, or a
// Fencer's (fencelock.go), on two replicas.
type lockHarness struct {
	// replicas returns two replicas' sides of one lock space, in which
	// the given resources may be locked.
	replicas func(t *testing.T, resources ...string) []lockSides
	// yieldIsFinal: shared requests that queued behind an exclusive one
	// wait for the shared holders of that time to leave even if the
	// exclusive request gives up (postgres.Fence: a replica that began
	// giving its fence up finishes doing so). Otherwise they get in at once.
	yieldIsFinal bool
}

// lockSides is one replica's two ways into a resource's lock.
type lockSides struct{ shared, exclusive lockFunc }

// RunLocker runs the conformance suite of tokens.Locker (the embedded
// mode's tokens.LocalLocker; a tokens.Fencer's lock is RunFenceLock's,
// fencelock.go): shared holders coexist, exclusive excludes both, a
// waiting exclusive request is not overtaken by later shared ones (writer
// preference), a wait ends with its context and leaves no one queued
// behind it, unlock may be called again, and resources are independent.
// Each property is checked across two replicas, so that a backend shared
// by replicas is tested as it is used.
//
// What did not happen is checked by waiting a while for it (lockQuiet): such
// a check can pass wrongly on a slow machine, never fail wrongly.
func RunLocker(t *testing.T, h LockerHarness) {
	if h.Replicas == nil {
		t.Fatal("storagetest: LockerHarness.Replicas is required")
	}
	runLockSuite(t, lockHarness{replicas: func(t *testing.T, _ ...string) []lockSides {
		var out []lockSides
		for _, l := range h.Replicas(t, 2) {
			out = append(out, lockSides{l.Shared, l.Exclusive})
		}
		return out
	}})
}

// runLockSuite runs the lock suite (RunLocker's and RunFenceLock's).
func runLockSuite(t *testing.T, h lockHarness) {
	tests := []suiteTest[lockHarness]{
		{"SharedHoldersCoexist", testLockSharedCoexist},
		{"ExclusiveWaitsForShared", testLockExclusiveWaitsForShared},
		{"SharedWaitsForExclusive", testLockSharedWaitsForExclusive},
		{"ExclusiveWaitsForExclusive", testLockExclusiveWaitsForExclusive},
		{"WriterPreference", testLockWriterPreference},
		{"ResourcesIndependent", testLockResourcesIndependent},
		{"Deadline", testLockDeadline},
		{"Cancel", testLockCancel},
		{"GivenUpWaitFreesQueue", testLockGivenUpWaitFreesQueue},
		{"UnlockTwice", testLockUnlockTwice},
		{"MutualExclusion", testLockMutualExclusion},
	}
	runParallel(t, h, tests)
}

// lockQuiet is how long a lock request is given to show that it waits.
const lockQuiet = 200 * time.Millisecond

type lockFunc func(context.Context, string) (func(), error)

// lockNow takes a lock that nothing holds against it.
func lockNow(t *testing.T, lock lockFunc, resource, what string) func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	unlock, err := lock(ctx, resource)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return unlock
}

// pending is a lock request under way.
type pending struct {
	done   chan struct{}
	unlock func()
	err    error
}

func lockAsync(ctx context.Context, lock lockFunc, resource string) *pending {
	p := &pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.unlock, p.err = lock(ctx, resource)
	}()
	return p
}

// waits checks that p is still waiting after lockQuiet.
func (p *pending) waits(t *testing.T, what string) {
	t.Helper()
	select {
	case <-p.done:
		if p.err == nil {
			p.unlock()
		}
		t.Fatalf("%s: granted (err %v) while it should wait", what, p.err)
	case <-time.After(lockQuiet):
	}
}

// granted waits for p's lock and returns its unlock.
func (p *pending) granted(t *testing.T, what string) func() {
	t.Helper()
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("%s: %v", what, p.err)
		}
		return p.unlock
	case <-time.After(waitLimit):
		t.Fatalf("%s: not granted within %v", what, waitLimit)
		return nil
	}
}

// failed waits for p to give up and returns its error.
func (p *pending) failed(t *testing.T, what string) error {
	t.Helper()
	select {
	case <-p.done:
		if p.err == nil {
			p.unlock()
			t.Fatalf("%s: granted, want it to give up", what)
		}
		return p.err
	case <-time.After(waitLimit):
		t.Fatalf("%s: still waiting after %v", what, waitLimit)
		return nil
	}
}

func testLockSharedCoexist(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	a1 := lockNow(t, ls[0].shared, r, "first shared on a")
	a2 := lockNow(t, ls[0].shared, r, "second shared on a")
	b := lockNow(t, ls[1].shared, r, "shared on b beside a's")
	a1()
	a2()
	b()
}

func testLockExclusiveWaitsForShared(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	sa := lockNow(t, ls[0].shared, r, "shared on a")
	sb := lockNow(t, ls[1].shared, r, "shared on b")
	ex := lockAsync(t.Context(), ls[1].exclusive, r)
	ex.waits(t, "exclusive while a and b hold shared")
	sa()
	ex.waits(t, "exclusive while b holds shared")
	sb()
	ex.granted(t, "exclusive after the shared holders left")()
}

func testLockSharedWaitsForExclusive(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	ex := lockNow(t, ls[0].exclusive, r, "exclusive on a")
	sa := lockAsync(t.Context(), ls[0].shared, r)
	sb := lockAsync(t.Context(), ls[1].shared, r)
	sa.waits(t, "shared on a while a holds exclusive")
	sb.waits(t, "shared on b while a holds exclusive")
	ex()
	sa.granted(t, "shared on a after the exclusive")()
	sb.granted(t, "shared on b after the exclusive")()
}

func testLockExclusiveWaitsForExclusive(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
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

// A waiting exclusive request blocks later shared ones, on every replica,
// although the lock is only shared-held: a steady stream of writes must not
// starve a grant.
func testLockWriterPreference(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	ctx := t.Context()
	s := lockNow(t, ls[0].shared, r, "shared on a")
	ex := lockAsync(ctx, ls[1].exclusive, r)
	ex.waits(t, "exclusive while a holds shared")
	lateA := lockAsync(ctx, ls[0].shared, r)
	lateB := lockAsync(ctx, ls[1].shared, r)
	lateA.waits(t, "a later shared on a overtaking the waiting exclusive")
	lateB.waits(t, "a later shared on b overtaking the waiting exclusive")
	s()
	u := ex.granted(t, "exclusive after the earlier shared left")
	lateA.waits(t, "a later shared on a during the exclusive")
	lateB.waits(t, "a later shared on b during the exclusive")
	u()
	lateA.granted(t, "later shared on a after the exclusive")()
	lateB.granted(t, "later shared on b after the exclusive")()
}

func testLockResourcesIndependent(t *testing.T, h lockHarness) {
	r, other := resourceName(t, "r"), resourceName(t, "other")
	ls := h.replicas(t, r, other)
	ex := lockNow(t, ls[0].exclusive, r, "exclusive on r")
	so := lockNow(t, ls[1].shared, other, "shared on another resource beside r's exclusive")
	so()
	eo := lockNow(t, ls[1].exclusive, other, "exclusive on another resource beside r's exclusive")
	eo()
	ex()
}

// A wait ends with its context, with an error that wraps the context's
// (tokens.Service tells a timeout from a broken store by it), for either
// kind of request: past its deadline (DeadlineExceeded) or cancelled
// (Canceled).
func testLockDeadline(t *testing.T, h lockHarness) {
	testLockWaitEnds(t, h, context.DeadlineExceeded, func(ctx context.Context) (context.Context, func()) {
		return context.WithTimeout(ctx, lockQuiet)
	})
}

func testLockCancel(t *testing.T, h lockHarness) {
	testLockWaitEnds(t, h, context.Canceled, func(ctx context.Context) (context.Context, func()) {
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(lockQuiet, cancel)
		return ctx, cancel
	})
}

// testLockWaitEnds: a wait under a context from end fails with want, and
// the locker is usable afterwards.
func testLockWaitEnds(t *testing.T, h lockHarness, want error, end func(context.Context) (context.Context, func())) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	for _, c := range []struct {
		hold, wait lockFunc
		what       string
	}{
		{ls[0].shared, ls[1].exclusive, "Exclusive while a holds shared"},
		{ls[0].exclusive, ls[1].shared, "Shared while a holds exclusive"},
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
}

// An exclusive request that gives up while shared requests queue behind it
// lets them in: the queue it caused goes with it (with yieldIsFinal, once
// the holders it waited for have left).
func testLockGivenUpWaitFreesQueue(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	s := lockNow(t, ls[0].shared, r, "shared on a")
	ctx, cancel := context.WithCancel(t.Context())
	ex := lockAsync(ctx, ls[1].exclusive, r)
	ex.waits(t, "exclusive while a holds shared")
	queuedA := lockAsync(t.Context(), ls[0].shared, r)
	queuedB := lockAsync(t.Context(), ls[1].shared, r)
	queuedA.waits(t, "shared on a behind the waiting exclusive")
	queuedB.waits(t, "shared on b behind the waiting exclusive")
	cancel()
	ex.failed(t, "cancelled exclusive")
	if h.yieldIsFinal {
		s()
	}
	// Without yieldIsFinal s is still held: the queued requests go in
	// beside it.
	queuedA.granted(t, "shared on a after the exclusive gave up")()
	queuedB.granted(t, "shared on b after the exclusive gave up")()
	if !h.yieldIsFinal {
		s()
	}
	lockNow(t, ls[1].exclusive, r, "exclusive after every shared left")()
}

// Calling unlock again does nothing: in particular a second call for one
// shared hold does not release another holder's.
func testLockUnlockTwice(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	sa := lockNow(t, ls[0].shared, r, "shared on a")
	sa2 := lockNow(t, ls[0].shared, r, "second shared on a")
	sb := lockNow(t, ls[1].shared, r, "shared on b")
	sa()
	sa()
	ex := lockAsync(t.Context(), ls[1].exclusive, r)
	ex.waits(t, "exclusive while a's second and b's shared are held, after one unlock called twice")
	sb()
	ex.waits(t, "exclusive while a's second shared is held")
	sa2()
	u := ex.granted(t, "exclusive after every shared left")
	sb() // late repeats change nothing
	sa2()
	late := lockAsync(t.Context(), ls[0].shared, r)
	late.waits(t, "shared during the exclusive, after repeated unlocks")
	u()
	u()
	late.granted(t, "shared after the exclusive")()
	lockNow(t, ls[0].exclusive, r, "exclusive after every unlock")()
}

// Under concurrent shared and exclusive requests from two replicas, an
// exclusive holder is always alone.
func testLockMutualExclusion(t *testing.T, h lockHarness) {
	r := resourceName(t, "r")
	ls := h.replicas(t, r)
	var readers, writers atomic.Int32
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
					if writers.Add(1) != 1 || readers.Load() != 0 {
						t.Error("exclusive lock held beside another holder")
					}
					writers.Add(-1)
					u()
				} else {
					u, err := l.shared(ctx, r)
					cancel()
					if err != nil {
						t.Errorf("Shared: %v", err)
						return
					}
					readers.Add(1)
					if writers.Load() != 0 {
						t.Error("shared lock held beside an exclusive one")
					}
					readers.Add(-1)
					u()
				}
			}
		})
	}
	wg.Wait()
}
