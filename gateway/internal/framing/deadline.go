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
//
// What goes on the socket is the deadline rounded up (package coarse, at
// most a 64th of its time late), and only when it is not the one already
// there: the idle wait's and the answer's deadlines, moved on by every
// request a few milliseconds apart, mostly round to the one already set.

import (
	"net"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/coarse"
)

// lazyDeadlines is a connection's deadlines not yet set on its socket, and
// its reads and writes under way; guarded by the connection's mu.
type lazyDeadlines struct {
	read, write lazyDeadline
}

// lazyDeadline is one direction's: the deadline last set, if it is not on
// the socket yet, the calls under way, and the deadline on the socket.
type lazyDeadline struct {
	t       time.Time
	pending bool
	busy    int
	on      coarse.Socket // the (rounded) deadline on the socket
}

// setter sets one direction's deadline on a socket: net.Conn.SetReadDeadline
// or net.Conn.SetWriteDeadline.
type setter = func(net.Conn, time.Time) error

// to sets t: on the socket at once if a call is under way or now is set,
// else at the next call (begin).
func (d *lazyDeadline) to(nc net.Conn, set setter, t time.Time, now bool) error {
	if d.busy > 0 || now {
		d.pending = false
		_, err := d.on.Set(nc, set, t)
		return err
	}
	d.t, d.pending = t, true
	return nil
}

// settle sets a pending deadline on the socket.
func (d *lazyDeadline) settle(nc net.Conn, set setter) {
	if d.pending {
		d.pending = false
		_, _ = d.on.Set(nc, set, d.t)
	}
}

// SetReadDeadline sets the deadline of the connection's reads.
func (c *conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dl.read.to(c.Conn, net.Conn.SetReadDeadline, t, c.closed.Load())
}

// SetWriteDeadline sets the deadline of the connection's writes.
func (c *conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dl.write.to(c.Conn, net.Conn.SetWriteDeadline, t, c.closed.Load())
}

// SetDeadline sets both deadlines.
func (c *conn) SetDeadline(t time.Time) error {
	err := c.SetReadDeadline(t)
	if werr := c.SetWriteDeadline(t); err == nil {
		err = werr
	}
	return err
}

// begin sets the pending deadline of a read (or a write) on the socket and
// counts the call under way; Read, and endWrite, end it. Under TLS, whose
// reads may write (an alert) and whose writes may read (a handshake), both
// pending deadlines are set.
func (c *conn) begin(read bool) {
	c.mu.Lock()
	if read || c.tlsConn != nil {
		c.dl.read.settle(c.Conn, net.Conn.SetReadDeadline)
	}
	if !read || c.tlsConn != nil {
		c.dl.write.settle(c.Conn, net.Conn.SetWriteDeadline)
	}
	if read {
		c.dl.read.busy++
	} else {
		c.dl.write.busy++
	}
	c.mu.Unlock()
}

func (c *conn) endWrite() {
	c.mu.Lock()
	c.dl.write.busy--
	c.mu.Unlock()
}

// settle sets every pending deadline on the socket: before the connection
// is read or written other than through Read and Write (a lingering close).
func (c *conn) settle() {
	c.mu.Lock()
	c.dl.read.settle(c.Conn, net.Conn.SetReadDeadline)
	c.dl.write.settle(c.Conn, net.Conn.SetWriteDeadline)
	c.mu.Unlock()
}
