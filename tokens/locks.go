package tokens

// LocalLocker, the in-process Locker of the embedded mode.

import (
	"context"
	"sync"
	"sync/atomic"
)

// LocalLocker is a Locker for one process: a writer-preferring
// shared/exclusive lock per resource whose waits honour the context. Entries
// exist only while someone holds or waits for them, so memory follows the
// number of busy resources, not of resources ever seen. An uncontended
// shared lock costs one map lookup and one small allocation (none for
// Service.Admit, which keeps it in its Permit).
type LocalLocker struct {
	mu      sync.Mutex
	entries map[string]*lockEntry
	free    []*lockEntry // recycled entries, so idle resources cost no garbage
}

type lockEntry struct {
	resource       string
	readers        int
	writer         bool
	writersWaiting int
	refs           int
	// changed is closed on the next release; made only when someone waits.
	changed chan struct{}
}

// NewLocalLocker returns an empty LocalLocker.
func NewLocalLocker() *LocalLocker {
	return &LocalLocker{entries: make(map[string]*lockEntry)}
}

var _ Locker = (*LocalLocker)(nil)

// entry returns the resource's entry with a reference taken; l.mu held.
func (l *LocalLocker) entry(resource string) *lockEntry {
	e := l.entries[resource]
	if e == nil {
		if n := len(l.free); n > 0 {
			e, l.free = l.free[n-1], l.free[:n-1]
		} else {
			e = &lockEntry{}
		}
		e.resource = resource
		l.entries[resource] = e
	}
	e.refs++
	return e
}

// put drops a reference; l.mu held.
func (l *LocalLocker) put(e *lockEntry) {
	e.refs--
	if e.refs == 0 {
		delete(l.entries, e.resource)
		if len(l.free) < 1024 {
			*e = lockEntry{}
			l.free = append(l.free, e)
		}
	}
}

// waitChan returns the channel closed at the next release; l.mu held.
func (e *lockEntry) waitChan() chan struct{} {
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	return e.changed
}

// broadcast wakes every waiter; l.mu held.
func (e *lockEntry) broadcast() {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// wait releases l.mu until the entry changes or ctx ends, and retakes it.
func (l *LocalLocker) wait(ctx context.Context, e *lockEntry) error {
	ch := e.waitChan()
	l.mu.Unlock()
	select {
	case <-ch:
		l.mu.Lock()
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		return ctx.Err()
	}
}

// hold is one acquired lock; its unlock method is safe to call more than once.
type hold struct {
	l         *LocalLocker
	e         *lockEntry
	exclusive bool
	done      atomic.Bool
}

func (h *hold) unlock() {
	if h.done.Swap(true) {
		return
	}
	l, e := h.l, h.e
	l.mu.Lock()
	if h.exclusive {
		e.writer = false
		e.broadcast()
	} else {
		e.readers--
		if e.readers == 0 {
			e.broadcast()
		}
	}
	l.put(e)
	l.mu.Unlock()
}

// HeldShared reports how many shared locks are held. In the embedded mode
// each is a fenced write admitted and not yet done, or one whose unknown
// outcome keeps its lock until its drain is recorded (drain.go): the
// embedded store reads it when it closes (storage/bolt Options.InFlight).
func (l *LocalLocker) HeldShared() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.entries {
		n += e.readers
	}
	return n
}

// Shared takes the resource's shared lock. It waits behind a waiting
// exclusive holder (writer preference).
func (l *LocalLocker) Shared(ctx context.Context, resource string) (func(), error) {
	h := new(hold)
	if err := l.shared(ctx, resource, h); err != nil {
		return nil, err
	}
	return h.unlock, nil
}

// shared is Shared into h, storage of the caller's that is unused until
// then: Admit keeps the hold in its Permit and calls h.unlock itself, so
// an admitted write's lock costs no allocation of its own.
func (l *LocalLocker) shared(ctx context.Context, resource string, h *hold) error {
	l.mu.Lock()
	e := l.entry(resource)
	for e.writer || e.writersWaiting > 0 {
		if err := l.wait(ctx, e); err != nil {
			l.put(e)
			l.mu.Unlock()
			return err
		}
	}
	e.readers++
	l.mu.Unlock()
	h.l, h.e = l, e
	return nil
}

// Exclusive takes the resource's exclusive lock, waiting for every shared
// holder to unlock.
func (l *LocalLocker) Exclusive(ctx context.Context, resource string) (func(), error) {
	l.mu.Lock()
	e := l.entry(resource)
	e.writersWaiting++
	for e.writer || e.readers > 0 {
		if err := l.wait(ctx, e); err != nil {
			e.writersWaiting--
			e.broadcast() // readers queued behind us may go now
			l.put(e)
			l.mu.Unlock()
			return nil, err
		}
	}
	e.writersWaiting--
	e.writer = true
	l.mu.Unlock()
	h := &hold{l: l, e: e, exclusive: true}
	return h.unlock, nil
}
