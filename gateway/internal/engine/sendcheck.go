package engine

// The proof before every byte: an admitted write sends nothing to the
// upstream unless its fence can be proven held at that moment
// (Write.CheckSend, which the gateway answers with tokens.Permit.Check),
// and the proof is taken where the bytes leave, in the Write of the
// upstream connection, before each write system call. That one place
// covers every way a write leaves: the engine's head and buffered body
// (one flush, engineConn.Write), and the http.Transport's head, each chunk
// of a streamed body, a body's Content-Length bytes and the final empty
// chunk (fencedConn.Write, below TLS for https upstreams: FencedDial and
// Attachment). Checking the body as it is read from the client would not
// be enough: the Transport buffers what it read, and the head and the
// chunked framing are bytes of the write too.
//
// A failed proof aborts the exchange: the connection is reset (SO_LINGER
// 0, which also throws away what the kernel had not yet transmitted) and
// never completes the body, so the upstream sees a request cut short, not
// a shorter one. The gateway then answers 503 fence_lost saying whether
// anything had been sent (Write.Sent); if it had, the outcome is unknown
// and the resource drains.

import (
	"context"
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync/atomic"
)

// resetOnClose makes the next Close of nc a reset (RST), which discards
// what the kernel still holds unsent.
func resetOnClose(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// fencedConn is a Transport connection whose writes are checked against
// the fence of the write it carries (Attachment.Attach, from GotConn; the
// gateway's Transport carries HTTP/1.1 only, one request at a time per
// connection).
type fencedConn struct {
	net.Conn
	at atomic.Pointer[Attachment]
}

func (c *fencedConn) Write(p []byte) (int, error) {
	a := c.at.Load()
	if a == nil {
		return c.Conn.Write(p) // a TLS handshake, or no fenced write
	}
	if err := a.w.CheckSend(); err != nil {
		resetOnClose(c.Conn)
		_ = c.Conn.Close()
		return 0, err
	}
	n, err := c.Conn.Write(p)
	a.w.Sent(n)
	return n, err
}

// FencedDial wraps dial, an http.Transport's DialContext, so that every
// connection it makes checks the fence of the write it carries
// (Attachment) before each write system call. The engine's own
// connections, dialled through the same Transport's DialContext, check
// their writes themselves.
func FencedDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &fencedConn{Conn: nc}, nil
	}
}

// Attachment ties one Write to the http.Transport connection that carries
// it, so that the connection checks the write's fence before each write.
// The zero value is ready; one per write, kept with it (it must not be
// copied once attached), so that attaching allocates nothing.
type Attachment struct {
	w    Write
	conn *fencedConn // the Transport's connection, once it has one
}

// Attach makes the connection in info (a ClientTrace's GotConn), if
// FencedDial made it, check w's fence before each write. Every Attach of
// an Attachment must give the same w.
func (a *Attachment) Attach(w Write, info httptrace.GotConnInfo) {
	nc := info.Conn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if fc, ok := nc.(*fencedConn); ok {
		if a.w == nil {
			// Set once: a connection this write was attached to before (a
			// retry) may still read it.
			a.w = w
		}
		a.conn = fc
		fc.at.Store(a)
	}
}

// Detach stops the checks on the connection that carried the write, which
// may already carry another request.
func (a *Attachment) Detach() {
	if a.conn != nil {
		a.conn.at.CompareAndSwap(a, nil)
	}
}
