package tokens

// Acquiring a lease: Service.Acquire, its wait for a held resource (in
// arrival order per resource, woken by releases and expiries), and the grant
// step it asks of the Store under the resource's exclusive lock.

import (
	"context"
	"errors"
	"time"
)

// AcquireRequest asks for a lease.
type AcquireRequest struct {
	Resource string
	Holder   string
	// Owner is the authenticated principal asking ("" without
	// authentication); the lease is bound to it.
	Owner string
	// MaxTTL and MaxLeases are Owner's caps (0: none): the longest TTL it
	// may ask for, and how many live leases it may hold at once. The
	// lease cap is enforced by the store, in the step that writes the
	// lease (GrantRequest.MaxLeases).
	MaxTTL    time.Duration
	MaxLeases int
	TTL       time.Duration
	// Wait is how long to wait for a held lease to become free.
	Wait time.Duration
	// ClientGone, if set, is asked once the grant holds the resource's
	// exclusive lock, just before the store records it: an error (the
	// client left) ends the acquire with that error, and no lease is made.
	// The caller's cancellation of ctx when its client goes may come after
	// the lock was taken: a process resumed after a pause hears its
	// client's close and gets the lock it waited for at the same moment,
	// and the lease would go to a client that is not there to take it.
	ClientGone func() error
}

// Acquire grants a lease with a fresh token. If the resource is held it
// waits up to req.Wait for it, then returns ErrLeaseHeld. In-flight writes
// of the previous token or a drain period keep it closed for at most
// req.Wait (the grant wait when req.Wait is 0) before ErrFenceBusy; a drain
// known to end later than that is answered at once, its end in RetryAfter.
//
// Waiting acquires of one process queue per resource in arrival order: only
// the first tries the store, when the holder's lease expires or a release
// (Wake) says the resource may be free, and at least once a second.
func (s *Service) Acquire(ctx context.Context, req AcquireRequest) (Lease, error) {
	if err := s.validateAcquire(req); err != nil {
		return Lease{}, err
	}
	start := time.Now() // monotonic; waits are the gateway's own business
	waitUntil := start.Add(req.Wait)
	bound := req.Wait
	if bound <= 0 {
		bound = s.grantWait
	}
	fenceUntil := start.Add(bound)
	grant := GrantRequest{LeaseID: NewLeaseID(), Resource: req.Resource, Holder: req.Holder, Owner: req.Owner,
		MaxLeases: req.MaxLeases, TTL: req.TTL}
	var queued *waiter
	defer func() {
		if queued != nil {
			s.waiters.leave(req.Resource, queued)
		}
	}()
	for {
		lease, err := s.grantOnce(ctx, grant, fenceUntil, req.ClientGone)
		if err == nil {
			s.stale.forget(lease.Resource) // their current token moved on
			return lease, nil
		}
		var until time.Time
		switch {
		case errors.Is(err, ErrLeaseHeld):
			until = waitUntil
		case errors.Is(err, ErrFenceBusy):
			until = fenceUntil
		default:
			return Lease{}, err
		}
		now := time.Now()
		retryAfter := ErrorOf(err).RetryAfter
		if !now.Before(until) || (errors.Is(err, ErrFenceBusy) && retryAfter > 0 && now.Add(retryAfter).After(until)) {
			return Lease{}, err
		}
		if queued == nil {
			queued = s.waiters.join(req.Resource)
			select {
			case <-queued.turn: // first in line: sleep below
			default:
				if err := waitFor(ctx, queued.turn, until); err != nil {
					return Lease{}, err
				}
				continue // our turn: try at once
			}
		}
		// A held resource frees at its holder's expiry or at a release; a
		// drain ends when it says. The second is the backstop for a wake
		// that never came (another replica's release while its
		// notification was lost).
		sleep := time.Second
		switch {
		case errors.Is(err, ErrFenceBusy) && retryAfter > 0:
			sleep = retryAfter // a drain's end is known
		case retryAfter > 0 && retryAfter < sleep:
			sleep = retryAfter
		}
		next := now.Add(sleep)
		if until.Before(next) {
			next = until
		}
		if err := waitFor(ctx, queued.wake, next); err != nil {
			return Lease{}, ctx.Err()
		}
	}
}

// waitFor waits for ch, ctx or the deadline; nil if ch came first (or the
// deadline passed: the caller tries again and decides), ctx's error if it
// was cancelled.
func waitFor(ctx context.Context, ch <-chan struct{}, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-ch:
		return nil
	case <-t.C:
		return nil
	}
}

// Wake tells the acquires waiting for resource in this process that it may
// have become free: a release or revoke on another replica (the PostgreSQL
// modes hear of them from the fence). Releases through this Service wake
// them by themselves.
func (s *Service) Wake(resource string) { s.waiters.wake(resource) }

func (s *Service) validateAcquire(req AcquireRequest) error {
	if err := s.limits.ValidateResource(req.Resource); err != nil {
		return err
	}
	if err := s.limits.ValidateHolder(req.Holder); err != nil {
		return err
	}
	if err := s.limits.ValidateTTL(req.TTL, req.MaxTTL, req.Owner); err != nil {
		return err
	}
	return s.limits.ValidateWait(req.Wait)
}

func (s *Service) grantOnce(ctx context.Context, req GrantRequest, fenceUntil time.Time, clientGone func() error) (Lease, error) {
	// The store calls of a try end by the acquire's bound (the client's
	// wait, else the grant wait): a stalled store answers store_unavailable
	// then, not when it recovers. The last try, made once the bound has
	// passed, gets lastTryBound, within which a store that is not stalled
	// answers.
	//
	// Each store call gets at least lastTryBound of its own: a try that
	// took the exclusive lock just before the bound (it waited for the
	// writes in flight) must not be answered store_unavailable by a store
	// that answers in time; only the wait for the lock is the acquire's
	// fence_busy.
	//
	// One context serves the read, the lock and the grant whenever their
	// deadlines agree, as they do on a first try well before the bound:
	// each context with a deadline is a timer and three allocations, a
	// tenth of a grant's.
	caller := ctx
	storeBound := func() time.Time {
		if floor := time.Now().Add(lastTryBound); fenceUntil.Before(floor) {
			return floor
		}
		return fenceUntil
	}
	readBound := storeBound()
	ctx, cancelStore := context.WithDeadline(caller, readBound)
	defer cancelStore()
	// Refuse a held resource without touching its lock: waiting for the
	// exclusive lock would stall the holder's own writes behind us. This
	// read only answers early what the store's grant would answer, by the
	// rule the stores apply (Resource.Holder) and with the refusal they
	// build (LeaseHeld); a resource it finds free is decided by the store,
	// in the grant's atomic step, with the owner's cap.
	cur, err := s.store.Resource(ctx, req.Resource)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return Lease{}, err
	default:
		if h := cur.Holder(s.Clock(cur)); h != nil {
			return Lease{}, LeaseHeld(*h, h.Remaining(s.Clock(cur)))
		}
	}

	lockCtx, cancel := ctx, context.CancelFunc(func() {})
	if !readBound.Equal(fenceUntil) {
		lockCtx, cancel = context.WithDeadline(caller, fenceUntil)
	}
	unlock, err := s.exclusive.Exclusive(lockCtx, req.Resource)
	cancel()
	if err != nil {
		if caller.Err() != nil {
			return Lease{}, caller.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return Lease{}, &Error{Kind: ErrFenceBusy, Resource: req.Resource, Detail: "in-flight writes of the previous token are still running", RetryAfter: time.Second}
		}
		return Lease{}, err
	}
	defer unlock()
	if clientGone != nil {
		if err := clientGone(); err != nil {
			return Lease{}, err
		}
	}
	// Under the exclusive lock no write of an older token is in flight and
	// none can start. The store checks the holder, the drain period and
	// the owner's cap atomically with the token bump.
	grantCtx := ctx
	if grantBound := storeBound(); !grantBound.Equal(readBound) {
		var cancelGrant context.CancelFunc
		grantCtx, cancelGrant = context.WithDeadline(caller, grantBound)
		defer cancelGrant()
	}
	return s.store.Grant(grantCtx, req)
}

// lastTryBound is how long the store calls of a try made at the
// acquire's bound may take.
const lastTryBound = 500 * time.Millisecond
