package tokens

// The queue of one process's acquires waiting for a held resource.

import "sync"

// waiters queues the acquires of one process that wait for a held resource,
// in arrival order, as etcd and ZooKeeper queue lock waiters: only the head
// of each resource's queue tries the store; the others wait for their turn.
// The head sleeps until the holder's lease expires or a release wakes it
// (Service.Wake), so a thousand waiters cost the store one attempt per
// resource per change, not one per waiter every few milliseconds.
type waiters struct {
	mu     sync.Mutex
	queues map[string][]*waiter
}

type waiter struct {
	// turn is closed when the waiter reaches the head of its queue.
	turn chan struct{}
	// wake receives (without blocking the sender) when the resource may have
	// become free.
	wake chan struct{}
}

func newWaiters() *waiters { return &waiters{queues: make(map[string][]*waiter)} }

// join queues a waiter for resource; its turn is closed at once if the
// queue was empty.
func (ws *waiters) join(resource string) *waiter {
	w := &waiter{turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	ws.mu.Lock()
	q := append(ws.queues[resource], w)
	ws.queues[resource] = q
	if len(q) == 1 {
		close(w.turn)
	}
	ws.mu.Unlock()
	return w
}

// leave takes w out of resource's queue (granted, or given up) and gives
// the next waiter its turn.
func (ws *waiters) leave(resource string, w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	q := ws.queues[resource]
	for i, x := range q {
		if x != w {
			continue
		}
		q = append(q[:i], q[i+1:]...)
		if i == 0 && len(q) > 0 {
			close(q[0].turn)
		}
		break
	}
	if len(q) == 0 {
		delete(ws.queues, resource)
	} else {
		ws.queues[resource] = q
	}
}

// wake tells the head of resource's queue that the resource may be free.
func (ws *waiters) wake(resource string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if q := ws.queues[resource]; len(q) > 0 {
		select {
		case q[0].wake <- struct{}{}:
		default:
		}
	}
}
