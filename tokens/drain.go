package tokens

import (
	"context"
	"sync"
	"time"

	"github.com/fencegw/fencegw/internal/failpoint"
)

// The drain of a forward whose outcome is unknown (point 3 of the safety
// argument on Service), kept whatever the store does.
//
// The drain period runs from the moment the gateway stopped waiting (the
// forward's timeout, or the broken connection): until it has passed, the
// old write may still land, and no grant of its resource may return. Two
// things keep grants out: the drain recorded in the store (Store.Drain),
// which every replica's grant sees, and the write's own hold on the
// resource's fence, which a grant must wait for. The hold is kept until the
// recorded drain covers the rest of the period, or until the period has
// passed, whichever comes first; a store that cannot take the record (down,
// or a row another session holds) is asked again until it does. So the
// fence is never given up earlier than a recorded drain would have allowed,
// however long the store refuses.
//
// None of this is the client's wait: Permit.Done returns at once, and the
// bookkeeping goes on in the background, holding the fence.

// drainRetry bounds the pause between two attempts to record a drain: short
// against any drain period, so that the record follows a store that comes
// back within a fraction of a second, long enough not to hammer a store
// that is down.
const drainRetry = 250 * time.Millisecond

// drainAttempt bounds one attempt to record a drain: a statement that waits
// on a row lock is cut short, and retried, rather than waited for past it.
const drainAttempt = 5 * time.Second

// drains counts the drains this Service is keeping in the background.
type drains struct {
	wg sync.WaitGroup
	mu sync.Mutex
	n  int
}

func (d *drains) add(delta int) {
	d.mu.Lock()
	d.n += delta
	d.mu.Unlock()
}

// Draining reports how many drains of unknown outcomes are still kept in
// the background: fences held until their drain is recorded or has passed
// (metrics, shutdown logs).
func (s *Service) Draining() int {
	s.drains.mu.Lock()
	defer s.drains.mu.Unlock()
	return s.drains.n
}

// WaitDrains waits until every drain started by an unknown outcome has been
// recorded in the store or has passed, or until ctx ends (then it returns
// ctx's error, with the fences of the drains left still held). A clean
// shutdown calls it after the in-flight writes have finished and before it
// closes the store and the fence: a drain the store never took is over at
// the latest one drain period after its write timed out, so a context that
// outlasts the drain period never gives a fence up early. In the PostgreSQL
// modes a fence still held when the process exits leaves its presence row,
// which makes the next grant drain anyway (storage/postgres/fence.go); in
// the embedded mode nothing else would.
func (s *Service) WaitDrains(ctx context.Context) error {
	return waitGroup(ctx, &s.drains.wg)
}

// waitGroup waits for wg, or until ctx ends (its error; wg's waiter goes
// on until wg is done).
func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain keeps resource closed to grants for the drain period from now, and
// calls release (the write's hold on the fence) once the store has recorded
// it, or once it has passed. It returns at once.
func (s *Service) drain(resource string, release func()) {
	until := time.Now().Add(s.drainPeriod) // monotonic: immune to wall-clock steps
	s.drains.add(1)
	s.drains.wg.Add(1)
	go func() {
		defer s.drains.wg.Done()
		defer s.drains.add(-1)
		defer release()
		failed := false
		for {
			left := time.Until(until)
			if left <= 0 {
				s.log.Warn("drain period passed before the store could record it; the resource's fence was held for it",
					"resource", resource, "drain", s.drainPeriod)
				return
			}
			// What is left of the period, rounded up to the millisecond the
			// stores keep: the record ends no earlier than until, since
			// the store reads its clock after this was computed.
			d := (left + time.Millisecond - 1).Truncate(time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), min(left, drainAttempt))
			err := s.store.Drain(ctx, resource, d)
			cancel()
			if err == nil {
				if failed {
					s.log.Warn("drain period recorded late; the resource's fence was held until then",
						"resource", resource, "drain_left", d)
				}
				return
			}
			if failpoint.DropFailedDrain {
				s.log.Error("could not start drain period", "resource", resource, "err", err)
				return
			}
			if !failed {
				failed = true
				s.log.Error("could not record the drain period of a write whose outcome is unknown; holding the resource's fence until it is recorded or has passed",
					"resource", resource, "drain", s.drainPeriod, "err", err)
			}
			t := time.NewTimer(min(drainRetry, time.Until(until)))
			<-t.C
		}
	}()
}
