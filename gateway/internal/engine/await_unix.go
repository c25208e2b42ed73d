//go:build unix

package engine

import (
	"net"
	"os"
	"syscall"
)

// flushAwaitingAnswer sends what c.bw holds, as its Flush does, and then
// waits in the connection's poller until the upstream's answer can be
// read, so that the read after it finds the answer there. A read straight
// after the send nearly always finds nothing yet (the upstream has not
// answered in the microseconds since) and pays a system call to learn it
// (EAGAIN) before it waits.
//
// The send is made inside the wait (RawConn.Read's callback, sendAwaiting),
// whose readiness is armed first; the connection's check (the peek) is
// made there too, before the send: anything the upstream sends from then
// on, an answer or its end, wakes the wait, and nothing it sent before is
// missed. So a request held whole costs the peek, the send and the read
// of its answer, where it cost the peek, the send, a read that found
// nothing and the read of its answer. What the socket does not take at
// once goes the usual way, through the connection's Write, and its read
// then waits as before. A plain connection only: under TLS the answer's
// first bytes on the socket need not be a whole record.
func (c *engineConn) flushAwaitingAnswer() error {
	if c.bw.Buffered() == 0 || c.key.tls || c.rawConn() == nil {
		return c.bw.Flush()
	}
	c.await = true // Flush writes its buffer in one Write
	err := c.bw.Flush()
	c.await = false
	return err
}

// sendAwaiting writes p to the socket, after the check of a reused
// connection (unchecked: none was made when it was taken), and if all of
// p left, waits until the socket has something to read or its end (or the
// wait fails: on the deadline, on an abort, which the read that follows
// meets again). A connection the check finds ended, or holding bytes, sends
// nothing: errUnsent.
func (c *engineConn) sendAwaiting(p []byte) (int, error) {
	s := &c.send
	if s.fn == nil {
		// Made once per connection: a closure per send would allocate.
		s.fn = func(fd uintptr) bool { return c.sendInWait(fd) }
	}
	*s = awaitedSend{fn: s.fn, p: p}
	_ = c.raw.Read(s.fn)
	n, called, gone, errno := s.n, s.called, s.gone, s.errno
	*s = awaitedSend{fn: s.fn}
	switch {
	case gone:
		return 0, errUnsent
	case !called:
		// The wait failed before the check and the send (a deadline
		// passed, an abort, the connection closed): no sign of the
		// connection's end, and the usual write meets the same failure.
		c.unchecked = false
		return c.nc.Write(p)
	case errno != nil && errno != syscall.EAGAIN:
		return n, &net.OpError{Op: "write", Net: "tcp", Source: c.tcp.LocalAddr(), Addr: c.tcp.RemoteAddr(), Err: os.NewSyscallError("write", errno)}
	case n < len(p):
		m, err := c.nc.Write(p[n:])
		return n + m, err
	}
	return n, nil
}

// sendInWait is sendAwaiting's callback: its first call checks the
// connection and sends, and asks to wait only once all of the bytes left;
// the next (the socket readable) ends the wait.
func (c *engineConn) sendInWait(fd uintptr) bool {
	s := &c.send
	if s.called {
		return true // readable
	}
	s.called = true
	if c.unchecked {
		c.unchecked = false
		if !peekIdle(fd, &c.peekBuf) {
			s.gone = true
			return true
		}
	}
	for {
		m, err := syscall.Write(int(fd), s.p)
		if err == syscall.EINTR {
			continue
		}
		s.n, s.errno = max(m, 0), err
		return err != nil || s.n < len(s.p) // wait only once all of p left
	}
}
