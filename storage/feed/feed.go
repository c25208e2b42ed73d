// Package feed is the live feed of rejections: how each rejection a
// replica records reaches the dashboard's live stream (gateway.Publish) on
// every replica. In one process it is a function call (Local); between
// replicas it crosses a Transport (PostgreSQL NOTIFY, Redis pub/sub) in the
// compact wire format of wire.go (Replicated).
//
// The feed is best effort: the rejection log (tokens.Store.Rejections) is
// the record, and a stream client that missed something replays it from
// the log (Last-Event-ID). So publishing never waits for the transport,
// and what a transport loses while it reconnects stays lost to the feed.
// storage/storagetest.RunFeed checks what every Feed does promise.
package feed

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/tokens"
)

// Feed carries recorded rejections to the live stream of every replica.
type Feed interface {
	// Publish announces a recorded rejection. It never blocks: past what
	// the feed can queue, rejections are left out of it (and counted).
	Publish(r tokens.Rejection)
	// Subscribe has deliver called, until ctx ends or Close, with every
	// rejection published on any replica (this one's included, once): from
	// each replica in the order it published them. It returns once the
	// subscription is in effect, so what is published after it returns
	// arrives; or with ctx's error. deliver must not block. One subscriber
	// per Feed.
	Subscribe(ctx context.Context, deliver func(tokens.Rejection)) error
	// Close delivers or sends what is queued, then stops. Publish after
	// Close does nothing.
	Close()
}

// Local is the feed of one process (the embedded mode): Publish hands each
// rejection straight to the subscriber.
type Local struct {
	deliver atomic.Pointer[func(tokens.Rejection)]
	closed  atomic.Bool
}

var _ Feed = (*Local)(nil)

// NewLocal returns a Local feed with no subscriber yet.
func NewLocal() *Local { return &Local{} }

// Publish calls the subscriber's deliver, on the caller's goroutine (a
// rejection published before anyone subscribed goes nowhere).
func (l *Local) Publish(r tokens.Rejection) {
	if d := l.deliver.Load(); d != nil && !l.closed.Load() {
		(*d)(r)
	}
}

// Subscribe sets deliver, until ctx ends.
func (l *Local) Subscribe(ctx context.Context, deliver func(tokens.Rejection)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &deliver
	l.deliver.Store(p)
	context.AfterFunc(ctx, func() { l.deliver.CompareAndSwap(p, nil) })
	return nil
}

// Close stops delivering.
func (l *Local) Close() { l.closed.Store(true) }

// Transport carries rejections between replicas (storage/postgres: NOTIFY;
// storage/redis: pub/sub). Both are best effort.
type Transport interface {
	// PublishRejections sends rs, in order, to every replica's
	// ListenRejections (this one's included).
	PublishRejections(ctx context.Context, rs []tokens.Rejection) error
	// ListenRejections calls fn for every rejection published on any
	// replica while it is subscribed, and ready (if set) each time the
	// subscription is (again) in effect. It reconnects until ctx is done
	// and then returns ctx.Err(). fn must not block.
	ListenRejections(ctx context.Context, fn func(tokens.Rejection), ready func()) error
}

// Options configure a Replicated feed.
type Options struct {
	// Queue bounds the rejections waiting to be sent (0: DefaultQueue).
	Queue int
	// Batch is the most rejections one send takes (0: DefaultBatch).
	Batch int
	// SendTimeout bounds one send (0: 2 s).
	SendTimeout time.Duration
	// ReadyWait bounds how long Subscribe waits for the subscription to be
	// in effect before it returns anyway, the subscription still trying in
	// the background (0: 10 s): a transport that is down at start must not
	// keep the gateway from serving.
	ReadyWait time.Duration
	Logger    *slog.Logger
}

// Defaults for Options left zero.
const (
	// DefaultQueue: past this many rejections waiting, rejections are left
	// out of the live feed rather than slow down the refusals.
	DefaultQueue = 10_000
	DefaultBatch = 1000
)

// Replicated is the feed between replicas: this replica's rejections are
// sent over a Transport in batches (internal/batch): one loop sends
// whatever is queued packed into as few messages as fit, so a storm of
// refusals costs the transport a message per batch instead of a round trip
// per refusal, and no refusal waits for the feed. Every replica, this one
// included, hears each rejection once through the transport; delivering
// locally too would show it twice.
type Replicated struct {
	transport Transport
	opts      Options
	log       *slog.Logger
	batch     *batch.Batcher[tokens.Rejection, struct{}]
	dropped   atomic.Int64

	// closing, once Close has begun, bounds all of its sends together: a
	// transport that is down must not hold a shutdown for a send timeout
	// per batch still queued.
	closing atomic.Pointer[context.Context]

	mu     sync.Mutex
	cancel context.CancelFunc // the subscription's
	done   chan struct{}      // closed when the subscription has ended
}

var _ Feed = (*Replicated)(nil)

// NewReplicated starts a feed over t.
func NewReplicated(t Transport, opts Options) *Replicated {
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
	}
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = 2 * time.Second
	}
	if opts.ReadyWait <= 0 {
		opts.ReadyWait = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Replicated{transport: t, opts: opts, log: opts.Logger}
	f.batch = batch.New(batch.Options{Max: opts.Batch, Queue: opts.Queue}, f.send)
	return f
}

func (f *Replicated) send(rs []tokens.Rejection, _ []struct{}) error {
	parent := context.Background()
	if c := f.closing.Load(); c != nil {
		parent = *c
		if parent.Err() != nil {
			f.log.Warn("live rejection feed: closed before these were sent (they are recorded)", "rejections", len(rs))
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(parent, f.opts.SendTimeout)
	defer cancel()
	if err := f.transport.PublishRejections(ctx, rs); err != nil {
		f.log.Warn("live rejection feed: publish failed (the rejections are recorded)", "rejections", len(rs), "err", err)
	}
	return nil
}

// Publish queues r for the next send.
func (f *Replicated) Publish(r tokens.Rejection) {
	if !f.batch.Send(r) {
		if n := f.dropped.Add(1); n%1000 == 1 {
			f.log.Warn("live rejection feed: queue full, rejections left out of the feed (they are recorded)", "dropped", n)
		}
	}
}

// Dropped is how many rejections Publish left out (queue full or closed).
func (f *Replicated) Dropped() int64 { return f.dropped.Load() }

var errSubscribed = errors.New("feed: one subscriber per feed, and it has one")

// Subscribe listens on the transport until ctx ends or Close.
func (f *Replicated) Subscribe(ctx context.Context, deliver func(tokens.Rejection)) error {
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	f.mu.Lock()
	if f.cancel != nil {
		f.mu.Unlock()
		cancel()
		return errSubscribed
	}
	f.cancel, f.done = cancel, done
	f.mu.Unlock()
	go func() {
		defer close(done)
		err := f.transport.ListenRejections(ctx, deliver, func() { once.Do(func() { close(ready) }) })
		if ctx.Err() == nil {
			f.log.Error("live rejection feed stopped", "err", err)
		}
	}()
	t := time.NewTimer(f.opts.ReadyWait)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		f.log.Warn("live rejection feed: not subscribed yet, serving meanwhile (rejections are recorded)", "waited", f.opts.ReadyWait)
		return nil
	}
}

// Close sends what is queued, within one SendTimeout for all of it, then
// ends the subscription and waits for it.
func (f *Replicated) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), f.opts.SendTimeout)
	defer cancel()
	f.closing.Store(&ctx)
	f.batch.Close()
	f.mu.Lock()
	cancel, done := f.cancel, f.done
	f.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
