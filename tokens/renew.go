package tokens

// Renewing, releasing and revoking a lease: each a store change under the
// resource's exclusive lock, bounded by the grant wait (storeBound).

import (
	"context"
	"errors"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
)

// RenewRequest asks to extend a lease.
type RenewRequest struct {
	LeaseID string
	// TTL is the new TTL; 0 reuses the lease's.
	TTL time.Duration
	// Principal is the authenticated caller ("" without authentication):
	// any other than the lease's owner gets ErrLeaseNotOwned and changes
	// nothing. MaxTTL is its cap on TTL (0: none).
	Principal string
	MaxTTL    time.Duration
}

// Renew extends a current lease.
func (s *Service) Renew(ctx context.Context, req RenewRequest) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.grantWait) // see storeBound
	defer cancel()
	if req.TTL != 0 {
		if err := s.limits.ValidateTTL(req.TTL, req.MaxTTL, req.Principal); err != nil {
			return Lease{}, err
		}
	}
	if err := s.checkOwner(ctx, req.LeaseID, req.Principal); err != nil {
		return Lease{}, err
	}
	return s.store.Renew(ctx, req.LeaseID, req.TTL)
}

// Release ends a current lease (idempotent for its holder). principal is
// checked as in Renew.
func (s *Service) Release(ctx context.Context, leaseID string, principal string) (Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.grantWait) // see storeBound
	defer cancel()
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

// storeBound: a renewal, release or revocation waits for the store at
// most the grant wait (--grant-wait), the gateway's bound on a change a
// client waits for: a stalled store (a disk whose fsync hangs) answers 503
// store_unavailable then. A release or revocation that gave up is reported
// as failed even if the store applies it later; its holder may send it
// again (both are idempotent).

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
	unlock, err := s.exclusive.Exclusive(lockCtx, lease.Resource)
	if err != nil {
		// The lock's bound and the call's (storeBound) are one: its end
		// is the writes', not the caller's.
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, &Error{Kind: ErrFenceBusy, Resource: lease.Resource, Detail: "writes in flight under the lease are still running", RetryAfter: time.Second}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
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
	ctx, cancel := context.WithTimeout(ctx, s.grantWait) // see storeBound
	defer cancel()
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
