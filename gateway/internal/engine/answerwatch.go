//go:build unix

package engine

// Answers that come while the request is half-sent. An upstream may answer
// before it has all of a request: one that refuses on the head alone (413,
// 401), one that answers without reading the body. net/http's Transport
// hears such an answer at once (its read goroutine) and the reverse proxy
// relays it. The engine writes the request and then reads the answer, on
// one goroutine, so it would hear the answer only once the body was all
// sent: a client that goes quiet mid-body held it until its body timeout,
// when the exchange failed instead, its client answered 408 rather than
// with the upstream's answer, and the resource drained for an outcome the
// upstream had decided.
//
// So while a streamed body is sent to a plain-TCP upstream, the connection
// is watched (watchAnswer) for the start of a final answer: a status line
// of 200 or more, peeked at without being read, so the exchange still reads
// the whole answer itself. Once one came, a body that keeps coming is sent
// on to its end, as before (the upstream and the client keep their
// connections: TestEarlyAnswerToAPacedBody); a body that sends nothing to
// the upstream for stallGrace is halted (Write.Halt: the read of the
// client's body that waits fails), and the exchange reads the answer, on a
// connection that closes after it (the request was cut short). An upstream
// that closes its end of the connection with no answer can send none
// after: the body is halted at once, and the exchange fails on that
// (errHungUp), its client answered 502 at once, not 408 at its body
// timeout (the outcome is unknown either way: the resource drains). Over TLS the
// bytes below are records, which say nothing of the status (and a
// post-handshake message may come unasked): not watched there, as before.

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"time"
)

// errHungUp is the error of an exchange whose upstream closed its end of
// the connection, with no answer, while the request was half-sent.
var errHungUp = errors.New("the upstream closed the connection while the request was being sent, without an answer")

// stallGrace is how long a half-sent body must send nothing to the
// upstream, after the upstream's early final answer, before it is
// halted: short against any body timeout, long against the gaps of a body
// that streams.
const stallGrace = 250 * time.Millisecond

// answerWatch watches one half-sent exchange's connection, on a goroutine
// of its own from the start of the request's write to its end (end), which
// waits for it.
type answerWatch struct {
	c       *engineConn
	w       Write
	stop    chan struct{}
	stopped atomic.Bool
	done    chan struct{}
	heard   heard // read after done
	line    [len("HTTP/1.1 200")]byte
}

// heard is what a watch heard of the upstream while the request was
// half-sent.
type heard int

const (
	heardNothing heard = iota
	heardAnswer        // the start of a final answer
	heardHangUp        // the upstream's end of the connection, no answer before it
)

// watchAnswer starts watching c, whose request (w's) is about to be
// written with a streamed body; nil if c cannot be watched (TLS, no raw
// connection).
func watchAnswer(c *engineConn, w Write) *answerWatch {
	if c.nc != c.tcp || c.rawConn() == nil {
		return nil
	}
	a := &answerWatch{c: c, w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a
}

func (a *answerWatch) run() {
	defer close(a.done)
	var got heard
	_ = a.c.raw.Read(func(fd uintptr) bool {
		if a.stopped.Load() {
			return true
		}
		n, _, err := syscall.Recvfrom(int(fd), a.line[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			return false // nothing yet: wait for bytes
		case err == nil && n == 0, err == syscall.ECONNRESET:
			got = heardHangUp // closed, or reset (what came before a reset is lost)
			return true
		case err != nil:
			return true // failed (reset): the exchange sees that itself
		case n < len(a.line):
			return false // the status line's start is still coming
		}
		if finalStatusLine(a.line[:]) {
			got = heardAnswer
		}
		return true
	})
	switch got {
	case heardNothing:
		return
	case heardHangUp:
		// No answer can follow: nothing the body sends can make the
		// exchange end otherwise, so it ends now.
		a.heard = got
		a.w.Halt()
		return
	}
	a.heard = got
	sent := a.c.sent.Load()
	t := time.NewTimer(stallGrace)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if now := a.c.sent.Load(); now != sent {
			sent = now
			t.Reset(stallGrace)
			continue
		}
		a.w.Halt()
		return
	}
}

// finalStatusLine reports whether b starts the status line of a final
// answer ("HTTP/1.x " and a code of 200 or more: ReadResponse takes any
// three digits).
func finalStatusLine(b []byte) bool {
	return len(b) >= 12 && string(b[:7]) == "HTTP/1." && b[8] == ' ' && b[9] >= '2' && b[9] <= '9'
}

// end stops the watch, waits until it has stopped and puts the exchange's
// read deadline back (the wake-up moved it); it reports what the watch
// heard. A nil watch: nothing.
func (a *answerWatch) end(ctx context.Context) heard {
	if a == nil {
		return heardNothing
	}
	a.stopped.Store(true)
	close(a.stop)
	c := a.c
	_ = c.nc.SetReadDeadline(aLongTimeAgo) // ends a wait for the answer's first bytes
	<-a.done
	if c.deadline {
		_ = c.nc.SetReadDeadline(c.deadlineAt)
	} else {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	if ctx.Err() != nil {
		c.abort() // the context ended meanwhile: its abort may have been undone here
	}
	return a.heard
}
