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
// So while a streamed body is sent, a goroutine of its own (watchAnswer)
// waits on the connection's reader for the start of an answer, the bytes
// peeked, not consumed, so the exchange still reads the whole answer
// itself. If they start a final answer (a status of 200 or more), a body
// that keeps coming is sent on to its end, as before (the upstream and the
// client keep their connections: TestEarlyAnswerToAPacedBody); a body that
// sends nothing to the upstream for stallGrace is halted (Write.Halt: the
// read of the client's body that waits fails), and the exchange reads the
// answer, on a connection that closes after it (the request was cut
// short). An upstream that closes or resets its connection with no answer
// can send none after: the body is halted at once, and the exchange fails
// on that (errHungUp), its client answered 502 at once, not 408 at its
// body timeout (the outcome is unknown either way: the resource drains).
// Informational answers (1xx but 101) are looked past, left in the buffer:
// the final answer after them is what the watch waits for.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
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
// written with a streamed body.
func watchAnswer(c *engineConn, w Write) *answerWatch {
	a := &answerWatch{c: c, w: w, stop: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a
}

func (a *answerWatch) run() {
	defer close(a.done)
	// The connection's own reader: the bytes peeked stay in its buffer,
	// for the exchange to read as the answer's (nobody else reads it while
	// the request is written). Over TLS, what comes unasked (a session
	// ticket) is the TLS connection's to take, inside its Read.
	br := a.c.br
	for off := 0; ; {
		b, err := br.Peek(off + len("HTTP/1.1 200"))
		switch {
		case a.stopped.Load():
			return // woken by end (the request is written): nothing to tell
		case err == nil && finalStatusLine(b[off:]):
			a.heard = heardAnswer
		case err == nil && informationalStatusLine(b[off:]):
			// Look past it, leaving it in the buffer for the exchange to
			// read (and relay) as it reads the final answer.
			if off = headEnd(br, off); off < 0 {
				return // a head too large to peek at, or a failed read
			}
			continue
		case err == nil:
			return // a 101, or no answer at all: the exchange reads it
		case len(b) == off && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
			// Closed, or reset (what came before a reset is lost), after
			// no answer or only informational ones: no final answer can
			// follow, and nothing the body sends can end the exchange
			// otherwise, so it ends now.
			a.heard = heardHangUp
			a.w.Halt()
			return
		default:
			return // a failed read: the exchange sees it itself
		}
		break
	}
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

// informationalStatusLine reports whether b starts the status line of an
// informational answer that a final one follows ("HTTP/1.x 1" and two
// digits, but 101: a protocol switch is no answer the exchange takes).
func informationalStatusLine(b []byte) bool {
	return len(b) >= 12 && string(b[:7]) == "HTTP/1." && b[8] == ' ' && b[9] == '1' &&
		b[10] >= '0' && b[10] <= '9' && b[11] >= '0' && b[11] <= '9' && string(b[9:12]) != "101"
}

// headEnd returns the offset just past the end (an empty line) of the head
// that starts at off in br's buffer, peeking at more as it comes without
// consuming any; -1 if the head has a bare LF (ReadResponse's to judge, and
// where it ends is then not this one's to say), does not fit the buffer,
// or a read fails.
func headEnd(br *bufio.Reader, off int) int {
	for n := br.Buffered(); ; n = br.Buffered() + 1 {
		b, err := br.Peek(n)
		switch end := wire.HeadEnd(b[off:]); {
		case end > 0:
			return off + end
		case end < 0 || err != nil:
			return -1
		}
	}
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
	_ = c.nc.SetReadDeadline(aLongTimeAgo) // ends the peek's wait for the answer's first bytes
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
