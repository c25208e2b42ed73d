package postgres

// A write's hold on a replica's shared fence (tokens.Held), and the proof
// taken before each byte of the write is sent (see point 4 at the top of
// fence.go).

import (
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// heldRef is one admitted write's hold on a fence (tokens.Held).
type heldRef struct {
	f    *Fence
	hf   *heldFence
	done atomic.Bool
}

// Release ends the write's hold on the fence.
func (h *heldRef) Release() {
	if !h.done.Swap(true) {
		h.f.release(h.hf)
	}
}

// Check is the proof taken before each byte of the write is sent (see
// point 4 at the top of fence.go): the fence was not dropped, and the
// session that took its lock is still the connected one and was confirmed
// alive by a check sent less than SessionCheck ago. Two atomic loads and a
// monotonic clock read; no lock, no allocation, no I/O.
//
// A session that is neither confirmed lately nor known lost (its check is
// only slow: a CPU-starved replica, a busy database, a replica that was
// just stopped and continued) is waited for, not given up, until deadline
// at the latest: the health check in progress settles it (it confirms the
// session, and the bytes leave on that fresh proof, or it fails or times
// out after sessionPingTimeout and destroys it, and nothing more leaves).
// The wait is on the session's settle signal, not a poll, and only this
// slow path allocates (a timer). Failing at once would turn every load
// spike into writes cut short; a zero deadline does, for callers that must
// not wait.
func (h *heldRef) Check(deadline time.Time) error {
	hf := h.hf
	if hf.dropped.Load() || hf.sess.gen.Load() != hf.gen {
		return errFenceLost
	}
	if hf.sess.confirmed(time.Now(), hf.gen) {
		return nil
	}
	return h.waitConfirmed(deadline)
}

// Lost is the fence's gone channel (tokens.Held.Lost), closed when the
// fence is dropped (Check's dropped condition). A session destroyed drops
// every fence that was taken on it (lockSession.fail, Fence.Close), so
// Check's other condition, a session generation that changed, closes it
// too. A fence is dropped under a write only if it is lost: one given up
// (yielded) is unlocked only once no write holds it.
func (h *heldRef) Lost() <-chan struct{} { return h.hf.gone }

// waitConfirmed is Check's slow path: it waits for the session's health
// check in progress to settle, until deadline at the latest.
func (h *heldRef) waitConfirmed(deadline time.Time) error {
	hf := h.hf
	ls := hf.sess
	var until time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// Taken before the test: a check that settles in between closes
		// this very channel, so the wait below cannot miss it.
		settled := ls.settled.Load()
		if hf.dropped.Load() || ls.gen.Load() != hf.gen {
			return errFenceLost
		}
		now := time.Now()
		if ls.confirmed(now, hf.gen) {
			return nil
		}
		if until.IsZero() {
			// Past this the health loop has stopped (closing): a check
			// settles within sessionPingTimeout of being sent.
			until = now.Add(sessionPingTimeout(h.f.opts.SessionCheck) + h.f.opts.SessionCheck)
			if deadline.Before(until) {
				until = deadline
			}
		}
		left := until.Sub(now)
		if left <= 0 {
			return errFenceUnconfirmed
		}
		if timer == nil {
			timer = time.NewTimer(left)
		} else {
			timer.Reset(left)
		}
		select {
		case <-*settled:
		case <-timer.C:
			return errFenceUnconfirmed
		}
	}
}

// errFenceLost and errFenceUnconfirmed are Check's answers, made once: the
// hot path allocates nothing.
var (
	errFenceLost = &tokens.Error{Kind: tokens.ErrFenceLost,
		Detail: "this replica's lock session for the resource was lost or not confirmed alive lately"}
	errFenceUnconfirmed = &tokens.Error{Kind: tokens.ErrFenceLost,
		Detail: "this replica's lock session for the resource was not confirmed alive before the write's deadline"}
)
