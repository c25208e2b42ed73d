package storagetest

import (
	"context"
	"errors"
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
}

// FenceReplica is one gateway replica's storage.
type FenceReplica struct {
	Store  tokens.Store
	Locker tokens.Locker
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

	svc *tokens.Service
}

// Service is the replica's tokens.Service (drain period and a 3 s grant wait).
func (r *FenceReplica) Service(opts FenceOptions) *tokens.Service {
	if r.svc == nil {
		r.svc = tokens.New(tokens.Config{Store: r.Store, Locker: r.Locker, Fencer: r.Fencer,
			DrainPeriod: opts.DrainPeriod, GrantWait: 3 * time.Second})
	}
	return r.svc
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
		{"CrashedReplicaDrainsOnlyItsResources", testFenceCrash},
		{"CleanShutdownNeedsNoDrain", testFenceCleanShutdown},
		{"LostNotifyDoesNotWedgeGrants", testFenceLostNotify},
		{"ConnectionsBoundedUnderManyWrites", testFenceConnections},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

var fenceOpts = FenceOptions{SessionCheck: 400 * time.Millisecond, DrainPeriod: 2 * time.Second, Idle: time.Minute}

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
	admit(t, svc, l).Done(false)
	before := r.Reads()
	for range 200 {
		admit(t, svc, l).Done(false)
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
	l := acquireOn(t, a, "renew", "w", 300*time.Millisecond)
	admit(t, a, l).Done(false) // a remembers expiry at +300ms
	if _, err := b.Renew(t.Context(), l.ID, 5*time.Second, ""); err != nil {
		t.Fatalf("renew through b: %v", err)
	}
	time.Sleep(400 * time.Millisecond)
	admit(t, a, l).Done(false)
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
	admit(t, a, l).Done(false)
	admit(t, b, l).Done(false)
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
	done := make(chan error, 1)
	go func() {
		_, err := b.Release(t.Context(), l.ID, "")
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("release returned (%v) while a write under the lease was in flight", err)
	default:
	}
	p.Done(false)
	if err := <-done; err != nil {
		t.Fatalf("release: %v", err)
	}
}

// A grant through one replica waits until the previous token's write in
// flight through another has finished (guarantee 1, across replicas).
func testFenceGrantWaits(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "grant-waits", "old", 200*time.Millisecond)
	p := admit(t, a, old)
	time.Sleep(250 * time.Millisecond)
	var writeDone atomic.Bool
	go func() {
		time.Sleep(400 * time.Millisecond)
		writeDone.Store(true)
		p.Done(false)
	}()
	l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "grant-waits", Holder: "new", TTL: time.Second})
	if err != nil {
		t.Fatalf("acquire through b: %v", err)
	}
	if !writeDone.Load() {
		t.Fatalf("token %d was granted while token %d's write was in flight on another replica", l.Token, old.Token)
	}
}

// Writes that keep a resource busy on one replica do not starve a grant on
// another: once it asks, new writes wait behind it.
func testFenceGrantNotStarved(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "hot", "old", 500*time.Millisecond)
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
				p.Done(false)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	_, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "hot", Holder: "new", TTL: time.Second, Wait: 3 * time.Second})
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
	old := acquireOn(t, a, "killed", "old", 300*time.Millisecond)
	p := admit(t, a, old) // in flight: the upstream has it
	defer p.Done(false)
	other := acquireOn(t, a, "killed-other", "w", 10*time.Second)
	admit(t, a, other).Done(false)

	rs[0].KillSessions(t)
	killed := time.Now()
	time.Sleep(350 * time.Millisecond) // old's lease has expired
	l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "killed", Holder: "new", TTL: time.Second})
	if err != nil {
		t.Fatalf("grant after the drain: %v", err)
	}
	if waited := time.Since(killed); waited < fenceOpts.DrainPeriod {
		t.Fatalf("token %d granted %v after the replica's session died with token %d's write in flight; want a drain of at least %v",
			l.Token, waited, old.Token, fenceOpts.DrainPeriod)
	}

	// The replica no longer admits on what it remembered: the next write
	// under a still-current lease reads the store again.
	time.Sleep(fenceOpts.SessionCheck + 100*time.Millisecond)
	before := rs[0].Reads()
	admit(t, a, other).Done(false)
	if rs[0].Reads() == before {
		t.Fatalf("a write was admitted on memory after the replica's session died")
	}
}

// A crashed replica holds up only the resources it had fenced, and only for
// the drain; its other resources are granted at once.
func testFenceCrash(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	fenced := acquireOn(t, a, "crash-fenced", "old", 200*time.Millisecond)
	admit(t, a, fenced) // never finished: the process dies
	acquireOn(t, a, "crash-unfenced", "old", 200*time.Millisecond)
	rs[0].Crash(t)
	crashed := time.Now()
	time.Sleep(250 * time.Millisecond)
	if _, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "crash-unfenced", Holder: "new", TTL: time.Second}); err != nil {
		t.Fatalf("a resource the dead replica never fenced: %v", err)
	}
	if waited := time.Since(crashed); waited >= fenceOpts.DrainPeriod {
		t.Fatalf("a resource the dead replica never fenced waited %v, as long as a drain", waited)
	}
	l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "crash-fenced", Holder: "new", TTL: time.Second})
	if err != nil {
		t.Fatalf("grant after the drain: %v", err)
	}
	if waited := time.Since(crashed); waited < fenceOpts.DrainPeriod {
		t.Fatalf("token %d granted %v after a replica died with token %d's write in flight; want a drain of at least %v",
			l.Token, waited, fenced.Token, fenceOpts.DrainPeriod)
	}
}

// A replica shut down cleanly gives its fences up: nothing drains.
func testFenceCleanShutdown(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "clean", "old", 200*time.Millisecond)
	admit(t, a, old).Done(false)
	rs[0].Close()
	time.Sleep(250 * time.Millisecond)
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
	admit(t, a, l).Done(false)
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
		p.Done(false)
	}
	if n > 32 {
		t.Fatalf("%d database sessions for 512 writes in flight; want at most 32", n)
	}
	t.Logf("512 writes in flight on 64 resources: %d database sessions", n)
}
