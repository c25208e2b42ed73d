// Package coarse rounds a socket's deadline up to a grid, so that a
// connection whose deadline is moved on by every request changes its
// runtime timer once per step of the grid instead of once per request.
//
// A fenced write sets three socket deadlines (the client's idle wait and
// answer write, the upstream's exchange), each some seconds ahead. Every
// SetDeadline is a change of a runtime timer under its heap's lock, and a
// new deadline, however close to the last, is a change: the runtime takes
// the time left and adds its own clock again. A deadline rounded up to a
// step of at most a 64th of the time left (and at most about 268 ms) is
// most often the one already on the socket, which its holder then keeps.
//
// So a deadline fires at most a 64th of its time late, and never early: a
// deadline in the past, or closer than 64 µs, is kept exactly, so that it
// still fails a call at once or bounds it as closely as it was asked to.
package coarse

import (
	"math/bits"
	"net"
	"time"
)

// maxStep is the coarsest step: 2^28 ns, about 268 ms, the step of the
// gateway's 30-second timeouts (a 64th of them is 469 ms). A connection
// serving a write every few milliseconds then changes its timer about once
// per hundred writes; at 2^24 (16.8 ms) it changed it every third or
// fourth write, three sockets a write (scripts/callgrind-servers.sh: 1,070
// instructions a write at callgrind's pace, 36,390 -> 35,319). A longer
// timeout (the two-minute idle wait) is late by this at most.
const maxStep = 1 << 28

// Deadline is t rounded up to a step of the grid (a power of two
// nanoseconds, at most a 64th of the time from now to t, at most maxStep),
// and the rounded time as Unix nanoseconds; t exactly (and its Unix
// nanoseconds) if it is past or closer than 64 µs; zero (and 0) if t is.
func Deadline(t time.Time) (time.Time, int64) {
	if t.IsZero() {
		return t, 0
	}
	// time.Until reads only the monotonic clock for a t that has its
	// reading (t made by time.Now().Add): half of time.Now's cost.
	return rounded(t, time.Until(t))
}

// rounded is t, due in left, rounded up.
func rounded(t time.Time, left time.Duration) (time.Time, int64) {
	up, ns := grid(t, left)
	return at(t, up, ns), up
}

// grid is t's Unix nanoseconds rounded up to the grid for a deadline due
// in left, and t's own.
func grid(t time.Time, left time.Duration) (up, ns int64) {
	ns = t.UnixNano()
	left /= 64
	if left < time.Microsecond {
		return ns, ns
	}
	step := int64(1) << (bits.Len64(uint64(left)) - 1)
	if step > maxStep {
		step = maxStep
	}
	return (ns + step - 1) &^ (step - 1), ns
}

// at is t moved to up, t's Unix nanoseconds being ns.
func at(t time.Time, up, ns int64) time.Time {
	if up == ns {
		return t
	}
	// Add keeps t's monotonic reading: the runtime measures the time left
	// by it, as it would t's.
	return t.Add(time.Duration(up - ns))
}

// Socket is what a connection's holder knows of the deadline on one of its
// socket's directions (or on both): the rounded deadline it last set, so
// that the next is set only when it rounds to another. The zero Socket is a
// socket with no deadline.
type Socket struct {
	ns int64     // the deadline's Unix nanoseconds; 0: none; unknown: see Forget
	t  time.Time // the deadline set with ns (zero with 0)
}

// unknown is Socket.ns once a deadline was set on the socket past it: no
// deadline's Unix nanoseconds (a time before 1678).
const unknown = -1 << 63

// Set sets t, rounded up (Deadline), on nc with set (net.Conn's
// SetDeadline, SetReadDeadline or SetWriteDeadline), unless nc has it
// already; it returns the deadline nc has then.
func (s *Socket) Set(nc net.Conn, set func(net.Conn, time.Time) error, t time.Time) (time.Time, error) {
	var up, ns int64
	if !t.IsZero() {
		up, ns = grid(t, time.Until(t))
	}
	if up == s.ns {
		// The deadline the socket has: no new time made (time.Time.Add,
		// about 75 instructions, three times a fenced write).
		return s.t, nil
	}
	t = at(t, up, ns)
	if err := set(nc, t); err != nil {
		return t, err
	}
	s.ns, s.t = up, t
	return t, nil
}

// Forget says the socket's deadline was set past s: the next Set sets its
// deadline whatever it is.
func (s *Socket) Forget() { s.ns = unknown }
