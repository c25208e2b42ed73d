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

// FenceHarness opens the replicas of one deployment whose writes are
// admitted by a tokens.Fencer (the PostgreSQL modes), for RunFence.
type FenceHarness struct {
	// Replicas opens n replicas sharing one fresh database, configured with
	// opts. They are closed when the test ends (Close may come first).
	Replicas func(t *testing.T, n int, opts FenceOptions) []*FenceReplica
}

// FenceOptions are the timings a fence test needs.
type FenceOptions struct {
	SessionCheck time.Duration
	DrainPeriod  time.Duration
	Idle         time.Duration
	MaxFences    int // 0: the backend's default
}

// FenceReplica is one gateway replica's storage.
type FenceReplica struct {
	Store  tokens.Store
	Fencer tokens.Fencer
	// Reads is how many times the fencer has read lease state from the store.
	Reads func() int64
	// KillSessions ends the replica's lock sessions abruptly on the server
	// side (pg_terminate_backend), as a partition or an operator would; the
	// process lives on.
	KillSessions func(t *testing.T)
	// KillListener ends the session on which the replica hears requests to
	// give its fences up.
	KillListener func(t *testing.T)
	// Crash abandons the replica as a kill -9 would: its sessions die
	// without giving anything up, and it is never used again.
	Crash func(t *testing.T)
	// Close shuts the replica down cleanly (fences given up).
	Close func()
	// Connections counts the database sessions the replica holds now.
	Connections func(t *testing.T) int

	svc      *tokens.Service
	attempts atomic.Int64 // grant attempts: Resource reads before a grant, counted once answered
	// exclusive counts the Service's requests for a resource's exclusive
	// lock (grants, releases, revokes), as they are made: one that has
	// moved is waiting for the lock or has it.
	exclusive atomic.Int64
}

// Service is the replica's tokens.Service (drain period and a 3 s grant wait).
func (r *FenceReplica) Service(opts FenceOptions) *tokens.Service {
	if r.svc == nil {
		r.svc = tokens.New(tokens.Config{Store: countingResource{r.Store, &r.attempts}, Fencer: countingExclusive{r.Fencer, &r.exclusive},
			DrainPeriod: opts.DrainPeriod, GrantWait: 3 * time.Second})
	}
	return r.svc
}

// countingResource counts Resource reads: each grant attempt makes one.
// A read is counted when it has answered, so that a waiter whose count
// has moved has decided (and is queueing) rather than just asked.
type countingResource struct {
	tokens.Store
	n *atomic.Int64
}

func (c countingResource) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	defer c.n.Add(1)
	return c.Store.Resource(ctx, name)
}

// countingExclusive counts requests for exclusive locks when they are made.
type countingExclusive struct {
	tokens.Fencer
	n *atomic.Int64
}

func (c countingExclusive) Exclusive(ctx context.Context, resource string) (func(), error) {
	c.n.Add(1)
	return c.Fencer.Exclusive(ctx, resource)
}

// RunFence runs the fence conformance suite: the rules of tokens.Fencer and
// of guarantee 7 (a replica's death is an unknown outcome), across replicas.
func RunFence(t *testing.T, h FenceHarness) {
	tests := []struct {
		name string
		fn   func(*testing.T, FenceHarness)
	}{
		{"SteadyWritesNeedNoStoreRead", testFenceSteadyWrites},
		{"RenewOnOneReplicaWritesOnAnother", testFenceRenewElsewhere},
		{"ReleaseSeenEverywhere", testFenceReleaseEverywhere},
		{"RevokeSeenEverywhere", testFenceRevokeEverywhere},
		{"ReleaseWaitsForWritesInFlight", testFenceReleaseWaits},
		{"GrantWaitsForWritesInFlightElsewhere", testFenceGrantWaits},
		{"GrantNotStarvedByWrites", testFenceGrantNotStarved},
		{"SessionKilledWithWriteInFlightDrains", testFenceSessionKilled},
		{"SessionKilledWriteLosesItsProof", testFenceSessionKilledLosesProof}, // fence_send.go
		{"CrashedReplicaDrainsOnlyItsResources", testFenceCrash},
		{"CleanShutdownNeedsNoDrain", testFenceCleanShutdown},
		{"LostNotifyDoesNotWedgeGrants", testFenceLostNotify},
		{"ConnectionsBoundedUnderManyWrites", testFenceConnections},
		{"FencesBounded", testFenceMaxFences},
		{"WaitersGrantedInArrivalOrder", testFenceWaitersInOrder},
		{"ManyWaitersFewStoreReads", testFenceManyWaiters},
		{"DrainBeyondTheWaitAnsweredAtOnce", testFenceDrainAnsweredAtOnce},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

// Leases in these tests last a second: long enough that a loaded machine
// (-race, two cores) does not let them expire between two steps.
var fenceOpts = FenceOptions{SessionCheck: time.Second, DrainPeriod: 3 * time.Second, Idle: time.Minute}

const fenceTTL = time.Second

// pastFenceTTL waits until l (a fenceTTL lease, as granted) has expired
// by the clock of r's store, which judges it, and claimSlack more: a
// claim kept with a TTL of its own (Redis's) may outlive ExpiresAt by the
// moment between the two writes.
func pastFenceTTL(t *testing.T, r *FenceReplica, l tokens.Lease) {
	t.Helper()
	WaitPast(t, r.Store, l.Resource, l.ExpiresAt.Add(claimSlack))
}

const claimSlack = 50 * time.Millisecond

func acquireOn(t *testing.T, svc *tokens.Service, resource, holder string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: holder, TTL: ttl})
	if err != nil {
		t.Fatalf("acquire %s by %s: %v", resource, holder, err)
	}
	return l
}

func admit(t *testing.T, svc *tokens.Service, l tokens.Lease) *tokens.Permit {
	t.Helper()
	p, err := svc.Admit(t.Context(), l.ID, tokens.Write{Method: "POST", Upstream: "u", Path: "/x"})
	if err != nil {
		t.Fatalf("write under token %d: %v", l.Token, err)
	}
	return p
}

func wantRefused(t *testing.T, svc *tokens.Service, l tokens.Lease, kind error) {
	t.Helper()
	_, err := svc.Admit(t.Context(), l.ID, tokens.Write{Method: "POST", Upstream: "u", Path: "/x"})
	if !errors.Is(err, kind) {
		t.Fatalf("write under token %d: got %v, want %v", l.Token, err, kind)
	}
}

// Writes under a current lease, after the first, are admitted on memory.
func testFenceSteadyWrites(t *testing.T, h FenceHarness) {
	r := h.Replicas(t, 1, fenceOpts)[0]
	svc := r.Service(fenceOpts)
	l := acquireOn(t, svc, "steady", "w", 10*time.Second)
	admit(t, svc, l).Done(tokens.OutcomeKnown)
	before := r.Reads()
	for range 200 {
		admit(t, svc, l).Done(tokens.OutcomeKnown)
	}
	if n := r.Reads() - before; n != 0 {
		t.Fatalf("200 steady writes read the store %d times; want 0", n)
	}
}

// A renewal through one replica extends the lease for writes through
// another, though that one remembered the old expiry.
func testFenceRenewElsewhere(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	l := acquireOn(t, a, "renew", "w", fenceTTL)
	admit(t, a, l).Done(tokens.OutcomeKnown) // a remembers the first expiry
	if _, err := b.Renew(t.Context(), tokens.RenewRequest{LeaseID: l.ID, TTL: 10 * time.Second}); err != nil {
		t.Fatalf("renew through b: %v", err)
	}
	pastFenceTTL(t, rs[1], l)
	admit(t, a, l).Done(tokens.OutcomeKnown)
}

func testFenceReleaseEverywhere(t *testing.T, h FenceHarness) {
	testFenceEndEverywhere(t, h, func(svc *tokens.Service, l tokens.Lease) error {
		_, err := svc.Release(t.Context(), l.ID, "")
		return err
	})
}

func testFenceRevokeEverywhere(t *testing.T, h FenceHarness) {
	testFenceEndEverywhere(t, h, func(svc *tokens.Service, l tokens.Lease) error {
		_, err := svc.Revoke(t.Context(), l.ID, "admin")
		return err
	})
}

// Once a release (or revoke) through one replica has returned, every
// replica refuses the lease, including one that admitted it a moment ago.
func testFenceEndEverywhere(t *testing.T, h FenceHarness, end func(*tokens.Service, tokens.Lease) error) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	l := acquireOn(t, a, "end", "w", 10*time.Second)
	admit(t, a, l).Done(tokens.OutcomeKnown)
	admit(t, b, l).Done(tokens.OutcomeKnown)
	if err := end(b, l); err != nil {
		t.Fatalf("end the lease through b: %v", err)
	}
	wantRefused(t, a, l, tokens.ErrLeaseReleased)
	wantRefused(t, b, l, tokens.ErrLeaseReleased)
}

// A release waits for the lease's writes in flight on another replica.
func testFenceReleaseWaits(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	l := acquireOn(t, a, "release-waits", "w", 10*time.Second)
	p := admit(t, a, l)
	asked := rs[1].exclusive.Load()
	done := make(chan error, 1)
	go func() {
		_, err := b.Release(t.Context(), l.ID, "")
		done <- err
	}()
	waitForLockRequest(t, rs[1], asked, func() bool { return len(done) > 0 }, "the release")
	select {
	case err := <-done:
		t.Fatalf("release returned (%v) while a write under the lease was in flight", err)
	case <-time.After(lockQuiet):
	}
	p.Done(tokens.OutcomeKnown)
	if err := <-done; err != nil {
		t.Fatalf("release: %v", err)
	}
}

// A grant through one replica waits until the previous token's write in
// flight through another has finished (guarantee 1, across replicas).
func testFenceGrantWaits(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "grant-waits", "old", fenceTTL)
	p := admit(t, a, old)
	pastFenceTTL(t, rs[1], old)
	type result struct {
		l   tokens.Lease
		err error
	}
	asked := rs[1].exclusive.Load()
	done := make(chan result, 1)
	go func() {
		l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "grant-waits", Holder: "new", TTL: time.Second})
		done <- result{l, err}
	}()
	waitForLockRequest(t, rs[1], asked, func() bool { return len(done) > 0 }, "the grant")
	select {
	case g := <-done:
		t.Fatalf("token %d was granted (err %v) while token %d's write was in flight on another replica", g.l.Token, g.err, old.Token)
	case <-time.After(lockQuiet):
	}
	p.Done(tokens.OutcomeKnown)
	if g := <-done; g.err != nil {
		t.Fatalf("acquire through b: %v", g.err)
	}
}

// waitForLockRequest waits until r's Service has asked for an exclusive
// lock since its count was asked, or returned says the call under test
// (what) has returned without. The call has then reached the step that
// must wait for the writes in flight; whether it does is told by what it
// does within lockQuiet after.
func waitForLockRequest(t *testing.T, r *FenceReplica, asked int64, returned func() bool, what string) {
	t.Helper()
	waitUntil(t, waitLimit, what+" asking for the resource's exclusive lock", func() bool {
		return r.exclusive.Load() > asked || returned()
	})
}

// Writes that keep a resource busy on one replica do not starve a grant on
// another: once it asks, new writes wait behind it.
func testFenceGrantNotStarved(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "hot", "old", fenceTTL)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := a.Admit(context.Background(), old.ID, tokens.Write{Method: "POST"})
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				time.Sleep(10 * time.Millisecond)
				p.Done(tokens.OutcomeKnown)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	// The wait bounds how long the grant may take, not how fast it must be:
	// the old lease expires after fenceTTL, and a starved grant would wait
	// out all of it. 3 s ran out under -race on a machine at load 11.
	_, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "hot", Holder: "new", TTL: time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("a grant behind a stream of writes: %v", err)
	}
}

// A replica whose lock sessions are killed while a write is in flight: the
// next grant (on another replica) finds the orphaned fence and waits out a
// drain period; the replica stops admitting on memory within SessionCheck.
func testFenceSessionKilled(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "killed", "old", fenceTTL)
	p := admit(t, a, old) // in flight: the upstream has it
	defer p.Done(tokens.OutcomeKnown)
	other := acquireOn(t, a, "killed-other", "w", 10*time.Second)
	admit(t, a, other).Done(tokens.OutcomeKnown)

	rs[0].KillSessions(t)
	killed := time.Now()
	pastFenceTTL(t, rs[1], old)
	grantAfterDrain(t, b, "killed", killed, "the replica's session died", old)

	// The replica no longer admits on what it remembered: once its
	// session check has run, a write under a still-current lease reads the
	// store again.
	waitUntil(t, waitLimit, "a write admitted on a read of the store after the replica's session died", func() bool {
		before := rs[0].Reads()
		admit(t, a, other).Done(tokens.OutcomeKnown)
		return rs[0].Reads() > before
	})
}

// A crashed replica holds up only the resources it had fenced, and only for
// the drain; its other resources are granted at once.
func testFenceCrash(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	fenced := acquireOn(t, a, "crash-fenced", "old", fenceTTL)
	admit(t, a, fenced) // never finished: the process dies
	unfenced := acquireOn(t, a, "crash-unfenced", "old", fenceTTL)
	rs[0].Crash(t)
	crashed := time.Now()
	pastFenceTTL(t, rs[1], unfenced) // the later of the two
	// A wait shorter than what is left of the drain: a resource held up by
	// the dead replica answers fence_busy, one it never fenced is granted.
	if _, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "crash-unfenced", Holder: "new", TTL: time.Second,
		Wait: fenceOpts.DrainPeriod / 3}); err != nil {
		t.Fatalf("a resource the dead replica never fenced was not granted within a third of a drain: %v", err)
	}
	grantAfterDrain(t, b, "crash-fenced", crashed, "a replica died", fenced)
}

// grantAfterDrain acquires resource on svc, waiting as long as a drain and
// a session check may take, and fails t unless the grant came a drain
// period or more after since, when event left old's write in flight with
// an unknown outcome.
func grantAfterDrain(t *testing.T, svc *tokens.Service, resource string, since time.Time, event string, old tokens.Lease) {
	t.Helper()
	l, err := svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: resource, Holder: "new", TTL: time.Second,
		Wait: fenceOpts.DrainPeriod + fenceOpts.SessionCheck + 2*time.Second})
	if err != nil {
		t.Fatalf("grant after the drain: %v", err)
	}
	if waited := time.Since(since); waited < fenceOpts.DrainPeriod {
		t.Fatalf("token %d granted %v after %s with token %d's write in flight; want a drain of at least %v",
			l.Token, waited, event, old.Token, fenceOpts.DrainPeriod)
	}
}

// A replica shut down cleanly gives its fences up: nothing drains.
func testFenceCleanShutdown(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "clean", "old", fenceTTL)
	admit(t, a, old).Done(tokens.OutcomeKnown)
	rs[0].Close()
	pastFenceTTL(t, rs[1], old)
	if _, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "clean", Holder: "new", TTL: time.Second}); err != nil {
		t.Fatalf("grant after a clean shutdown of the previous holder's replica: %v", err)
	}
}

// A replica that missed the request to give its fence up (its listener's
// session died) does not keep a release waiting.
func testFenceLostNotify(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	l := acquireOn(t, a, "lost-notify", "w", 10*time.Second)
	admit(t, a, l).Done(tokens.OutcomeKnown)
	rs[0].KillListener(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := b.Release(ctx, l.ID, ""); err != nil {
		t.Fatalf("release while the fence's holder missed the request: %v", err)
	}
	wantRefused(t, a, l, tokens.ErrLeaseReleased)
}

// 512 writes in flight through one replica on 64 resources all get in, on a
// bounded number of database sessions.
func testFenceConnections(t *testing.T, h FenceHarness) {
	r := h.Replicas(t, 1, fenceOpts)[0]
	svc := r.Service(fenceOpts)
	leases := make([]tokens.Lease, 64)
	for i := range leases {
		leases[i] = acquireOn(t, svc, "conns-"+string(rune('a'+i/26))+string(rune('a'+i%26)), "w", 30*time.Second)
	}
	permits := make(chan *tokens.Permit, 512)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 512 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := svc.Admit(t.Context(), leases[i%64].ID, tokens.Write{Method: "POST"})
			if err != nil {
				failed.Add(1)
				t.Errorf("write %d: %v", i, err)
				return
			}
			permits <- p
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of 512 writes in flight were refused", failed.Load())
	}
	n := r.Connections(t)
	close(permits)
	for p := range permits {
		p.Done(tokens.OutcomeKnown)
	}
	if n > 32 {
		t.Fatalf("%d database sessions for 512 writes in flight; want at most 32", n)
	}
	t.Logf("512 writes in flight on 64 resources: %d database sessions", n)
}

// Acquires waiting for a held resource get it in the order they asked, when
// its holder releases it through another replica. Each waiter is started
// once the one before it has been refused and is queueing (its grant
// attempt answered), so the order they asked in is known, not assumed from
// a pause.
func testFenceWaitersInOrder(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	held := acquireOn(t, a, "queue", "first", 30*time.Second)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 5 {
		tried := rs[1].attempts.Load()
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "queue", Holder: "w", TTL: 30 * time.Second, Wait: 10 * time.Second})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if _, err := b.Release(t.Context(), l.ID, ""); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		waitUntil(t, 10*time.Second, fmt.Sprintf("waiter %d's first grant attempt", i), func() bool { return rs[1].attempts.Load() > tried })
	}
	if _, err := a.Release(t.Context(), held.ID, ""); err != nil {
		t.Fatalf("release: %v", err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("waiters were granted in the order %v; want arrival order", order)
		}
	}
}

// A hundred acquires waiting for one resource do not each poll the store:
// only the first in line tries, at the holder's expiry or a release.
func testFenceManyWaiters(t *testing.T, h FenceHarness) {
	r := h.Replicas(t, 1, fenceOpts)[0]
	svc := r.Service(fenceOpts)
	acquireOn(t, svc, "crowd", "holder", 1500*time.Millisecond)
	const n = 100
	before := r.attempts.Load()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = svc.Acquire(t.Context(), tokens.AcquireRequest{Resource: "crowd", Holder: "w", TTL: 10 * time.Second, Wait: time.Second})
		}()
	}
	wg.Wait()
	// Each waiter tries once on arrival and once more when its wait ends;
	// the one at the head of the line once a second besides. Polling every
	// 25 ms would have made about 40 tries each.
	if got := r.attempts.Load() - before; got > 3*n {
		t.Fatalf("%d waiters for one second made %d grant attempts; want at most %d", n, got, 3*n)
	}
}

// An acquire whose wait would end before a known drain does answers at
// once, with the drain's end in RetryAfter.
func testFenceDrainAnsweredAtOnce(t *testing.T, h FenceHarness) {
	// A drain long enough that a wait far beyond any machine's latency
	// still ends before it.
	opts := fenceOpts
	opts.DrainPeriod = time.Minute
	const wait = 20 * time.Second
	rs := h.Replicas(t, 2, opts)
	a, b := rs[0].Service(opts), rs[1].Service(opts)
	old := acquireOn(t, a, "drained", "old", fenceTTL)
	admit(t, a, old) // in flight when the replica dies
	rs[0].Crash(t)
	pastFenceTTL(t, rs[1], old)
	// The first grant attempt finds the orphan and starts the drain.
	_, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "drained", Holder: "new", TTL: time.Second, Wait: 300 * time.Millisecond})
	wantErr(t, err, tokens.ErrFenceBusy, "acquire during a drain")
	// Answered at once, not at the wait's end: the caller's context ends
	// long before the wait does, so an acquire that sat out its wait
	// returns the context's error instead of fence_busy.
	ctx, cancel := context.WithTimeout(t.Context(), wait/2)
	defer cancel()
	_, err = b.Acquire(ctx, tokens.AcquireRequest{Resource: "drained", Holder: "new", TTL: time.Second, Wait: wait})
	e := wantErr(t, err, tokens.ErrFenceBusy, "acquire whose wait ends before the drain")
	if e.RetryAfter <= wait {
		t.Fatalf("RetryAfter %v; want the drain's end, beyond the wait", e.RetryAfter)
	}
}

// A replica holds at most MaxFences fences: idle ones are given up to make
// room, and a write that would need one more while all are busy is refused
// as unavailable (never admitted without a fence).
func testFenceMaxFences(t *testing.T, h FenceHarness) {
	opts := fenceOpts
	opts.MaxFences = 2
	r := h.Replicas(t, 1, opts)[0]
	svc := r.Service(opts)
	var leases []tokens.Lease
	for _, name := range []string{"max-a", "max-b", "max-c"} {
		leases = append(leases, acquireOn(t, svc, name, "w", 30*time.Second))
	}
	for _, l := range leases { // one after the other: idle fences make room
		admit(t, svc, l).Done(tokens.OutcomeKnown)
	}
	p1, p2 := admit(t, svc, leases[0]), admit(t, svc, leases[1])
	defer p1.Done(tokens.OutcomeKnown)
	defer p2.Done(tokens.OutcomeKnown)
	_, err := svc.Admit(t.Context(), leases[2].ID, tokens.Write{Method: "POST"})
	if !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("a third resource with two fences busy and a limit of two: %v; want unavailable", err)
	}
}
