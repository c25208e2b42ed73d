package framing

// Deadlines set on a connection take effect when it next reads or writes.
//
// A fenced write sets its connection's deadlines six times (the idle wait,
// the server's read timeout, the body's read deadline and its lifting, the
// answer's write deadline and its lifting), each a change of a runtime
// timer, and most are replaced before any read or write system call needs
// them: the body is usually in the buffer already, and the next idle wait
// replaces the read deadline again. So a deadline set while no read (or
// write) is under way is kept, and set on the socket just before the next
// one starts; one set while a read (or write) is under way is set at once,
// as it must bound or end that call. Either way every read and write
// system call runs under the deadline last set before it, as it would if
// each were set at once: a deadline in the past fails the next call at
// once, and one set meanwhile ends a call that waits.

import "time"

// lazyDeadlines is a connection's deadlines not yet set on its socket, and
// its reads and writes under way; guarded by the connection's mu.
type lazyDeadlines struct {
	read, write               time.Time
	readPending, writePending bool
	reading, writing          int
}

// SetReadDeadline sets the deadline of the connection's reads.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dl.reading > 0 || c.closed.Load() {
		c.dl.readPending = false
		return c.Conn.SetReadDeadline(t)
	}
	c.dl.read, c.dl.readPending = t, true
	return nil
}

// SetWriteDeadline sets the deadline of the connection's writes.
func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dl.writing > 0 || c.closed.Load() {
		c.dl.writePending = false
		return c.Conn.SetWriteDeadline(t)
	}
	c.dl.write, c.dl.writePending = t, true
	return nil
}

// SetDeadline sets both deadlines.
func (c *conn) SetDeadline(t time.Time) error {
	err := c.SetReadDeadline(t)
	if werr := c.SetWriteDeadline(t); err == nil {
		err = werr
	}
	return err
}

// beginRead sets a pending read deadline (and, under TLS, whose reads may
// write, a pending write deadline) on the socket and counts a read under
// way; endRead is its end.
func (c *conn) beginRead() {
	c.mu.Lock()
	if c.dl.readPending {
		c.dl.readPending = false
		_ = c.Conn.SetReadDeadline(c.dl.read)
	}
	if c.tlsConn != nil && c.dl.writePending {
		c.dl.writePending = false
		_ = c.Conn.SetWriteDeadline(c.dl.write)
	}
	c.dl.reading++
	c.mu.Unlock()
}

// beginWrite is beginRead for a write; endWrite its end.
func (c *conn) beginWrite() {
	c.mu.Lock()
	if c.dl.writePending {
		c.dl.writePending = false
		_ = c.Conn.SetWriteDeadline(c.dl.write)
	}
	c.dl.writing++
	c.mu.Unlock()
}

func (c *conn) endWrite() {
	c.mu.Lock()
	c.dl.writing--
	c.mu.Unlock()
}

// settle sets every pending deadline on the socket: before the connection
// is read or written other than through Read and Write (a lingering close).
func (c *conn) settle() {
	c.mu.Lock()
	if c.dl.readPending {
		c.dl.readPending = false
		_ = c.Conn.SetReadDeadline(c.dl.read)
	}
	if c.dl.writePending {
		c.dl.writePending = false
		_ = c.Conn.SetWriteDeadline(c.dl.write)
	}
	c.mu.Unlock()
}
