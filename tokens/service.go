package tokens

import (
	"context"
	"errors"
	"log/slog"
	"time"
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
	Logger      *slog.Logger
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
type Service struct {
	store       Store
	locker      Locker
	now         func() time.Time
	limits      Limits
	grantWait   time.Duration
	drainPeriod time.Duration
	onReject    func(Rejection)
	log         *slog.Logger
	stale       *staleCache
	flood       floodGate // flood.go
}

// New returns a Service; Store and Locker are required.
func New(cfg Config) *Service {
	s := &Service{
		store:       cfg.Store,
		locker:      cfg.Locker,
		now:         cfg.Now,
		limits:      cfg.Limits,
		grantWait:   cfg.GrantWait,
		drainPeriod: cfg.DrainPeriod,
		onReject:    cfg.OnRejection,
		log:         cfg.Logger,
		stale:       newStaleCache(),
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
// waits up to req.Wait for it, then returns ErrLeaseHeld; if in-flight
// writes of the previous token or a drain period keep it closed for longer
// than the grant wait (or req.Wait, if longer) it returns ErrFenceBusy.
func (s *Service) Acquire(ctx context.Context, req AcquireRequest) (Lease, error) {
	if err := s.validateAcquire(req); err != nil {
		return Lease{}, err
	}
	start := time.Now() // monotonic; waits are the gateway's own business
	waitUntil := start.Add(req.Wait)
	fenceUntil := start.Add(max(s.grantWait, req.Wait))
	grant := GrantRequest{LeaseID: NewLeaseID(), Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, TTL: req.TTL}
	for {
		lease, err := s.grantOnce(ctx, grant, fenceUntil)
		if err == nil {
			s.stale.forget(lease.Resource) // their current token moved on
			return lease, nil
		}
		var retry time.Duration
		switch {
		case errors.Is(err, ErrLeaseHeld):
			retry = time.Until(waitUntil)
		case errors.Is(err, ErrFenceBusy):
			retry = time.Until(fenceUntil)
		}
		if retry <= 0 {
			return Lease{}, err
		}
		// Poll: a holder's expiry or a drain's end is known, a release is
		// not. Sleep until the sooner of those and a short poll interval.
		sleep := 25 * time.Millisecond
		if f := Facts(err); f != nil && f.RetryAfter > 0 && f.RetryAfter < sleep {
			sleep = f.RetryAfter
		}
		sleep = min(sleep, retry)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return Lease{}, ctx.Err()
		case <-t.C:
		}
	}
}

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
		if h := cur.Holder(s.clock(cur)); h != nil {
			return Lease{}, heldError(*h, s.clock(cur))
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

func (s *Service) clock(r Resource) time.Time {
	if !r.Now.IsZero() {
		return r.Now
	}
	return s.now()
}

// Renew extends a current lease; ttl 0 reuses the lease's TTL. principal
// is the authenticated caller ("" without authentication): any other than
// the lease's owner gets ErrNotOwner and changes nothing.
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
	return s.store.Release(ctx, leaseID)
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
	return s.store.Revoke(ctx, leaseID, by)
}

// checkOwner refuses a principal other than the lease's owner. Reading the
// owner before the change is safe: a lease's owner never changes, so the
// check cannot be outdated by the time the store acts.
func (s *Service) checkOwner(ctx context.Context, leaseID, principal string) error {
	if principal == "" || breakNoOwner {
		return nil
	}
	lease, err := s.store.Lease(ctx, leaseID)
	if err != nil {
		return err
	}
	if lease.Owner != principal {
		return notOwned(lease)
	}
	return nil
}

func notOwned(l Lease) error {
	return &Error{Kind: ErrNotOwner, Resource: l.Resource, Token: l.Token,
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

// leaseStater is a Store that reads a lease and its resource's state in
// one round trip (PostgreSQL). Admit then refuses writes under ended leases
// without taking the resource's lock.
type leaseStater interface {
	LeaseState(ctx context.Context, leaseID string) (Lease, Resource, error)
}

// Write describes a write a worker wants forwarded, for the rejection log.
type Write struct {
	Method   string
	Upstream string
	Path     string
	// Principal is the authenticated caller ("" without authentication);
	// any other than the lease's owner is refused with ErrNotOwner.
	Principal string
}

// Permit is an admitted write. Its holder must call Done exactly once, after
// the upstream answered or the forward gave up.
type Permit struct {
	Lease  Lease
	svc    *Service
	unlock func()
}

// Admit checks that leaseID is its resource's current live lease and holds
// the resource's shared lock until Permit.Done. A refused write is recorded
// and returned as ErrStaleToken, ErrLeaseExpired, ErrLeaseReleased,
// ErrUnknownLease or ErrNotOwner.
func (s *Service) Admit(ctx context.Context, leaseID string, w Write) (*Permit, error) {
	if lease, state, ok := s.stale.get(leaseID); ok && !breakHighestSeen {
		if w.Principal != "" && lease.Owner != w.Principal && !breakNoOwner {
			return nil, s.reject(ctx, notOwned(lease), lease, Resource{}, w)
		}
		return nil, s.reject(ctx, Judge(lease, state, s.clock(state)), lease, state, w)
	}
	var lease Lease
	var early *Resource
	var err error
	if ls, ok := s.store.(leaseStater); ok && !breakHighestSeen {
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
	if w.Principal != "" && lease.Owner != w.Principal && !breakNoOwner {
		// Before the lock: the owner never changes, and a stolen lease id
		// must not even delay a grant.
		return nil, s.reject(ctx, notOwned(lease), lease, Resource{}, w)
	}
	if early != nil {
		// Every refusal Judge makes is final: tokens never go down, a lease
		// that is no longer its resource's current one never becomes it
		// again, a released lease stays released and an expired one cannot
		// be renewed. The shared lock orders writes against grants; for a
		// write that will be refused whatever happens next it has nothing
		// to order, and skipping it spares the store a lock round trip per
		// stale write in a storm.
		if refusal := Judge(lease, *early, s.clock(*early)); refusal != nil {
			s.rememberStale(refusal, lease, *early)
			return nil, s.reject(ctx, refusal, lease, *early, w)
		}
	}
	unlock, err := s.locker.Shared(ctx, lease.Resource)
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
	if breakHighestSeen {
		if refusal := judgeHighestSeen(lease); refusal != nil {
			unlock()
			return nil, s.reject(ctx, refusal, lease, state, w)
		}
		return &Permit{Lease: lease, svc: s, unlock: unlock}, nil
	}
	if refusal := Judge(lease, state, s.clock(state)); refusal != nil {
		unlock()
		s.rememberStale(refusal, lease, state)
		return nil, s.reject(ctx, refusal, lease, state, w)
	}
	return &Permit{Lease: *state.Lease, svc: s, unlock: unlock}, nil
}

// rememberStale caches a stale_token verdict (see staleCache). Expired and
// released verdicts are not cached: a later grant turns them into
// stale_token, which the answer must then say.
func (s *Service) rememberStale(refusal error, lease Lease, state Resource) {
	if errors.Is(refusal, ErrStaleToken) {
		s.stale.put(lease, state)
	}
}

// Done ends the write. outcomeUnknown (upstream timeout, broken connection)
// starts the drain period before the shared lock is released, so that no
// grant can slip in between.
func (p *Permit) Done(outcomeUnknown bool) {
	if outcomeUnknown {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.svc.store.Drain(ctx, p.Lease.Resource, p.svc.drainPeriod); err != nil {
			// The store is unreachable, so grants fail closed anyway.
			p.svc.log.Error("could not start drain period", "resource", p.Lease.Resource, "err", err)
		}
		cancel()
	}
	p.unlock()
}

// Judge applies the fence rules to a write under lease, given the resource's
// state read under its shared lock, at now. It returns nil if the write may
// pass, or an *Error explaining the refusal. A newer grant wins over expiry:
// a superseded lease is stale even if it also expired.
func Judge(lease Lease, r Resource, now time.Time) error {
	current := r.Lease
	refuse := func(kind error) error {
		e := &Error{Kind: kind, Resource: lease.Resource, Token: lease.Token, CurrentToken: r.Token, Holder: lease.Holder, ExpiresAt: lease.ExpiresAt}
		if current != nil && current.ID == lease.ID {
			e.ExpiresAt = current.ExpiresAt
		}
		return e
	}
	if r.Token > lease.Token || current == nil || current.ID != lease.ID {
		return refuse(ErrStaleToken)
	}
	if current.Released() {
		return refuse(ErrLeaseReleased)
	}
	if !now.Before(current.ExpiresAt) {
		return refuse(ErrLeaseExpired)
	}
	return nil
}

func (s *Service) reject(ctx context.Context, refusal error, lease Lease, state Resource, w Write) error {
	e := Facts(refusal)
	rej := Rejection{
		Resource:     lease.Resource,
		Code:         codeOf(e.Kind),
		Token:        lease.Token,
		CurrentToken: state.Token,
		Holder:       lease.Holder,
		LeaseHint:    LeaseHint(lease.ID),
		Method:       w.Method,
		Upstream:     w.Upstream,
		Path:         w.Path,
		Principal:    w.Principal,
	}
	// Issue 15: a flood of unauthenticated unknown leases is recorded at a
	// bounded rate (flood.go); a refusal for another principal's lease is
	// recorded with its resource's current token (Admit refuses it before
	// reading the state) and logged.
	switch {
	case e.Kind == ErrUnknownLease && w.Principal == "" && !s.flood.record(s.now(), s.log):
		return refusal
	case e.Kind == ErrNotOwner:
		if state.Name == "" && lease.Resource != "" {
			if st, err := s.store.Resource(ctx, lease.Resource); err == nil {
				state, rej.CurrentToken = st, st.Token
			}
		}
		s.log.Warn("write under another principal's lease refused", "principal", w.Principal, "resource", lease.Resource,
			"holder", lease.Holder, "lease", rej.LeaseHint, "token", lease.Token, "method", w.Method, "upstream", w.Upstream, "path", w.Path)
	}
	if current := state.Lease; current != nil && current.ID == lease.ID {
		lease = *current
	}
	switch {
	case lease.Released():
		rej.LeaseEndedAt = lease.ReleasedAt
	case !lease.ExpiresAt.IsZero() && !s.clock(state).Before(lease.ExpiresAt):
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
	}
	s.onReject(recorded)
	return refusal
}

func codeOf(kind error) string {
	switch kind {
	case ErrStaleToken:
		return CodeStaleToken
	case ErrLeaseExpired:
		return CodeLeaseExpired
	case ErrLeaseReleased:
		return CodeLeaseReleased
	case ErrNotOwner:
		return CodeNotOwner
	case ErrWrongResource: // route.go
		return CodeWrongResource
	default:
		return CodeUnknownLease
	}
}
