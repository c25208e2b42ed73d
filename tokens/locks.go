package tokens

import (
	"context"
	"sync"
)

// LocalLocker is a Locker for one process: a writer-preferring
// shared/exclusive lock per resource whose waits honour the context. Entries
// exist only while someone holds or waits for them, so memory follows the
// number of busy resources, not of resources ever seen.
type LocalLocker struct {
	mu      sync.Mutex
	entries map[string]*lockEntry
}

type lockEntry struct {
	readers        int
	writer         bool
	writersWaiting int
	refs           int
	changed        chan struct{} // closed and replaced on every release
}

// NewLocalLocker returns an empty LocalLocker.
func NewLocalLocker() *LocalLocker {
	return &LocalLocker{entries: make(map[string]*lockEntry)}
}

var _ Locker = (*LocalLocker)(nil)

func (l *LocalLocker) entry(resource string) *lockEntry {
	e := l.entries[resource]
	if e == nil {
		e = &lockEntry{changed: make(chan struct{})}
		l.entries[resource] = e
	}
	e.refs++
	return e
}

// put drops a reference; called with l.mu held.
func (l *LocalLocker) put(resource string, e *lockEntry) {
	e.refs--
	if e.refs == 0 {
		delete(l.entries, resource)
	}
}

func (e *lockEntry) broadcast() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// Shared takes the resource's shared lock. It waits behind a waiting
// exclusive holder (writer preference).
func (l *LocalLocker) Shared(ctx context.Context, resource string) (func(), error) {
	l.mu.Lock()
	e := l.entry(resource)
	for e.writer || e.writersWaiting > 0 {
		ch := e.changed
		l.mu.Unlock()
		select {
		case <-ch:
			l.mu.Lock()
		case <-ctx.Done():
			l.mu.Lock()
			l.put(resource, e)
			l.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	e.readers++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			e.readers--
			if e.readers == 0 {
				e.broadcast()
			}
			l.put(resource, e)
			l.mu.Unlock()
		})
	}, nil
}

// Exclusive takes the resource's exclusive lock, waiting for every shared
// holder to unlock.
func (l *LocalLocker) Exclusive(ctx context.Context, resource string) (func(), error) {
	l.mu.Lock()
	e := l.entry(resource)
	e.writersWaiting++
	for e.writer || e.readers > 0 {
		ch := e.changed
		l.mu.Unlock()
		select {
		case <-ch:
			l.mu.Lock()
		case <-ctx.Done():
			l.mu.Lock()
			e.writersWaiting--
			e.broadcast() // readers queued behind us may go now
			l.put(resource, e)
			l.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	e.writersWaiting--
	e.writer = true
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			e.writer = false
			e.broadcast()
			l.put(resource, e)
			l.mu.Unlock()
		})
	}, nil
}
