package tokens

// Admitting a fenced write: Service.Admit judges the lease against its
// resource's state (the fence rule, Judge) and returns a Permit that holds
// the resource's shared side until Done; the embedded mode's path (a
// Locker) and the replicated modes' (a Fencer's verdict) end here.

import (
	"context"
	"errors"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
)

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
	unlock      func() // without a Fencer, from a Locker
	local       hold   // without a Fencer, from a LocalLocker (lockShared)
	held        Held   // with a Fencer
}

// Check returns nil if the write may send bytes to the upstream now, or an
// error wrapping ErrFenceLost if its fence cannot be proven held by
// deadline (see Held.Check, which may wait that long for a slow session
// check, and no longer): nothing more of the write may then be sent, and
// what was sent is an unknown outcome. Without a Fencer (the embedded mode) it
// is always nil: the lock lives in the process, and cannot be lost unless
// the process dies, and a dead process sends nothing. An observed write
// holds no fence, and is not checked.
func (p *Permit) Check(deadline time.Time) error {
	if p.held == nil || failpoint.NoSendCheck {
		return nil
	}
	return p.held.Check(deadline)
}

// Lost returns a channel closed once the write's fence is definitely lost
// (see Held.Lost), for a write that has nothing to send and must not stay
// half-sent at the upstream after its fence is gone. Nil (never closed)
// where Check is always nil: without a Fencer (the embedded mode's lock
// cannot be lost while the process lives), for an observed write, and in
// the build without the proof.
func (p *Permit) Lost() <-chan struct{} {
	if p.held == nil || failpoint.NoSendCheck {
		return nil
	}
	return p.held.Lost()
}

// Admit checks that leaseID is its resource's current live lease and holds
// the resource's shared lock until Permit.Done. A refused write is recorded
// and returned as ErrStaleToken, ErrLeaseExpired, ErrLeaseReleased,
// ErrUnknownLease or ErrLeaseNotOwned.
func (s *Service) Admit(ctx context.Context, leaseID string, w Write) (*Permit, error) {
	return s.AdmitInto(ctx, leaseID, w, nil)
}

// AdmitInto is Admit with the Permit in into, the caller's storage (zero,
// and unused until then; nil: a new Permit), which it returns if it admits
// the write: a caller that keeps state of its own per write keeps the
// Permit there, without an allocation of its own. The storage must then
// live as long as the Permit is used (Done may keep it for a drain).
func (s *Service) AdmitInto(ctx context.Context, leaseID string, w Write, into *Permit) (*Permit, error) {
	if lease, state, ok := s.stale.get(leaseID); ok {
		if err := ownedBy(lease, w.Principal); err != nil {
			return nil, s.reject(ctx, err, lease, Resource{}, w)
		}
		if _, refusal := s.judge(lease, state); refusal != nil {
			return s.refuse(ctx, refusal, lease, state, w, into)
		}
	}
	if s.fencer != nil {
		return s.admitFenced(ctx, leaseID, w, into)
	}
	lease, err := s.store.Lease(ctx, leaseID)
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
	var waited func()
	if s.onLockWait != nil {
		waited = s.onLockWait(ctx)
	}
	p := permitIn(into)
	p.svc = s
	err = s.lockShared(ctx, lease.Resource, p)
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
		p.release()
		if errors.Is(err, ErrNotFound) { // a lease without a resource: the store lost it
			err = Unavailable("resource state", err)
		}
		return nil, err
	}
	admitted, refusal := s.judge(lease, state)
	if refusal != nil {
		p.release()
		s.rememberStale(refusal, lease, state)
		return s.refuse(ctx, refusal, lease, state, w, p)
	}
	p.Lease = admitted
	return p, nil
}

// permitIn is the storage of a Permit: into, if not nil, else a new one.
func permitIn(into *Permit) *Permit {
	if into == nil {
		return new(Permit)
	}
	return into
}

// lockShared takes the resource's shared lock for p, without a Fencer.
// The embedded mode's LocalLocker keeps it in p itself: one allocation for
// the permit and its lock.
func (s *Service) lockShared(ctx context.Context, resource string, p *Permit) error {
	if l, ok := s.locker.(*LocalLocker); ok {
		return l.shared(ctx, resource, &p.local)
	}
	unlock, err := s.locker.Shared(ctx, resource)
	p.unlock = unlock
	return err
}

// refuse ends an admission the fence rule (Judge) turned down: refused and
// recorded, or, on an observing upstream (Write.Observe), recorded as would
// refuse and admitted without a lock. Every caller has released the lock
// it took: an observed write must not delay the grants of a resource it
// is not fenced on. An admitted write's Permit is into (permitIn), whose
// former use, if any, is over.
func (s *Service) refuse(ctx context.Context, refusal error, lease Lease, state Resource, w Write, into *Permit) (*Permit, error) {
	if !w.Observe {
		return nil, s.reject(ctx, refusal, lease, state, w)
	}
	s.record(ctx, refusal, lease, state, w, true)
	p := permitIn(into)
	*p = Permit{Lease: lease, WouldRefuse: refusal, svc: s, unlock: func() {}}
	return p, nil
}

// judge applies the fence rule (Judge) to a write under lease, given its
// resource's state: the embedded mode's one judgement of a write, and the
// stale cache's in both modes. (With a Fencer, the Fencer judges: see
// admitFenced.) A write that passes is admitted under the state's copy of
// the lease, which carries its latest renewal.
func (s *Service) judge(lease Lease, state Resource) (Lease, error) {
	if failpoint.HighestSeen {
		return lease, judgeHighestSeen(lease)
	}
	if refusal := Judge(lease, state, s.Clock(state)); refusal != nil {
		return Lease{}, refusal
	}
	return *state.Lease, nil
}

// admitFenced is Admit with a Fencer. The Fencer has judged the write
// (Fencer.Hold), once per state it read, and its verdict is used as it
// is: judging again here would decide the same thing twice.
func (s *Service) admitFenced(ctx context.Context, leaseID string, w Write, into *Permit) (*Permit, error) {
	var waited func()
	if s.onLockWait != nil {
		waited = s.onLockWait(ctx)
	}
	v, err := s.fencer.Hold(ctx, leaseID)
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
	if err := ownedBy(v.Lease, w.Principal); err != nil {
		if v.Held != nil {
			v.Held.Release()
		}
		return nil, s.reject(ctx, err, v.Lease, v.State, w)
	}
	if v.Refusal != nil {
		s.rememberStale(v.Refusal, v.Lease, v.State)
		return s.refuse(ctx, v.Refusal, v.Lease, v.State, w, into)
	}
	p := permitIn(into)
	*p = Permit{Lease: v.Lease, svc: s, held: v.Held}
	return p, nil
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

// Done ends the write. It never waits for the store. OutcomeUnknown puts
// the resource in a drain period and keeps the write's fence (shared lock)
// until the store has recorded it or it has passed (drain.go), so that no
// grant can slip in between, whatever the store does meanwhile.
func (p *Permit) Done(outcome Outcome) {
	if outcome == OutcomeUnknown && p.WouldRefuse == nil {
		p.svc.drain(p.Lease.Resource, p.release)
		return
	}
	p.release()
}

// release gives up the permit's fence: its Fencer's hold, or its lock.
// (A method, not a func field set at admission: a func value of the lock
// would cost the common write an allocation.) Safe to call more than once
// for a lock; a Fencer's hold is released once (Done).
func (p *Permit) release() {
	switch {
	case p.held != nil:
		p.held.Release()
	case p.local.l != nil:
		p.local.unlock()
	case p.unlock != nil:
		p.unlock()
	}
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
			rctx, cancel := context.WithTimeout(ctx, rejectionWait)
			st, err := s.store.Resource(rctx, lease.Resource)
			cancel()
			if err == nil {
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
	// The answer waits for the record only briefly (late.go): a refusal
	// must not wait long for its evidence, which goes on being recorded.
	recorded, ok := s.recordRejection(ctx, rej)
	if !ok {
		recorded = rej
		recorded.At = s.now()
		recorded.Repeats, recorded.FirstAt = 1, recorded.At
	}
	s.onReject(recorded)
}
