package tokens

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
)

// Defaults for Config fields left zero.
const (
	DefaultGrantWait   = 10 * time.Second
	DefaultDrainPeriod = 30 * time.Second
)

// Config wires a Service.
type Config struct {
	Store  Store
	Locker Locker
	// Fencer, if set, admits writes (see Fencer); Locker must then be its
	// exclusive side.
	Fencer Fencer
	// Now is the gateway's clock; nil means time.Now. Stores that measure
	// time themselves report their clock in Resource.Now, which wins.
	Now    func() time.Time
	Limits Limits // zero value: DefaultLimits
	// GrantWait bounds how long a grant waits for in-flight writes of the
	// previous token, or for a drain period, before ErrFenceBusy.
	GrantWait time.Duration
	// DrainPeriod keeps a resource closed to grants after a forward whose
	// outcome is unknown, because that write may still land upstream.
	DrainPeriod time.Duration
	// OnRejection is called after a refused write was recorded (live feed,
	// metrics). It must not block.
	OnRejection func(Rejection)
	// OnLockWait, if set, is called when an admission starts waiting for
	// its resource's shared lock (or the Fencer's hold), with the write's
	// context; the function it returns is called when the wait ends. It
	// lets tracing show the lock wait as its own span without this package
	// knowing of tracing; nil costs nothing.
	OnLockWait func(ctx context.Context) (end func())
	Logger     *slog.Logger
}

// Service applies the fence rules on top of a Store and a Locker.
//
// The safety argument, in one place:
//
//  1. A token is durable before it is returned (Store.Grant), and grants of
//     a resource are serialised by its exclusive lock, so tokens strictly
//     increase and no crash can make a store hand one out twice.
//  2. A write holds the resource's shared lock from the moment its lease is
//     checked until the upstream has answered (Permit.Done). A grant takes
//     the exclusive lock before it changes the token. So when a grant
//     returns, every write admitted under an older token has finished, and
//     every later write is checked against the new token: it either carries
//     the new lease or is refused. No stale write is in flight, and none can
//     start ("fence on grant").
//  3. A forward whose outcome is unknown (timeout, broken connection) may
//     still land later even though the gateway stopped waiting. Before its
//     shared lock is released the resource is put in a drain period, and
//     grants wait it out: the next holder cannot write until the old write
//     can no longer arrive.
//  4. A write is admitted only on the state read under the shared lock and
//     the store's (or gateway's) clock; the worker's clock and any token the
//     client sends play no part. A write may be *refused* on a state read
//     without the lock (stores that read lease and fence together), because
//     every refusal is final: tokens never go down, a superseded lease never
//     becomes current again, released stays released, expired cannot be
//     renewed. For the same reason a stale_token verdict is cached for a
//     second (staleCache): only the current token it reports may age.
//  5. Any store error is ErrUnavailable: nothing is forwarded unchecked.
//  6. With a Fencer (the PostgreSQL modes), a replica keeps a resource's
//     shared fence across many writes and admits them on what it read under
//     it (storage/postgres/fence.go has the argument in full). Points 2 and 4
//     still hold because whatever changes the fence state (a grant, a
//     release, a revoke) first takes the exclusive lock, which makes every
//     replica give its shared fence up and forget what it read; only expiry
//     moves without the lock, and it is judged on a clock that runs ahead of
//     the store's. A replica's death is an unknown outcome for every write
//     it may have had in flight (guarantee 7): it leaves a presence row for
//     each fence it held, and the next exclusive taker of such a resource
//     starts a drain period of the drain period plus the session check.
//     No byte of an admitted write is sent unless its fence is proven held
//     at that moment (Permit.Check, before every write system call to the
//     upstream): a replica that lost its session stops sending within the
//     session check of the loss, however long the write's body takes, so
//     every byte it sent left at least a drain period before that drain
//     ends (fence.go point 4 has the argument). --drain-period should be
//     at least --forward-timeout, as it is by default, so that this margin
//     is as long as the one a timed-out forward gets. The limit: a process
//     stopped between its last proof and its write system call (a window
//     of nanoseconds) sends what it proved a moment before it stopped.
type Service struct {
	store       Store
	locker      Locker
	fencer      Fencer
	now         func() time.Time
	limits      Limits
	grantWait   time.Duration
	drainPeriod time.Duration
	onReject    func(Rejection)
	onLockWait  func(context.Context) func()
	log         *slog.Logger
	stale       *staleCache
	waiters     *waiters
	flood       floodGate // flood.go
}

// New returns a Service; Store and Locker are required.
func New(cfg Config) *Service {
	s := &Service{
		store:       cfg.Store,
		locker:      cfg.Locker,
		fencer:      cfg.Fencer,
		now:         cfg.Now,
		limits:      cfg.Limits,
		grantWait:   cfg.GrantWait,
		drainPeriod: cfg.DrainPeriod,
		onReject:    cfg.OnRejection,
		onLockWait:  cfg.OnLockWait,
		log:         cfg.Logger,
		stale:       newStaleCache(),
		waiters:     newWaiters(),
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.limits == (Limits{}) {
		s.limits = DefaultLimits
	}
	if s.grantWait <= 0 {
		s.grantWait = DefaultGrantWait
	}
	if s.drainPeriod <= 0 {
		s.drainPeriod = DefaultDrainPeriod
	}
	if s.onReject == nil {
		s.onReject = func(Rejection) {}
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// Limits returns the input limits in force.
func (s *Service) Limits() Limits { return s.limits }

// Now returns the gateway's clock.
func (s *Service) Now() time.Time { return s.now() }

// AcquireRequest asks for a lease.
type AcquireRequest struct {
	Resource string
	Holder   string
	// Owner is the authenticated principal asking ("" without
	// authentication); the lease is bound to it.
	Owner string
	TTL   time.Duration
	// Wait is how long to wait for a held lease to become free.
	Wait time.Duration
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
	grant := GrantRequest{LeaseID: NewLeaseID(), Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, TTL: req.TTL}
	var queued *waiter
	defer func() {
		if queued != nil {
			s.waiters.leave(req.Resource, queued)
		}
	}()
	for {
		lease, err := s.grantOnce(ctx, grant, fenceUntil)
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
	if err := s.limits.ValidateTTL(req.TTL); err != nil {
		return err
	}
	return s.limits.ValidateWait(req.Wait)
}

func (s *Service) grantOnce(ctx context.Context, req GrantRequest, fenceUntil time.Time) (Lease, error) {
	// Refuse a held resource without touching its lock: waiting for the
	// exclusive lock would stall the holder's own writes behind us.
	cur, err := s.store.Resource(ctx, req.Resource)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return Lease{}, err
	default:
		if h := cur.Holder(s.Clock(cur)); h != nil {
			return Lease{}, heldError(*h, s.Clock(cur))
		}
	}

	lockCtx, cancel := context.WithDeadline(ctx, fenceUntil)
	unlock, err := s.locker.Exclusive(lockCtx, req.Resource)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return Lease{}, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return Lease{}, &Error{Kind: ErrFenceBusy, Resource: req.Resource, Detail: "in-flight writes of the previous token are still running", RetryAfter: time.Second}
		}
		return Lease{}, err
	}
	defer unlock()
	// Under the exclusive lock no write of an older token is in flight and
	// none can start. The store re-checks the holder and the drain period
	// atomically with the token bump.
	return s.store.Grant(ctx, req)
}

func heldError(h Lease, now time.Time) error {
	return &Error{Kind: ErrLeaseHeld, Resource: h.Resource, Holder: h.Holder, CurrentToken: h.Token, ExpiresAt: h.ExpiresAt, RetryAfter: h.Remaining(now)}
}

// Clock is the time at which the fence rules judge r: the store's clock
// when r carries it (Resource.Now), else the gateway's. The gateway uses it
// to report a lease's state and remaining time as Admit would judge them.
func (s *Service) Clock(r Resource) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return s.now()
}

// Renew extends a current lease; ttl 0 reuses the lease's TTL. principal
// is the authenticated caller ("" without authentication): any other than
// the lease's owner gets ErrLeaseNotOwned and changes nothing.
func (s *Service) Renew(ctx context.Context, leaseID string, ttl time.Duration, principal string) (Lease, error) {
	if ttl != 0 {
		if err := s.limits.ValidateTTL(ttl); err != nil {
			return Lease{}, err
		}
	}
	if err := s.checkOwner(ctx, leaseID, principal); err != nil {
		return Lease{}, err
	}
	return s.store.Renew(ctx, leaseID, ttl)
}

// Release ends a current lease (idempotent for its holder). principal is
// checked as in Renew.
func (s *Service) Release(ctx context.Context, leaseID string, principal string) (Lease, error) {
	if err := s.checkOwner(ctx, leaseID, principal); err != nil {
		return Lease{}, err
	}
	unlock, err := s.forget(ctx, leaseID)
	if err != nil {
		return Lease{}, err
	}
	lease, err := s.store.Release(ctx, leaseID)
	unlock()
	if err == nil {
		s.waiters.wake(lease.Resource)
	}
	return lease, err
}

// forget makes every replica forget leaseID's resource before a release or
// revoke changes it (with a Fencer: see Fencer): it returns with the
// resource's exclusive lock held. Without a Fencer every write reads the
// state under its own lock, so there is nothing to forget.
func (s *Service) forget(ctx context.Context, leaseID string) (func(), error) {
	if s.fencer == nil {
		return func() {}, nil
	}
	lease, err := s.store.Lease(ctx, leaseID)
	if err != nil {
		return nil, err
	}
	// A lease that is no longer its resource's live one cannot change any
	// fence (the store refuses it, or, released already, changes nothing),
	// and its release must not make every replica give the current
	// holder's fence up.
	if state, err := s.store.Resource(ctx, lease.Resource); err == nil && Judge(lease, state, s.Clock(state)) != nil {
		return func() {}, nil
	}
	lockCtx, cancel := context.WithTimeout(ctx, s.grantWait)
	defer cancel()
	unlock, err := s.locker.Exclusive(lockCtx, lease.Resource)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, &Error{Kind: ErrFenceBusy, Resource: lease.Resource, Detail: "writes in flight under the lease are still running", RetryAfter: time.Second}
		}
		return nil, err
	}
	return unlock, nil
}

// Revoke ends a lease on an administrator's order, whoever holds it: writes
// under it are refused (lease_released) from the moment it returns, and the
// lease history records the revocation with by, the administrator. Writes
// admitted before it may still be finishing. No token changes: a revoke
// can only fence, never lower a fence or reuse a token.
func (s *Service) Revoke(ctx context.Context, leaseID, by string) (Lease, error) {
	if by == "" {
		return Lease{}, Invalid("by", "a revocation names who ordered it")
	}
	unlock, err := s.forget(ctx, leaseID)
	if err != nil {
		return Lease{}, err
	}
	lease, err := s.store.Revoke(ctx, leaseID, by)
	unlock()
	if err == nil {
		s.waiters.wake(lease.Resource)
	}
	return lease, err
}

// checkOwner refuses a principal other than the lease's owner. Reading the
// owner before the change is safe: a lease's owner never changes, so the
// check cannot be outdated by the time the store acts.
func (s *Service) checkOwner(ctx context.Context, leaseID, principal string) error {
	if principal == "" {
		return nil
	}
	lease, err := s.store.Lease(ctx, leaseID)
	if err != nil {
		return err
	}
	return ownedBy(lease, principal)
}

// ownedBy refuses a principal other than the lease's owner; "" (no
// authentication) may act on any lease.
func ownedBy(lease Lease, principal string) error {
	if failpoint.NoOwner {
		return nil
	}
	if principal != "" && lease.Owner != principal {
		return notOwned(lease)
	}
	return nil
}

func notOwned(l Lease) error {
	return &Error{Kind: ErrLeaseNotOwned, Resource: l.Resource, Token: l.Token,
		Detail: "the lease was acquired by another principal"}
}

// Lease returns a lease by id.
func (s *Service) Lease(ctx context.Context, leaseID string) (Lease, error) {
	return s.store.Lease(ctx, leaseID)
}

// Resource returns a resource's fence state.
func (s *Service) Resource(ctx context.Context, name string) (Resource, error) {
	if err := s.limits.ValidateResource(name); err != nil {
		return Resource{}, err
	}
	return s.store.Resource(ctx, name)
}

// Rejections lists the rejection log, newest first.
func (s *Service) Rejections(ctx context.Context, q RejectionQuery) ([]Rejection, error) {
	return s.store.Rejections(ctx, q)
}

// History lists a resource's lease history, newest first.
func (s *Service) History(ctx context.Context, resource string, limit int) ([]Event, error) {
	if err := s.limits.ValidateResource(resource); err != nil {
		return nil, err
	}
	return s.store.History(ctx, resource, limit)
}

// CurrentLeases lists live leases.
func (s *Service) CurrentLeases(ctx context.Context, limit int) ([]Lease, error) {
	return s.store.CurrentLeases(ctx, limit)
}

// Ping reports whether the store is reachable.
func (s *Service) Ping(ctx context.Context) error { return s.store.Ping(ctx) }

// Write describes a write a worker wants forwarded, for the rejection log.
type Write struct {
	Method   string
	Upstream string
	Path     string
	// Principal is the authenticated caller ("" without authentication);
	// any other than the lease's owner is refused with ErrLeaseNotOwned.
	Principal string
	// Observe: the upstream only observes (an adoption setting, never the
	// default). A write the fence rule refuses (stale_token, lease_expired,
	// lease_released) is recorded as a rejection marked WouldRefuse and
	// admitted anyway, without the shared lock: such an upstream is not
	// fenced. Unknown leases and another principal's lease are refused as
	// on any upstream.
	Observe bool
	// TraceID is the write's trace id, if it is traced, for its rejection.
	TraceID string
}

// Permit is an admitted write. Its holder must call Done exactly once, after
// the upstream answered or the forward gave up, and Check before sending
// each byte of the write.
type Permit struct {
	Lease Lease
	// WouldRefuse is the refusal an enforcing upstream would have answered
	// (Write.Observe), nil for a write the fence admitted. Such a permit
	// holds no lock and its unknown outcome starts no drain.
	WouldRefuse error
	svc         *Service
	unlock      func() // without a Fencer
	held        Held   // with a Fencer
}

// Check returns nil if the write may send bytes to the upstream now, or an
// error wrapping ErrFenceLost if its fence can no longer be proven held
// (see Held.Check): nothing more of the write may then be sent, and what
// was sent is an unknown outcome. Without a Fencer (the embedded mode) it
// is always nil: the lock lives in the process, and cannot be lost unless
// the process dies, and a dead process sends nothing. An observed write
// holds no fence, and is not checked.
func (p *Permit) Check() error {
	if p.held == nil || failpoint.NoSendCheck {
		return nil
	}
	return p.held.Check()
}

// Admit checks that leaseID is its resource's current live lease and holds
// the resource's shared lock until Permit.Done. A refused write is recorded
// and returned as ErrStaleToken, ErrLeaseExpired, ErrLeaseReleased,
// ErrUnknownLease or ErrLeaseNotOwned.
func (s *Service) Admit(ctx context.Context, leaseID string, w Write) (*Permit, error) {
	if lease, state, ok := s.stale.get(leaseID); ok {
		if err := ownedBy(lease, w.Principal); err != nil {
			return nil, s.reject(ctx, err, lease, Resource{}, w)
		}
		if _, refusal := s.judge(lease, state); refusal != nil {
			return s.refuse(ctx, refusal, lease, state, w)
		}
	}
	if s.fencer != nil {
		return s.admitFenced(ctx, leaseID, w)
	}
	var lease Lease
	var early *Resource
	var err error
	if ls, ok := s.store.(LeaseStater); ok {
		var state Resource
		lease, state, err = ls.LeaseState(ctx, leaseID)
		early = &state
	} else {
		lease, err = s.store.Lease(ctx, leaseID)
	}
	if errors.Is(err, ErrNotFound) {
		return nil, s.reject(ctx, &Error{Kind: ErrUnknownLease}, Lease{ID: leaseID}, Resource{}, w)
	}
	if err != nil {
		return nil, err
	}
	if err := ownedBy(lease, w.Principal); err != nil {
		// Before the lock: the owner never changes, and a stolen lease id
		// must not even delay a grant.
		return nil, s.reject(ctx, err, lease, Resource{}, w)
	}
	if early != nil {
		// Every refusal Judge makes is final: tokens never go down, a lease
		// that is no longer its resource's current one never becomes it
		// again, a released lease stays released and an expired one cannot
		// be renewed. The shared lock orders writes against grants; for a
		// write that will be refused whatever happens next it has nothing
		// to order, and skipping it spares the store a lock round trip per
		// stale write in a storm.
		if _, refusal := s.judge(lease, *early); refusal != nil {
			s.rememberStale(refusal, lease, *early)
			return s.refuse(ctx, refusal, lease, *early, w)
		}
	}
	var waited func()
	if s.onLockWait != nil {
		waited = s.onLockWait(ctx)
	}
	unlock, err := s.locker.Shared(ctx, lease.Resource)
	if waited != nil {
		waited()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, Unavailable("shared lock", err)
	}
	state, err := s.store.Resource(ctx, lease.Resource)
	if err != nil {
		unlock()
		if errors.Is(err, ErrNotFound) { // a lease without a resource: the store lost it
			err = Unavailable("resource state", err)
		}
		return nil, err
	}
	admitted, refusal := s.judge(lease, state)
	if refusal != nil {
		unlock()
		s.rememberStale(refusal, lease, state)
		return s.refuse(ctx, refusal, lease, state, w)
	}
	return &Permit{Lease: admitted, svc: s, unlock: unlock}, nil
}

// refuse ends an admission the fence rule (Judge) turned down: refused and
// recorded, or, on an observing upstream (Write.Observe), recorded as would
// refuse and admitted without a lock. Every caller has released the lock
// it took: an observed write must not delay the grants of a resource it
// is not fenced on.
func (s *Service) refuse(ctx context.Context, refusal error, lease Lease, state Resource, w Write) (*Permit, error) {
	if !w.Observe {
		return nil, s.reject(ctx, refusal, lease, state, w)
	}
	s.record(ctx, refusal, lease, state, w, true)
	return &Permit{Lease: lease, WouldRefuse: refusal, svc: s, unlock: func() {}}, nil
}

// judge applies the fence rule (Judge) to a write under lease, given its
// resource's state. A write that passes is admitted under the state's copy
// of the lease, which carries its latest renewal.
func (s *Service) judge(lease Lease, state Resource) (Lease, error) {
	if failpoint.HighestSeen {
		return lease, judgeHighestSeen(lease)
	}
	if refusal := Judge(lease, state, s.Clock(state)); refusal != nil {
		return Lease{}, refusal
	}
	return *state.Lease, nil
}

// admitFenced is Admit with a Fencer.
func (s *Service) admitFenced(ctx context.Context, leaseID string, w Write) (*Permit, error) {
	var waited func()
	if s.onLockWait != nil {
		waited = s.onLockWait(ctx)
	}
	lease, state, held, err := s.fencer.Hold(ctx, leaseID)
	if waited != nil {
		waited()
	}
	if errors.Is(err, ErrNotFound) {
		return nil, s.reject(ctx, &Error{Kind: ErrUnknownLease}, Lease{ID: leaseID}, Resource{}, w)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := ownedBy(lease, w.Principal); err != nil {
		held.Release()
		return nil, s.reject(ctx, err, lease, state, w)
	}
	admitted, refusal := s.judge(lease, state)
	if refusal != nil {
		held.Release()
		s.rememberStale(refusal, lease, state)
		return s.refuse(ctx, refusal, lease, state, w)
	}
	return &Permit{Lease: admitted, svc: s, held: held}, nil
}

// rememberStale caches a stale_token verdict (see staleCache). Expired and
// released verdicts are not cached: a later grant turns them into
// stale_token, which the answer must then say.
func (s *Service) rememberStale(refusal error, lease Lease, state Resource) {
	if errors.Is(refusal, ErrStaleToken) {
		s.stale.put(lease, state)
	}
}

// Outcome is what the gateway knows of an admitted write when it ends.
type Outcome int

const (
	// OutcomeKnown: the upstream answered, or the write was never sent.
	OutcomeKnown Outcome = iota
	// OutcomeUnknown: the request left but no answer came (upstream
	// timeout, connection broken after sending); the write may still land.
	OutcomeUnknown
)

// Done ends the write. OutcomeUnknown starts the drain period before the
// shared lock is released, so that no grant can slip in between.
func (p *Permit) Done(outcome Outcome) {
	if outcome == OutcomeUnknown && p.WouldRefuse == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.svc.store.Drain(ctx, p.Lease.Resource, p.svc.drainPeriod); err != nil {
			// The store is unreachable, so grants fail closed anyway.
			p.svc.log.Error("could not start drain period", "resource", p.Lease.Resource, "err", err)
		}
		cancel()
	}
	if p.held != nil {
		p.held.Release()
		return
	}
	p.unlock()
}

// Judge applies the fence rule (Resource.StateOf, which holds its
// precedence) to a write under lease, given the resource's state read under
// its shared lock, at now. It returns nil if the write may pass, or an
// *Error explaining the refusal: ErrStaleToken for a superseded lease (even
// if it also expired), else ErrLeaseReleased, else ErrLeaseExpired.
func Judge(lease Lease, r Resource, now time.Time) error {
	var kind error
	switch r.StateOf(lease, now) {
	case StateCurrent:
		return nil
	case StateReleased:
		kind = ErrLeaseReleased
	case StateExpired:
		kind = ErrLeaseExpired
	default:
		kind = ErrStaleToken
	}
	e := &Error{Kind: kind, Resource: lease.Resource, Token: lease.Token, CurrentToken: r.Token, Holder: lease.Holder, ExpiresAt: lease.ExpiresAt}
	if current := r.Lease; current != nil && current.ID == lease.ID {
		e.ExpiresAt = current.ExpiresAt // a renewal since lease was read
	}
	return e
}

func (s *Service) reject(ctx context.Context, refusal error, lease Lease, state Resource, w Write) error {
	s.record(ctx, refusal, lease, state, w, false)
	return refusal
}

// record records a refusal; wouldRefuse: on an observing upstream, which
// forwards the write anyway.
func (s *Service) record(ctx context.Context, refusal error, lease Lease, state Resource, w Write, wouldRefuse bool) {
	e := ErrorOf(refusal)
	rej := Rejection{
		Resource:     lease.Resource,
		Code:         CodeOf(e.Kind),
		Token:        lease.Token,
		CurrentToken: state.Token,
		Holder:       lease.Holder,
		LeaseHint:    LeaseHint(lease.ID),
		Method:       w.Method,
		Upstream:     w.Upstream,
		Path:         w.Path,
		Principal:    w.Principal,
		WouldRefuse:  wouldRefuse,
		TraceID:      w.TraceID,
	}
	// A flood of unauthenticated unknown leases is recorded at a
	// bounded rate (flood.go); a refusal for another principal's lease is
	// recorded with its resource's current token (Admit refuses it before
	// reading the state) and logged.
	switch {
	case e.Kind == ErrUnknownLease && w.Principal == "" && !s.flood.record(s.now(), s.log):
		return
	case e.Kind == ErrLeaseNotOwned:
		if state.Name == "" && lease.Resource != "" {
			if st, err := s.store.Resource(ctx, lease.Resource); err == nil {
				state, rej.CurrentToken = st, st.Token
			}
		}
		s.log.Warn("write under another principal's lease refused", "principal", w.Principal, "resource", lease.Resource,
			"holder", lease.Holder, "lease", rej.LeaseHint, "token", lease.Token, "method", w.Method, "upstream", w.Upstream, "path", RedactLeaseIDs(w.Path))
	}
	if current := state.Lease; current != nil && current.ID == lease.ID {
		lease = *current
	}
	switch {
	case lease.Released():
		rej.LeaseEndedAt = lease.ReleasedAt
	case !lease.ExpiresAt.IsZero() && !s.Clock(state).Before(lease.ExpiresAt):
		rej.LeaseEndedAt = lease.ExpiresAt
	}
	// Record with a context of its own: the client hanging up must not
	// erase the evidence.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	recorded, err := s.store.RecordRejection(rctx, rej)
	if err != nil {
		s.log.Error("could not record rejection", "resource", rej.Resource, "code", rej.Code, "err", err)
		recorded = rej
		recorded.At = s.now()
		recorded.Repeats, recorded.FirstAt = 1, recorded.At
	}
	s.onReject(recorded)
}
