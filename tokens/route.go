package tokens

import "context"

// Route bindings (gateway/routes.go) refuse an admitted write whose lease is
// for a resource the write's route does not take. The refusal is recorded
// like every other refused write.

// ErrResourceMismatch: a write under a live lease for another resource than
// the ones its route binds (a lease on res:b writing to res:a's path).
// Nothing is forwarded.
var ErrResourceMismatch = NewKind(CodeResourceMismatch, "lease for another resource")

// CodeResourceMismatch is the problem and rejection code of ErrResourceMismatch.
const CodeResourceMismatch = "resource_mismatch"

// Refuse ends an admitted write without forwarding it (like Done(OutcomeKnown))
// and records the refusal, which must wrap a sentinel whose code the
// rejection log knows (ErrResourceMismatch). It returns refusal.
func (p *Permit) Refuse(ctx context.Context, refusal error, w Write) error {
	p.Done(OutcomeKnown)
	// The lease was the resource's current one when it was admitted.
	state := Resource{Name: p.Lease.Resource, Token: p.Lease.Token, Lease: &p.Lease}
	return p.svc.reject(ctx, refusal, p.Lease, state, w)
}
