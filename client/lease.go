package client

// Lease: one grant kept alive in the background, its accessors, release,
// and its loss.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/fencegw/fencegw/api"
)

// Lease is one grant of a resource, kept alive in the background: it is
// renewed every TTL/3; a failed renewal is retried with backoff; it is lost
// when the gateway answers lease_lost (or not_found), when a fenced write
// is refused as stale, or when its TTL runs out on the local monotonic
// clock (minus the safety margin) without a successful renewal.
//
// A Lease is safe for concurrent use. Read the package documentation: a
// *Lease that is not yet Done may already be lost; the gateway's fence, not
// this object, is what makes writes safe.
//
// Every Lease must end with Release, Close, Orphan, or its loss; until then
// a goroutine renews it.
type Lease struct {
	c        *Client
	id       string
	resource string
	holder   string
	token    int64
	ttl      time.Duration
	margin   time.Duration

	// ctx is cancelled, with the reason as its cause, when the lease is lost
	// or released.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// The keep-alive goroutine runs until loopCtx ends (stopLoop, or ctx)
	// and then closes loopDone.
	loopCtx  context.Context
	stopLoop context.CancelFunc
	loopDone chan struct{}

	relMu sync.Mutex // serialises Release

	mu       sync.Mutex
	deadline time.Time     // local, monotonic: the lease counts as lost from then on
	expiry   *time.Timer   // fires at deadline
	lastErr  error         // the last failed renewal, for the loss's message
	released bool          // the gateway confirmed our release
	final    error         // the gateway said the lease is lost
	rtt      time.Duration // the round trip of the last acquire or renewal, for the clock header
}

// HeaderClientTime tells the gateway the caller's wall-clock time (and the
// round trip of its previous call) on acquire and renew, so that the
// gateway can report a drifting worker clock. It changes nothing about the
// lease: lease time is the gateway's.
const HeaderClientTime = "Fencing-Client-Time"

// clientTime is the Fencing-Client-Time value for a call sent now after a
// previous round trip of rtt (0: unknown).
func clientTime(rtt time.Duration) *string {
	v := time.Now().UTC().Format(time.RFC3339Nano)
	if rtt > 0 {
		v += fmt.Sprintf(";rtt=%.1f", float64(rtt.Microseconds())/1000)
	}
	return &v
}

// acquireClock is the clock header of an acquire (no earlier round trip).
func acquireClock() *api.AcquireLeaseParams {
	return &api.AcquireLeaseParams{FencingClientTime: clientTime(0)}
}

// newLease starts the lease's expiry timer and keep-alive. An acquire that
// took longer than a renewal period (it waited for the resource) is renewed
// once first: the gateway's count began at the grant, somewhere within the
// call, but only the call's send time is a safe local bound for it, and a
// lease counted from there could be lost on arrival. A lease the gateway
// then says is gone is returned as the renewal's ErrLeaseLost.
func newLease(ctx context.Context, c *Client, l *api.Lease, ttl, margin time.Duration, sent time.Time) (*Lease, error) {
	lease := &Lease{
		c:        c,
		id:       l.LeaseId,
		resource: l.Resource,
		holder:   l.Holder,
		token:    l.Token,
		ttl:      ttl,
		margin:   margin,
		loopDone: make(chan struct{}),
		rtt:      time.Since(sent),
	}
	// The lease's life is independent of the acquire call's context, but
	// keeps its values.
	lease.ctx, lease.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	lease.loopCtx, lease.stopLoop = context.WithCancel(lease.ctx)

	lease.mu.Lock()
	lease.deadline = sent.Add(time.Duration(l.TtlMs)*time.Millisecond - margin)
	lease.mu.Unlock()
	if every := max(ttl/3, time.Millisecond); time.Since(sent) > every {
		// Bounded by a TTL from now, not by the deadline counted from the
		// send, which may have passed although the gateway's has not.
		renewed, err := lease.renewBy(time.Now().Add(ttl))
		switch {
		case err == nil:
			sent = renewed
		case errors.Is(err, ErrLeaseLost):
			lease.cancel(err)
			return nil, err
		default:
			lease.lastErr = err // the keep-alive retries it at once
			sent = time.Now().Add(-every)
		}
	}
	lease.mu.Lock()
	lease.expiry = time.AfterFunc(time.Until(lease.deadline), lease.expire)
	lease.mu.Unlock()

	go lease.keepAlive(sent)
	return lease, nil
}

// ID is the lease's secret id, what proves to the gateway that a write
// comes from this grant. Send it as the Fencing-Lease header if you make
// fenced requests without Do, Transport or HTTPClient; never log it.
func (l *Lease) ID() string { return l.id }

// Token is the lease's fencing token: strictly larger than any granted
// before it for the resource.
func (l *Lease) Token() int64 { return l.token }

// Resource is the name of the leased resource.
func (l *Lease) Resource() string { return l.resource }

// Holder is the lease's holder label.
func (l *Lease) Holder() string { return l.holder }

// TTL is the lease's duration, as asked for at acquire and at each renewal.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Deadline is when the lease runs out by the local monotonic clock unless
// renewed before: the last successful renewal's send time plus the TTL the
// gateway reported, minus the safety margin. It moves forward with every
// successful renewal.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done returns a channel closed when the lease is lost or released. The
// lease may be lost well before Done is closed (see the package
// documentation), never the other way round.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Context returns a context cancelled when Done is closed, with the reason
// as its cause (context.Cause): an error matching ErrLeaseLost, or
// ErrReleased. It carries the values of the context given to Acquire.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is nil while the lease is not known to be lost; then it is why: an
// error matching ErrLeaseLost (an *Error with the gateway's answer, or the
// TTL running out locally), or ErrReleased after Release.
func (l *Lease) Err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release stops renewing the lease and releases it at the gateway, so the
// resource is free at once. It returns nil if the gateway released it (now
// or by an earlier call); an error matching ErrLeaseLost if the lease had
// already been lost (expired or superseded: work done under it may have
// been refused); ErrUnavailable if the gateway did not answer, in which case
// Release may be called again, and otherwise the lease expires after its
// TTL. Done is closed once the lease is released or lost.
func (l *Lease) Release(ctx context.Context) error {
	l.stopRenewing()
	l.relMu.Lock()
	defer l.relMu.Unlock()
	l.mu.Lock()
	released, final := l.released, l.final
	l.mu.Unlock()
	switch {
	case released:
		return nil
	case final != nil:
		return final
	}
	resp, err := l.c.api.ReleaseLeaseWithResponse(ctx, l.id)
	if err != nil {
		return transportError(OpRelease, err)
	}
	if resp.StatusCode() == http.StatusNoContent {
		l.mu.Lock()
		l.released = true
		l.loseLocked(ErrReleased)
		l.mu.Unlock()
		return nil
	}
	e := answerError(OpRelease, resp.HTTPResponse, resp.Body)
	if errors.Is(e, ErrLeaseLost) {
		l.lose(e)
	}
	return e
}

// Close is Release bounded by DefaultCloseTimeout, for defer.
func (l *Lease) Close() error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), DefaultCloseTimeout)
	defer cancel()
	return l.Release(ctx)
}

// Orphan stops renewing the lease without releasing it: the gateway keeps
// it until its TTL runs out, and Done is closed at Deadline. Use it when
// the gateway cannot be reached to release, or when the lease's id is
// handed to another process that will renew or release it. Release after
// Orphan still releases.
func (l *Lease) Orphan() { l.stopRenewing() }

// stopRenewing ends the keep-alive and waits for it to exit.
func (l *Lease) stopRenewing() {
	l.stopLoop()
	<-l.loopDone
}

// keepAlive renews the lease every TTL/3 and retries failures with backoff,
// until stopped or lost.
//
// Renewals do not honour Retry-After: waiting a whole second could cost a
// short lease, and a renewal is one small request per lease per TTL/3.
func (l *Lease) keepAlive(sent time.Time) {
	defer close(l.loopDone)
	every := max(l.ttl/3, time.Millisecond)
	t := time.NewTimer(time.Until(sent.Add(every)))
	defer t.Stop()
	var backoff time.Duration
	for {
		select {
		case <-l.loopCtx.Done():
			return
		case <-t.C:
		}
		sent, err := l.renew()
		var wait time.Duration
		switch {
		case err == nil:
			backoff = 0
			wait = time.Until(sent.Add(every))
		case l.loopCtx.Err() != nil:
			return
		case errors.Is(err, ErrLeaseLost):
			// The gateway's word: expired, released or superseded.
			l.lose(err)
			return
		default:
			l.mu.Lock()
			l.lastErr = err
			l.mu.Unlock()
			backoff = nextBackoff(backoff, l.ttl)
			wait = backoff
		}
		t.Reset(wait)
	}
}

// nextBackoff doubles from TTL/20 up to TTL/6, with ±20 % jitter so that
// many workers that lost the gateway together do not retry in step.
func nextBackoff(prev, ttl time.Duration) time.Duration {
	lo, hi := max(ttl/20, 5*time.Millisecond), max(ttl/6, 5*time.Millisecond)
	d := min(max(2*prev, lo), hi)
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// renew makes one renewal, bounded by the local deadline (after it, the
// lease counts as lost whatever the answer), and extends the deadline on
// success.
func (l *Lease) renew() (sent time.Time, err error) { return l.renewBy(l.Deadline()) }

// renewBy is renew bounded by deadline.
func (l *Lease) renewBy(deadline time.Time) (sent time.Time, err error) {
	ctx, cancel := context.WithDeadline(l.loopCtx, deadline)
	defer cancel()
	ms := l.ttl.Milliseconds()
	l.mu.Lock()
	clock := &api.RenewLeaseParams{FencingClientTime: clientTime(l.rtt)}
	l.mu.Unlock()
	sent = time.Now()
	resp, err := l.c.api.RenewLeaseWithResponse(ctx, l.id, clock, api.RenewRequest{TtlMs: &ms})
	if err != nil {
		return sent, transportError(OpRenew, err)
	}
	l.mu.Lock()
	l.rtt = time.Since(sent)
	l.mu.Unlock()
	if resp.StatusCode() != http.StatusOK || resp.JSON200 == nil {
		return sent, answerError(OpRenew, resp.HTTPResponse, resp.Body)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx.Err() != nil {
		return sent, nil // lost meanwhile; it stays lost
	}
	l.lastErr = nil
	if d := sent.Add(time.Duration(resp.JSON200.TtlMs)*time.Millisecond - l.margin); d.After(l.deadline) {
		l.deadline = d
		if l.expiry != nil { // nil during newLease's first renewal
			l.expiry.Reset(time.Until(d))
		}
	}
	return sent, nil
}

// expire runs at the deadline: unless a renewal moved it meanwhile, the
// lease is lost.
func (l *Lease) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Now().Before(l.deadline) {
		return
	}
	cause := fmt.Errorf("%w: the TTL ran out without a successful renewal (resource %q, token %d)", ErrLeaseLost, l.resource, l.token)
	if l.lastErr != nil {
		cause = fmt.Errorf("%w: the TTL ran out without a successful renewal (resource %q, token %d); last attempt: %w", ErrLeaseLost, l.resource, l.token, l.lastErr)
	}
	l.loseLocked(cause)
}

// lose marks the lease lost on the gateway's word.
func (l *Lease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.final == nil && !l.released {
		l.final = err
	}
	l.loseLocked(err)
}

// loseLocked closes Done with cause (the first cause wins) and stops the
// expiry timer; the keep-alive ends with the context.
func (l *Lease) loseLocked(cause error) {
	if l.ctx.Err() != nil {
		return
	}
	l.cancel(cause)
	l.expiry.Stop()
}
