package bolt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
)

// groupCommit is the store's one group commit: every change to the file
// after Open (grants, renewals, releases, drains, write counts, the
// rejection log and the idempotency records) runs through it, in shared
// read-write transactions, in place of bbolt's DB.Batch.
//
// DB.Batch waits MaxBatchDelay for company and then queues its batch behind
// the commit in flight. When a commit (a pwrite and two fdatasyncs) takes
// longer than that delay, as it does on a VM's disk, the batches turn into a
// queue of small commits of whatever arrived within the delay. Here nothing
// waits for a timer: with no commit running, a call commits at once, with
// whatever is pending; the calls that arrive during a commit all join the
// next, which starts as soon as that one ends. A batch grows with the time
// a commit takes. With 64 acquirers on 2 cores (fencegw-load -grants, 8 s),
// DB.Batch with a 1 ms delay made ~8 mutations a commit, 3,500–3,700
// grants/s at 230–250 µs of gateway CPU a grant; this makes ~25 a commit,
// 5,300–5,600 grants/s at 165–175 µs.
//
// As with DB.Batch, the calls of a batch run in one db.Update. If one
// returns an error or panics, the transaction is rolled back, the others
// are retried together, and the failing call is then run again alone in a
// transaction of its own (its caller gets that result): a call's fn may
// run more than once, and one call's failure is never its neighbours'.
// A panic is its caller's error.
//
// Commits run on a goroutine of their own, started by the first call that
// finds none running and ended when nothing is pending, so a caller waits
// for its result only as long as its context allows (Store.update): a
// disk whose fsync stalls holds the committer, not the callers, who answer
// store_unavailable at their deadline. A call whose caller gave up before
// its fn ran is dropped if it was submitted with call.gone set (a grant
// nobody will hear of); any other runs all the same.
//
// Lazy calls (the rejection log) do not start a commit of their own until
// gap has passed since the last one began: a storm of refused writes would
// otherwise commit and fsync back to back, taking the writer and a quarter
// of the gateway's CPU per refusal. They ride along in any commit that an
// eager call starts meanwhile.
type groupCommit struct {
	db  *bbolt.DB
	max int           // most calls in one transaction
	gap time.Duration // least time from one commit's start to a lazy-only one's

	// observe, if set, is told each commit's duration (metrics, the slow
	// commit log); it runs on the committer.
	observe func(d time.Duration, calls int, err error)

	mu      sync.Mutex
	pending []*call
	busy    bool          // a committer runs; false only with nothing pending
	waiting bool          // the committer waits out gap for lazy calls
	last    time.Time     // the last commit's start
	wake    chan struct{} // an eager call arrived while the committer waits

	running atomic.Int64 // start of the commit in flight (unix ns); 0: none
}

// maxBatch is bbolt's default MaxBatchSize. It bounds a transaction's dirty
// pages and the wait of the batch's last caller.
const maxBatch = 1000

type call struct {
	fn func(*bbolt.Tx) error
	// gone, if set, drops the call without running fn once it is done.
	gone context.Context
	lazy bool
	done chan error // buffered: one result
}

func newGroupCommit(db *bbolt.DB) *groupCommit {
	return &groupCommit{db: db, max: maxBatch, wake: make(chan struct{}, 1)}
}

// submit queues c and starts the committer if none runs.
func (g *groupCommit) submit(c *call) {
	c.done = make(chan error, 1)
	g.mu.Lock()
	g.pending = append(g.pending, c)
	start := !g.busy
	g.busy = true
	nudge := g.waiting && !c.lazy
	g.mu.Unlock()
	if start {
		go g.run()
	}
	if nudge {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

// do runs fn in a read-write transaction, shared with the calls pending
// alongside, and returns once that transaction is committed or ctx ends;
// the commit goes on without a caller that gave up.
func (g *groupCommit) do(ctx context.Context, fn func(*bbolt.Tx) error) error {
	c := &call{fn: fn}
	g.submit(c)
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runningFor is how long the commit in flight has been running (0: none).
func (g *groupCommit) runningFor() time.Duration {
	if start := g.running.Load(); start != 0 {
		return time.Since(time.Unix(0, start))
	}
	return 0
}

// run commits pending calls in batches until none is left.
func (g *groupCommit) run() {
	for {
		g.mu.Lock()
		if wait := time.Until(g.last.Add(g.gap)); wait > 0 && allLazy(g.pending) {
			select { // a nudge left over from an earlier wait
			case <-g.wake:
			default:
			}
			g.waiting = true // submit nudges from now on (it reads this under mu)
			g.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-g.wake:
			}
			t.Stop()
			g.mu.Lock()
			g.waiting = false
		}
		n := min(len(g.pending), g.max)
		batch := g.pending[:n:n]
		g.pending = append([]*call(nil), g.pending[n:]...)
		g.last = time.Now()
		g.mu.Unlock()

		results := g.commit(batch)

		// Idle before the answers go out: a caller that has its answer
		// finds the group as it left it, and a call made meanwhile starts
		// a committer of its own.
		g.mu.Lock()
		idle := len(g.pending) == 0
		if idle {
			g.busy = false
		}
		g.mu.Unlock()
		for i, c := range batch {
			c.done <- results[i]
		}
		if idle {
			return
		}
	}
}

func allLazy(calls []*call) bool {
	for _, c := range calls {
		if !c.lazy {
			return false
		}
	}
	return true
}

// commit runs calls in one transaction and returns each one's result, as
// DB.Batch's batch.run does, the failing ones re-run alone afterwards.
func (g *groupCommit) commit(calls []*call) []error {
	results := make([]error, len(calls))
	left := make([]int, 0, len(calls)) // indexes into calls still to commit
	for i, c := range calls {
		if c.gone != nil && c.gone.Err() != nil {
			results[i] = c.gone.Err()
			continue
		}
		left = append(left, i)
	}
	var solo []int
	for len(left) > 0 {
		failed := -1
		err := g.update(len(left), func(tx *bbolt.Tx) error {
			for j, i := range left {
				if err := safely(func() error { return calls[i].fn(tx) }); err != nil {
					failed = j
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, i := range left {
				results[i] = err
			}
			break
		}
		solo = append(solo, left[failed])
		left = append(left[:failed], left[failed+1:]...)
	}
	for _, i := range solo {
		results[i] = g.update(1, calls[i].fn)
	}
	return results
}

// update is db.Update with a panic as its error (a panic in bbolt's commit
// would otherwise leave every caller waiting on a committer gone), timed.
func (g *groupCommit) update(calls int, fn func(*bbolt.Tx) error) error {
	start := time.Now()
	g.running.Store(start.UnixNano())
	err := safely(func() error { return g.db.Update(fn) })
	g.running.Store(0)
	if g.observe != nil {
		g.observe(time.Since(start), calls, err)
	}
	return err
}

// safely returns a panic in f as an error.
func safely(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(error); ok {
				err = fmt.Errorf("panic: %w", e)
			} else {
				err = fmt.Errorf("panic: %v", p)
			}
		}
	}()
	return f()
}

// errGaveUp is the cause of a store call that stopped waiting for its
// commit: its caller's deadline passed, or it went away.
var errGaveUp = errors.New("gave up waiting for the commit")
