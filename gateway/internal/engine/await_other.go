//go:build !unix

package engine

// Without a socket's poller to wait in (rawConn is nil), the answer's read
// waits, and a connection is checked when it is taken.
func (c *engineConn) flushAwaitingAnswer() error { return c.bw.Flush() }

func (c *engineConn) sendAwaiting(p []byte) (int, error) { return c.checkedWrite(p) }
