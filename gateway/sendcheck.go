package gateway

// The proof before every byte: an admitted write sends nothing to the
// upstream unless its fence can be proven held at that moment
// (tokens.Permit.Check), and the proof is taken where the bytes leave, in
// the Write of the upstream connection, before each write system call.
// That one place covers every way a write leaves: the engine's head and
// buffered body (one flush, engineConn.Write), and the Transport's head,
// each chunk of a streamed body, a body's Content-Length bytes and the
// final empty chunk (fencedConn.Write, below TLS for https upstreams).
// Checking the body as it is read from the client would not be enough:
// the Transport buffers what it read, and the head and the chunked
// framing are bytes of the write too.
//
// A failed proof aborts the exchange: the connection is reset (SO_LINGER
// 0, which also throws away what the kernel had not yet transmitted) and
// never completes the body, so the upstream sees a request cut short, not
// a shorter one. The client gets 503 fence_lost saying whether anything
// had been sent; if it had, the outcome is unknown and the resource drains
// (forwardFailed).

import (
	"context"
	"crypto/tls"
	"net"
	"net/http/httptrace"
	"sync/atomic"
)

// sendCheck is taken before each write system call that carries bytes of
// f's request: nil if the fence is still provably held. On a lost fence it
// marks f, so that the failure is answered as fence_lost whatever error
// the Transport turns it into.
func (f *forward) sendCheck() error {
	if err := f.permit.Check(); err != nil {
		f.fenceLost.Store(true)
		return err
	}
	return nil
}

// sentBytes records that n bytes of f's request went to the kernel.
func (f *forward) sentBytes(n int) {
	if n > 0 && !f.sent.Load() {
		f.sent.Store(true)
	}
}

// resetOnClose makes the next Close of nc a reset (RST), which discards
// what the kernel still holds unsent.
func resetOnClose(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
}

// fencedConn is a Transport connection whose writes are checked against
// the fence of the write it carries (attached by GotConn; the gateway's
// Transport carries HTTP/1.1 only, one request at a time per connection).
type fencedConn struct {
	net.Conn
	fw atomic.Pointer[forward]
}

func (c *fencedConn) Write(p []byte) (int, error) {
	f := c.fw.Load()
	if f == nil {
		return c.Conn.Write(p) // a TLS handshake, or no fenced write
	}
	if err := f.sendCheck(); err != nil {
		resetOnClose(c.Conn)
		_ = c.Conn.Close()
		return 0, err
	}
	n, err := c.Conn.Write(p)
	f.sentBytes(n)
	return n, err
}

// fencedDial wraps dial so that every connection it makes is a fencedConn.
func fencedDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &fencedConn{Conn: nc}, nil
	}
}

// attach makes conn, the Transport's connection for f's request (GotConn),
// check f's fence before each write.
func (f *forward) attach(info httptrace.GotConnInfo) {
	nc := info.Conn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if fc, ok := nc.(*fencedConn); ok {
		fc.fw.Store(f)
		f.conn = fc
	}
}

// detach stops f's checks on the connection that carried it, which may
// already carry another request.
func (f *forward) detach() {
	if f.conn != nil {
		f.conn.fw.CompareAndSwap(f, nil)
	}
}
