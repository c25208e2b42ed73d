// Package batch is group commit: many goroutines hand items to one loop,
// which commits whatever is queued in one go (one transaction, one fsync,
// one message) and hands each item its result.
//
// A storm of refused writes would otherwise cost a commit per refusal and
// take the store's writer (bbolt's single writer, PostgreSQL's pool) from
// grants and the current holder's writes. With one committing loop,
// batches grow with the load: while a commit runs, the next batch gathers.
// A lone item after a quiet spell is committed at once; Gap only spaces
// commits out under load.
//
// Stopping is the same for every user: Close commits what is queued, then
// refuses new items (ErrClosed), and returns when the loop has exited.
package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrClosed is returned for items handed in after Close began, and for an
// item queued so late that the loop never saw it.
var ErrClosed = errors.New("batch: closed")

// Options configure a Batcher.
type Options struct {
	// Max is the most items one commit takes (at least 1).
	Max int
	// Queue is the room for items waiting for a commit (0: 4*Max). Do waits
	// for room; Send gives up.
	Queue int
	// Gap is the least time between the starts of two commits (0: none).
	// Items that arrive meanwhile join the next batch.
	Gap time.Duration
}

// Commit commits items at once and fills results[i] for items[i]. An error
// is every item's result. It must not keep items or results: both are
// reused for the next batch.
type Commit[T, R any] func(items []T, results []R) error

// Batcher runs one committing loop; its methods are safe for concurrent use.
type Batcher[T, R any] struct {
	commit   Commit[T, R]
	opts     Options
	queue    chan entry[T, R]
	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
}

type entry[T, R any] struct {
	item T
	done chan result[R] // buffered; nil for Send: nobody waits
}

type result[R any] struct {
	r   R
	err error
}

// New starts a Batcher that commits with commit.
func New[T, R any](opts Options, commit Commit[T, R]) *Batcher[T, R] {
	if opts.Max < 1 {
		opts.Max = 1
	}
	if opts.Queue <= 0 {
		opts.Queue = 4 * opts.Max
	}
	b := &Batcher[T, R]{
		commit: commit,
		opts:   opts,
		queue:  make(chan entry[T, R], opts.Queue),
		stop:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	go b.run()
	return b
}

// Do queues item and waits for its commit's result. ctx bounds both waits;
// an item already queued when ctx ends is still committed, its result
// dropped.
func (b *Batcher[T, R]) Do(ctx context.Context, item T) (R, error) {
	var zero R
	select {
	case <-b.stop:
		return zero, ErrClosed
	default:
	}
	e := entry[T, R]{item: item, done: make(chan result[R], 1)}
	select {
	case b.queue <- e:
	case <-b.stop:
		return zero, ErrClosed
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case res := <-e.done:
		return res.r, res.err
	case <-b.exited:
		select {
		case res := <-e.done:
			return res.r, res.err
		default:
			return zero, ErrClosed // queued after the loop's last look
		}
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Send queues item without waiting for its commit (its result is
// dropped). It reports false, and drops item, if the queue is full or
// Close began.
func (b *Batcher[T, R]) Send(item T) bool {
	select {
	case <-b.stop:
		return false
	default:
	}
	select {
	case b.queue <- entry[T, R]{item: item}:
		return true
	default:
		return false
	}
}

// Close commits what is queued, refuses what comes after, and returns once
// the loop has exited. It is idempotent.
func (b *Batcher[T, R]) Close() {
	b.stopOnce.Do(func() { close(b.stop) })
	<-b.exited
}

func (b *Batcher[T, R]) run() {
	defer close(b.exited)
	batch := make([]entry[T, R], 0, b.opts.Max)
	items := make([]T, 0, b.opts.Max)
	results := make([]R, 0, b.opts.Max)
	var last time.Time
	for {
		select {
		case e := <-b.queue:
			batch = append(batch[:0], e)
		case <-b.stop:
			// Callers that queued before Close are answered; Do and
			// Send refuse from now on (stop is closed).
			for {
				batch = b.gather(batch[:0])
				if len(batch) == 0 {
					return
				}
				items, results = b.flush(batch, items, results)
			}
		}
		if wait := time.Until(last.Add(b.opts.Gap)); wait > 0 {
			time.Sleep(wait) // more gather meanwhile
		}
		last = time.Now()
		batch = b.gather(batch)
		items, results = b.flush(batch, items, results)
	}
}

// gather adds what is queued to batch, up to Max.
func (b *Batcher[T, R]) gather(batch []entry[T, R]) []entry[T, R] {
	for len(batch) < b.opts.Max {
		select {
		case e := <-b.queue:
			batch = append(batch, e)
		default:
			return batch
		}
	}
	return batch
}

// flush commits batch and answers its waiters; items and results are the
// reused buffers.
func (b *Batcher[T, R]) flush(batch []entry[T, R], items []T, results []R) ([]T, []R) {
	items, results = items[:0], results[:0]
	var zero R
	for _, e := range batch {
		items = append(items, e.item)
		results = append(results, zero)
	}
	err := b.commit(items, results)
	for i, e := range batch {
		if e.done != nil {
			e.done <- result[R]{r: results[i], err: err}
		}
	}
	clear(items) // let the committed items go
	clear(results)
	clear(batch)
	return items, results
}
