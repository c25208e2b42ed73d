package bolt

import (
	"errors"
	"fmt"
	"sync"

	bbolt "go.etcd.io/bbolt"
)

// groupCommit runs the store's mutations in shared read-write transactions,
// in place of bbolt's DB.Batch.
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
// returns an error or panics, the transaction is rolled back, that call is
// run again alone in a transaction of its own (its caller gets that result)
// and the others are retried together: a call's fn may run more than once.
// A panic is its caller's error, in the solo run too (where DB.Batch lets it
// through): the caller returns through its own unlocks.
//
// There is no goroutine of its own, so none outlives the Store: the caller
// that finds no commit running commits, and then hands the next batch to
// the first of its callers.
//
// Why not internal/batch, the group commit of the rejection logs and the
// live feed: its Commit fails every item of a batch with one error, and a
// mutation here must fail alone (a corrupt record one grant read is not its
// neighbours' failure), which takes the solo re-run above; and its loop
// goroutine would add a hand-off to every grant, renewal and release and a
// Close to every way out of the Store.
type groupCommit struct {
	db  *bbolt.DB
	max int // most calls in one transaction

	mu      sync.Mutex
	pending []*call
	busy    bool // a caller commits, or has been told to; false only with nothing pending
}

// maxBatch is bbolt's default MaxBatchSize. It bounds a transaction's dirty
// pages and the wait of the batch's first caller.
const maxBatch = 1000

type call struct {
	fn   func(*bbolt.Tx) error
	done chan error // buffered: never more than one message unread
}

// Messages to a call in place of its result.
var (
	errLead = errors.New("commit the next batch")
	errSolo = errors.New("run alone")
)

func newGroupCommit(db *bbolt.DB) *groupCommit {
	return &groupCommit{db: db, max: maxBatch}
}

// do runs fn in a read-write transaction, shared with the calls pending
// alongside, and returns once that transaction is committed.
func (g *groupCommit) do(fn func(*bbolt.Tx) error) error {
	c := &call{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, c)
	lead := !g.busy
	g.busy = true
	g.mu.Unlock()

	var err error
	if !lead {
		err = <-c.done
	}
	if lead || err == errLead {
		g.commitNext()
		err = <-c.done
	}
	if err == errSolo {
		err = safely(func() error { return g.db.Update(fn) })
	}
	return err
}

// commitNext commits the oldest pending calls (the caller's is the first of
// them), then makes the next pending call the committer, if there is one.
func (g *groupCommit) commitNext() {
	g.mu.Lock()
	n := min(len(g.pending), g.max)
	batch := g.pending[:n:n]
	g.pending = append([]*call(nil), g.pending[n:]...)
	g.mu.Unlock()

	g.commit(batch)

	g.mu.Lock()
	if len(g.pending) > 0 {
		g.pending[0].done <- errLead
	} else {
		g.busy = false
	}
	g.mu.Unlock()
}

// commit runs calls in one transaction and answers each, as DB.Batch's
// batch.run does.
func (g *groupCommit) commit(calls []*call) {
	for len(calls) > 0 {
		failed := -1
		// A panic in bbolt's commit would otherwise leave the batch's
		// callers, and every later one, waiting on a committer gone.
		err := safely(func() error {
			return g.db.Update(func(tx *bbolt.Tx) error {
				for i, c := range calls {
					if err := safely(func() error { return c.fn(tx) }); err != nil {
						failed = i
						return err
					}
				}
				return nil
			})
		})
		if failed < 0 {
			for _, c := range calls {
				c.done <- err
			}
			return
		}
		calls[failed].done <- errSolo
		calls = append(calls[:failed], calls[failed+1:]...)
	}
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
