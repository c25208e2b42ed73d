package framing

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// ErrClientGone is the cause (context.Cause) of a context WatchClient
// returned once the request's client has closed or reset its connection.
var ErrClientGone = errors.New("the client closed its connection")

// ownConnKey finds, in a request's context, the loop's connection that
// serves it.
type ownConnKey struct{}

// WatchClient returns a context derived from ctx that is cancelled, with
// cause ErrClientGone, when the client of the request ctx belongs to
// closes or resets its connection, and a stop that ends the watch (call it
// before the answer is written, and always).
//
// Go's server tells every request of a client gone (its background read
// cancels the request's context); the loop does not, because a fenced write
// runs to its end without it (docs/design.md) and a read per request costs.
// A request the loop serves that may wait long after its body was read (an
// acquire with wait_ms) asks for the watch: one goroutine that peeks at the
// connection, as Go's server's background read does. For a request Go's
// server serves, one whose body is not read to its end (its bytes are not
// the watch's to read), and one already watched (one reader at a time), it
// is ctx and a stop that does nothing. Call it from the request's handler.
func WatchClient(ctx context.Context) (context.Context, func()) {
	return WatchClientAfter(ctx, 0)
}

// WatchClientAfter is WatchClient from d on: a request that is usually
// over sooner (an acquire that need not wait for the resource, which waits
// only when a write of the previous token is in flight or a drain is about
// to end) pays for a timer, and for the watch's goroutine and deadline
// changes only once it has run for d. A client that goes before d is
// heard at d. Call it, and its stop, as WatchClient's.
func WatchClientAfter(ctx context.Context, d time.Duration) (context.Context, func()) {
	c, ok := ctx.Value(ownConnKey{}).(*ownConn)
	if !ok || c.watching || c.resp.body != nil && !c.resp.body.readToEnd() {
		return ctx, func() {}
	}
	c.watching = true // by the handler, who alone clears it (stop)
	ctx, cancel := context.WithCancelCause(ctx)
	var mu sync.Mutex // orders the timer's start of the watch and stop
	var stopped bool
	var stopPeek func() // the watch's, once it started
	var timer *time.Timer
	if d <= 0 {
		stopPeek = c.peekForClose(cancel)
	} else {
		timer = time.AfterFunc(d, func() {
			mu.Lock()
			defer mu.Unlock()
			if !stopped {
				stopPeek = c.peekForClose(cancel)
			}
		})
	}
	return ctx, func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		stopped = true
		if timer != nil {
			timer.Stop()
		}
		peeking := stopPeek // the timer's, if it ran: it can no longer
		mu.Unlock()
		if peeking != nil {
			peeking()
		}
		cancel(nil)
		c.watching = false
	}
}

// ClientGone reports, without waiting, whether the client of the request
// ctx belongs to has closed, half-closed or reset its connection:
// ErrClientGone if it has, nil otherwise. The watch (WatchClient) hears a
// close in a goroutine of its own, which may run only after the request's
// next step: a process resumed after a pause (SIGSTOP, a stalled VM) sees
// the client's close and, say, the resource it waited for freed at once. A
// step that must not be taken for a client that left (a grant's commit)
// asks here first. One non-blocking peek at the socket. nil for a request
// the loop does not serve (Go's server cancels its context itself), for
// one whose body is not read to its end (the bytes there are its own), and
// under TLS for a client that sent close_notify (its bytes are unread). A
// client that sent its next request and then closed its side is taken for
// gone, as a half-closed client is. Call it from the request's handler.
func ClientGone(ctx context.Context) error {
	c, ok := ctx.Value(ownConnKey{}).(*ownConn)
	if !ok || c.resp.body != nil && !c.resp.body.readToEnd() {
		return nil
	}
	if peerGone(c.fc.tcp) {
		return ErrClientGone
	}
	return nil
}

// peekForClose starts the goroutine that waits for the client's next
// byte or its close, and cancels with ErrClientGone on the close; its stop
// ends the wait and returns once the goroutine has.
func (c *ownConn) peekForClose(cancel context.CancelCauseFunc) (stop func()) {
	// The request's read deadline (its body's, or the server's read
	// timeout) is over with its body: the watch waits as long as the
	// request does. The loop sets the next request's deadline itself.
	_ = c.fc.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	br := c.br
	go func() {
		defer close(done)
		// Peek consumes nothing: bytes of a pipelined request stay for
		// the loop, and end the watch (the client is still there).
		_, err := br.Peek(1)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			cancel(ErrClientGone)
		}
	}()
	return func() {
		_ = c.fc.SetReadDeadline(time.Unix(1, 0))
		<-done
		_ = c.fc.SetReadDeadline(time.Time{})
	}
}
