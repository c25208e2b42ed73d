package tokens

import "context"

// The gateway refuses some writes that Admit let through: route bindings
// (gateway/routes.go) one whose lease is for a resource the write's route
// does not take, the key's resource prefixes one whose key may no longer
// use the lease's resource. Each refusal is recorded like every other
// refused write, through Refuse.

// ErrResourceMismatch: a write under a live lease for another resource than
// the ones its route binds (a lease on res:b writing to res:a's path).
// Nothing is forwarded.
var ErrResourceMismatch = NewKind(CodeResourceMismatch, "lease for another resource")

// CodeResourceMismatch is the problem and rejection code of ErrResourceMismatch.
const CodeResourceMismatch = "resource_mismatch"

// CodeForbidden is the problem code of the gateway's refusal of a call its
// key's role or resource prefixes do not allow (its kind is the HTTP
// layer's, internal/problems.ErrForbidden), and a rejection code: a key's
// prefixes can be narrowed (a new auth file) while a lease it acquired
// lives, and its writes under that lease are then refused and recorded.
const CodeForbidden = "forbidden"

// Refuse ends an admitted write without forwarding it (like Done(OutcomeKnown))
// and records the refusal, which must wrap a sentinel whose code the
// rejection log knows (ErrResourceMismatch, the HTTP layer's forbidden).
// It returns refusal.
func (p *Permit) Refuse(ctx context.Context, refusal error, w Write) error {
	p.Done(OutcomeKnown)
	// The lease was the resource's current one when it was admitted.
	state := Resource{Name: p.Lease.Resource, Token: p.Lease.Token, Lease: &p.Lease}
	return p.svc.reject(ctx, refusal, p.Lease, state, w)
}

// RefuseUnadmitted records the refusal of a write turned away before
// admission because of who sent it (its key's role may not write at all),
// under the lease it presented, and returns refusal (the HTTP layer's
// forbidden). It takes no lock and judges nothing, so a key that may not
// write cannot delay a grant; it reads the lease and its resource, within
// rejectionWait, only to say whose lease it was. A lease the store does
// not know (or cannot read in time) is recorded under its hint alone.
func (s *Service) RefuseUnadmitted(ctx context.Context, leaseID string, refusal error, w Write) error {
	rctx, cancel := context.WithTimeout(ctx, rejectionWait)
	defer cancel()
	lease, err := s.store.Lease(rctx, leaseID)
	if err != nil {
		lease = Lease{ID: leaseID}
	}
	var state Resource
	if lease.Resource != "" {
		if st, err := s.store.Resource(rctx, lease.Resource); err == nil {
			state = st
		}
	}
	return s.reject(ctx, refusal, lease, state, w)
}
