//go:build unix

package engine

// The liveness check of an idle upstream connection before it is reused
// (Linux and the BSDs: a non-blocking peek).

import (
	"errors"
	"syscall"
)

// alive reports whether an idle connection may carry the next request: the
// upstream has not closed it, and it holds no unsolicited bytes. One
// non-blocking peek: nothing to read (EAGAIN) is alive.
func (c *engineConn) alive() bool {
	idle, err := c.check()
	return err == nil && idle
}

// check is alive's peek: idle if it found nothing to read; an error if it
// could not be made (a deadline past, an abort, a closed connection, no
// socket), which says nothing of the connection's end.
func (c *engineConn) check() (idle bool, err error) {
	if c.br.Buffered() > 0 {
		return false, nil
	}
	if c.peek == nil {
		if c.rawConn() == nil {
			return false, errNoSocket
		}
		// Made once per connection: a closure per check would allocate.
		c.peek = func(fd uintptr) bool {
			c.peekOK = peekIdle(fd, &c.peekBuf) // peek_*.go
			return true                         // never wait
		}
	}
	c.peekOK = false
	if err := c.raw.Read(c.peek); err != nil {
		return false, err
	}
	return c.peekOK, nil
}

// errNoSocket: the connection has no socket to peek at.
var errNoSocket = errors.New("the connection has no socket to check")

// rawConn returns the connection's socket below TLS (any unsolicited
// record, a close_notify, is bytes there), made once; nil if it has none.
func (c *engineConn) rawConn() syscall.RawConn {
	if c.raw == nil {
		sc, ok := c.tcp.(syscall.Conn)
		if !ok {
			return nil
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return nil
		}
		c.raw = rc
	}
	return c.raw
}
