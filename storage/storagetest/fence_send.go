package storagetest

import (
	"errors"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// The proof before every byte (tokens.Permit.Check): a write admitted on a
// replica whose lock session then dies can no longer prove its fence by
// the time another replica's newer grant returns, so none of its bytes
// can be sent after the new holder's; a write on a live session keeps its
// proof across many session checks; and the replica admits and proves
// again once its sessions are back.
func testFenceSessionKilledLosesProof(t *testing.T, h FenceHarness) {
	rs := h.Replicas(t, 2, fenceOpts)
	a, b := rs[0].Service(fenceOpts), rs[1].Service(fenceOpts)
	old := acquireOn(t, a, "proof", "old", fenceTTL)
	p := admit(t, a, old) // admitted; its body has not been sent yet
	defer p.Done(tokens.OutcomeKnown)
	if err := p.Check(proofDeadline()); err != nil {
		t.Fatalf("a write just admitted cannot prove its fence: %v", err)
	}
	// Health checks renew the proof: a live session never loses it. The
	// lease expiring does not matter either: the fence is still held.
	time.Sleep(3 * fenceOpts.SessionCheck)
	if err := p.Check(proofDeadline()); err != nil {
		t.Fatalf("a write on a live session lost its proof after three session checks: %v", err)
	}
	// Nor does it say the fence is lost (Permit.Lost, which the engine
	// watches while a request is half-sent).
	lost := p.Lost()
	if lost == nil {
		t.Fatal("a fenced write has no Lost signal: a half-sent request could not be reset when its fence is lost")
	}
	select {
	case <-lost:
		t.Fatal("a write on a live session was told its fence is lost")
	default:
	}

	rs[0].KillSessions(t)
	l, err := b.Acquire(t.Context(), tokens.AcquireRequest{Resource: "proof", Holder: "new", TTL: 10 * time.Second,
		Wait: fenceOpts.DrainPeriod + fenceOpts.SessionCheck + 5*time.Second})
	if err != nil {
		t.Fatalf("grant after the old replica's session died: %v", err)
	}
	if err := p.Check(proofDeadline()); !errors.Is(err, tokens.ErrFenceLost) {
		t.Fatalf("token %d was granted on another replica, and token %d's write on the replica whose session died could still send: Check = %v, want ErrFenceLost",
			l.Token, old.Token, err)
	}
	// And the fence says it is lost for good, without a byte to send: the
	// session's death dropped it.
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the fence of a write whose session died was never signalled lost (Permit.Lost): a quiet half-sent request would stay open at the upstream")
	}

	// Liveness: the replica reconnects and writes under the new lease,
	// with a proof, within seconds.
	waitSucceeds(t, 15*time.Second, 50*time.Millisecond, "the replica whose sessions were killed writing again", func() error {
		q, err := a.Admit(t.Context(), l.ID, tokens.Write{Method: "POST", Upstream: "u", Path: "/x"})
		if err != nil {
			return err
		}
		defer q.Done(tokens.OutcomeKnown)
		return q.Check(proofDeadline())
	})
}

// proofDeadline is the deadline the suite's proofs are taken with: as long
// as any health check takes to settle (a write's forward timeout in the
// gateway), so that a proof answers on the session's state, never on the
// deadline.
func proofDeadline() time.Time { return time.Now().Add(time.Minute) }
