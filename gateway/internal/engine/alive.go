//go:build unix

package engine

// The liveness check of an idle upstream connection before it is reused
// (Linux and the BSDs: a non-blocking peek).

import "syscall"

// alive reports whether an idle connection may carry the next request: the
// upstream has not closed it, and it holds no unsolicited bytes. One
// non-blocking peek: nothing to read (EAGAIN) is alive.
func (c *engineConn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	if c.peek == nil {
		if c.rawConn() == nil {
			return false
		}
		// Made once per connection: a closure per check would allocate.
		c.peek = func(fd uintptr) bool {
			c.peekOK = peekIdle(fd, &c.peekBuf) // peek_*.go
			return true                         // never wait
		}
	}
	c.peekOK = false
	err := c.raw.Read(c.peek)
	return err == nil && c.peekOK
}

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
