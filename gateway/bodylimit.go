package gateway

// Body limits: how long a request body may take to arrive. (Its size limit
// is http.MaxBytesReader's, set where the body is taken: serveProxy,
// controlBody.)

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// limitBody bounds how long reading r's body may take (slow clients hold a
// goroutine, and a fenced write's also holds its resource's shared lock):
// past d the connection's read fails, the body's Read returns a
// problems.ErrRequestTimeout error (408 request_timeout) and the request ends. The
// deadline is lifted once the body is read, so that a slow upstream is
// bounded by the forward timeout alone. The returned guard tells whether the
// body ran out of time (nil if no deadline was set); lift lifts the write
// deadline at the end of the request, for the next request on the
// connection. A body that was not read to its end keeps its read deadline:
// net/http reads the rest before answering, and a slow client must not stall
// that either (the connection is then closed, not reused).
//
// Requests framed by Transfer-Encoding are answered with Connection: close
// by the framing middleware (framing.go).
func limitBody(w http.ResponseWriter, r *http.Request, d time.Duration) (guard *bodyGuard, lift func()) {
	rc := http.NewResponseController(w)
	lift = func() { _ = rc.SetWriteDeadline(time.Time{}) }
	return limitBodyRead(rc, r, time.Now(), d, nil), lift
}

// limitBodyRead is limitBody for a caller that leaves the write deadline
// to net/http (it lifts it after the answer is flushed), with the caller's
// controller of w, and the time it read (the body has d from now): the
// guard and the body reader are into if it is not nil (the caller's
// storage, unused until then), else one allocation.
func limitBodyRead(rc *http.ResponseController, r *http.Request, now time.Time, d time.Duration, into *bodyGuard) *bodyGuard {
	if r.Body == nil || r.Body == http.NoBody || d <= 0 {
		return nil
	}
	deadline := now.Add(d)
	if rc.SetReadDeadline(deadline) != nil {
		return nil // not a net/http connection (a test recorder)
	}
	guard := into
	if guard == nil {
		guard = new(bodyGuard)
	}
	guard.deadline, guard.timeout = deadline, d
	guard.body = deadlineBody{ReadCloser: r.Body, rc: rc, guard: guard}
	r.Body = &guard.body
	return guard
}

// bodyGuard follows one request body's read deadline.
type bodyGuard struct {
	deadline time.Time
	timeout  time.Duration
	done     atomic.Bool // read to its end
	timedOut atomic.Bool // a read failed at the deadline
	halted   atomic.Bool // reads fail at once from now on (halt)
	// broken is the error of a read that failed by the client's fault (a
	// malformed chunked body, a connection closed mid-body), if any.
	broken atomic.Pointer[error]
	body   deadlineBody // the reader limitBody puts in place of the request's body
}

// halt makes a read of the body that waits fail at once, and every later
// one: the read deadline is moved to the past. It may be called from any
// goroutine; nil: nothing.
func (b *bodyGuard) halt() {
	if b == nil || b.done.Load() {
		return // no read left to fail (the next request sets its own deadline)
	}
	b.halted.Store(true)
	_ = b.body.rc.SetReadDeadline(time.Unix(1, 0))
}

// brokenBy returns the error that made the client's body unreadable (not
// its deadline, not its size limit), or nil.
func (b *bodyGuard) brokenBy() error {
	if b == nil {
		return nil
	}
	if e := b.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// ranOut reports whether the body did not arrive in time: a read failed at
// the deadline, or, unless the forward timed out first (an upstream that
// stops reading the body is not the client's fault), the deadline passed
// before the body's end. The second covers the race in which net/http
// cancels the request's context on the failed read, and the reverse proxy
// returns, before the body's Read does.
func (b *bodyGuard) ranOut(forwardTimedOut bool) bool {
	if b == nil {
		return false
	}
	return b.timedOut.Load() || (!forwardTimedOut && !b.done.Load() && !time.Now().Before(b.deadline))
}

// err is the error of a body that ran out of time.
func (b *bodyGuard) err(cause error) error {
	return &tokens.Error{Kind: problems.ErrRequestTimeout, Field: "body", Cause: cause,
		Detail: "the request body was not received within the body timeout of " + b.timeout.String()}
}

type deadlineBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	guard *bodyGuard
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		if !b.guard.done.Swap(true) {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		if b.guard.halted.Load() {
			break // not the client's slowness: the forward was halted
		}
		b.guard.timedOut.Store(true)
		err = b.guard.err(err)
	case err != nil:
		var maxBytes *http.MaxBytesError
		if !errors.As(err, &maxBytes) && !errors.Is(err, http.ErrBodyReadAfterClose) {
			broken := err // its own variable: &err would move err to the heap on every Read
			b.guard.broken.CompareAndSwap(nil, &broken)
		}
	}
	return n, err
}
