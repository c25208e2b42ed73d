package tokens

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Records a fenced write's answer does not wait for: the rejection log's
// entry of a refused write, once it has taken longer than rejectionWait,
// and the end of a keyed write's first attempt (Claim.Unknown, Claim.Drop,
// a Claim.Complete the store did not take). Each is made in the background,
// bounded, and a clean shutdown waits for them (Service.WaitRecords,
// Idempotency.Wait) before it closes the store.
//
// Nothing the fence or the key rules rely on is given up by answering
// first: a refusal is a refusal whether or not its entry is in the log yet
// (the live feed is told of it at once, OnRejection), and a key whose end
// is not recorded yet is still in progress in the store, so that a retry
// with it is refused (409 idempotency_key_in_progress, then, past the
// record's deadline, idempotency_outcome_unknown), never forwarded.

// rejectionWait bounds how long a refusal's answer waits for its entry in
// the rejection log. A healthy store takes one in milliseconds (PostgreSQL
// one insert; the embedded store one share of a group commit, which waits
// at most rejectionGap for company and logs a commit over a second as
// slow), so the answer carries its evidence then; a store that is stalled
// or down does not hold the refusal up for longer than this. The entry is
// still being made when the answer goes (rejectionRecordFor).
const rejectionWait = time.Second

// rejectionRecordFor bounds the whole attempt to record a rejection, from
// the refusal: a statement waiting on a lock, or a group commit on a
// stalled disk, is given up then and the failure logged. (The embedded
// store commits an entry queued before its caller gave up all the same.)
const rejectionRecordFor = 5 * time.Second

// maxLateRejections bounds the rejection records kept in the background at
// once: a storm of refused writes on a stalled store would otherwise pile
// up a goroutine per refusal. Past it a refusal waits rejectionWait for its
// record, which is then given up and logged.
const maxLateRejections = 1024

// keyRetry is the pause between two attempts to record the end of a keyed
// write, and keyAttempt bounds one attempt (as drainRetry and drainAttempt
// do for a drain).
const (
	keyRetry   = 250 * time.Millisecond
	keyAttempt = 5 * time.Second
)

// late counts records being made in the background.
type late struct {
	wg sync.WaitGroup
	n  atomic.Int64
}

func (l *late) start() {
	l.n.Add(1)
	l.wg.Add(1)
}

func (l *late) end() {
	l.n.Add(-1)
	l.wg.Done()
}

// wait waits for every record in the background, or until ctx ends.
func (l *late) wait(ctx context.Context) error { return waitGroup(ctx, &l.wg) }

// Recording reports how many rejections are still being recorded in the
// background, their refusals answered (metrics, shutdown logs).
func (s *Service) Recording() int { return int(s.late.n.Load()) }

// WaitRecords waits until every rejection being recorded in the background
// is in the log or was given up (each within rejectionRecordFor of its
// refusal), or until ctx ends. A clean shutdown calls it after the
// in-flight writes have finished and before it closes the store.
func (s *Service) WaitRecords(ctx context.Context) error { return s.late.wait(ctx) }

// recordRejection writes rej to the rejection log and returns the entry as
// recorded, waiting for it at most rejectionWait; ok false if it was not
// recorded by then (it may still be: the attempt goes on in the background
// until rejectionRecordFor, and logs its failure).
func (s *Service) recordRejection(ctx context.Context, rej Rejection) (Rejection, bool) {
	ctx = context.WithoutCancel(ctx) // the client hanging up must not erase the evidence
	if s.late.n.Load() >= maxLateRejections {
		rctx, cancel := context.WithTimeout(ctx, rejectionWait)
		defer cancel()
		recorded, err := s.store.RecordRejection(rctx, rej)
		if err != nil {
			s.log.Error("could not record rejection", "resource", rej.Resource, "code", rej.Code, "err", err)
			return rej, false
		}
		return recorded, true
	}
	type result struct {
		rej Rejection
		err error
	}
	out := make(chan result, 1)
	s.late.start()
	go func() {
		defer s.late.end()
		rctx, cancel := context.WithTimeout(ctx, rejectionRecordFor)
		recorded, err := s.store.RecordRejection(rctx, rej)
		cancel()
		if err != nil {
			s.log.Error("could not record rejection", "resource", rej.Resource, "code", rej.Code, "err", err)
		}
		out <- result{recorded, err}
	}()
	t := time.NewTimer(rejectionWait)
	defer t.Stop()
	select {
	case r := <-out:
		return r.rej, r.err == nil
	case <-t.C:
		return rej, false
	}
}

// later runs record (one attempt to write the end of a keyed write, bounded
// by its ctx) in the background until it succeeds or x.inFlight has passed:
// by then the record has turned unknown at its deadline if nothing else
// landed, so that a retry is still never forwarded.
func (x *Idempotency) later(what string, scope KeyScope, record func(ctx context.Context) error) {
	until := time.Now().Add(x.inFlight)
	x.late.start()
	go func() {
		defer x.late.end()
		failed := false
		for {
			ctx, cancel := context.WithTimeout(context.Background(), max(min(time.Until(until), keyAttempt), keyRetry))
			err := record(ctx)
			cancel()
			if err == nil {
				if failed {
					x.log.Warn("idempotency record written late", "what", what, "resource", scope.Resource, "upstream", scope.Upstream)
				}
				return
			}
			if !failed {
				failed = true
				x.log.Error("could not record the end of an idempotent write yet; its key stays in progress (a retry is refused) until it is recorded",
					"what", what, "resource", scope.Resource, "upstream", scope.Upstream, "err", err)
			}
			if time.Until(until) <= 0 {
				x.log.Error("gave up recording the end of an idempotent write; its key turned unknown at its deadline, and a retry is refused",
					"what", what, "resource", scope.Resource, "upstream", scope.Upstream, "err", err)
				return
			}
			t := time.NewTimer(min(keyRetry, max(time.Until(until), 0)))
			<-t.C
		}
	}()
}

// Pending reports how many ends of keyed writes are still being recorded
// in the background (shutdown logs).
func (x *Idempotency) Pending() int { return int(x.late.n.Load()) }

// Wait waits until every end of a keyed write being recorded in the
// background is recorded or was given up (each within InFlight of its
// write's end), or until ctx ends. A clean shutdown calls it after the
// in-flight writes have finished and before it closes the store (which, in
// the PostgreSQL modes, turns its keys still in progress unknown).
func (x *Idempotency) Wait(ctx context.Context) error { return x.late.wait(ctx) }
