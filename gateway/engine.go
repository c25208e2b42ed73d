package gateway

// The forwarding engine: the http.RoundTripper under the reverse proxy for
// the fenced writes it can carry without net/http's Transport.
//
// The Transport gives every upstream connection two goroutines (one writes
// requests, one reads responses) and hands each request and each response
// across them through channels: four goroutine switches and a few
// allocations per write that, by the profile in docs/benchmarks.md, cost
// more than everything the gateway checks. The engine writes the request
// and reads the answer on the calling goroutine, over a pool of keep-alive
// HTTP/1.1 connections per upstream.
//
// It parses nothing itself: the request is serialised by net/http's own
// Request.Write (the function the Transport uses, so the bytes are the
// same, Host, Content-Length and all) and the response is read by
// net/http's ReadResponse, with the Transport's head size limit. What it
// adds is the connection's life:
//
//   - A connection goes back to the pool only when the response body was
//     read to its framed end (Content-Length or chunked; a body delimited by
//     the connection's close is never reused), neither side asked to close,
//     nothing more was buffered, and the request's context did not end.
//     So an answer can never be read for another request.
//   - Before reuse, an idle connection is checked with a non-blocking peek:
//     one the upstream closed (or that holds unsolicited bytes) is dropped,
//     so a write does not go out on a dead connection and become an unknown
//     outcome. (The Transport learns the same from its read goroutine.)
//     A window remains, as in the Transport: an upstream that closes a
//     connection right after an answer without saying so (Connection:
//     close, RFC 9112 9.6) may do it after the peek; the write then fails
//     after it left, an unknown outcome (502, the resource drains). The
//     Transport's read goroutine narrows that window, it does not shut it.
//   - The request's context ending (forward timeout, client gone) aborts a
//     blocked read or write through the connection's deadline.
//   - Request.Write reports WroteHeaders to the context's ClientTrace as
//     the Transport does, so the drain rule sees the same "the request left"
//     moment; 1xx answers go to Got1xxResponse (the ReverseProxy forwards
//     them) as in the Transport.
//
// Anything else goes to the Transport unchanged: bodies that stream
// (larger than smallBody, chunked, Expect: 100-continue), upgrades,
// trailers, https upstreams, CONNECT.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"
)

// engine is the RoundTripper of the gateway's reverse proxy.
type engine struct {
	std         *http.Transport // everything the engine does not carry
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle     int           // idle connections kept per upstream
	idleTimeout time.Duration // an idle connection older than this is closed
	maxHead     int64         // response head bytes, as the Transport's limit

	mu   sync.Mutex
	idle map[string][]*engineConn // by host:port, most recent last
}

func newEngine(std *http.Transport) *engine {
	maxHead := std.MaxResponseHeaderBytes
	if maxHead <= 0 {
		maxHead = 10 << 20 // the Transport's default
	}
	return &engine{
		std: std,
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if std.DialContext == nil {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
			nc, err := std.DialContext(ctx, network, addr)
			// The engine checks its writes itself (engineConn.Write), on
			// the bare connection, which it can peek at (alive).
			if fc, ok := nc.(*fencedConn); ok {
				nc = fc.Conn
			}
			return nc, err
		},
		maxIdle:     std.MaxIdleConnsPerHost,
		idleTimeout: std.IdleConnTimeout,
		maxHead:     maxHead,
		idle:        map[string][]*engineConn{},
	}
}

// oneExchange reports whether r, a fenced write forwarded as f to target,
// is one plain exchange, the kind the engine writes and reads itself: to a
// plain-http target; not CONNECT; no body, or one of known length in
// memory (f.buffered, smallbody.go); no Transfer-Encoding and no trailers;
// no Upgrade, Expect, TE or Trailer header. Everything else needs the
// Transport's judgement (streaming, 100-continue, upgrades, TLS).
//
// It is the one answer to that question: the engine asks it of the
// reverse proxy's outbound request (carries), the direct forward of the
// client's request (directable, engine_forward.go), so the two cannot
// drift apart again (they had: only one looked at the Trailer header,
// TestOneExchange).
func oneExchange(r *http.Request, target *url.URL, f *forward) bool {
	if f == nil || target.Scheme != "http" || r.Method == http.MethodConnect || len(r.TransferEncoding) > 0 || r.Trailer != nil {
		return false
	}
	h := r.Header
	if len(h["Upgrade"]) > 0 || len(h["Expect"]) > 0 || len(h["Te"]) > 0 || len(h["Trailer"]) > 0 {
		return false
	}
	return r.ContentLength == 0 || f.buffered != nil && r.ContentLength == int64(len(f.buffered))
}

// carries reports whether the engine forwards req, the reverse proxy's
// outbound request, itself (oneExchange).
func (e *engine) carries(req *http.Request) bool {
	f, _ := req.Context().Value(forwardKey{}).(*forward)
	return oneExchange(req, req.URL, f)
}

// RoundTrip forwards req and returns the upstream's answer.
func (e *engine) RoundTrip(req *http.Request) (*http.Response, error) {
	f, _ := req.Context().Value(forwardKey{}).(*forward)
	if !oneExchange(req, req.URL, f) {
		return e.std.RoundTrip(req)
	}
	return e.exchange(req.Context(), req, f, time.Time{}, nil)
}

// exchangeHooks are the direct forward's (engine_forward.go) ears on an
// exchange, in place of a ClientTrace in the request's context.
type exchangeHooks interface {
	// wroteHeaders: the request's head was written (the moment
	// ClientTrace.WroteHeaders reports).
	wroteHeaders()
	// got1xx: an informational answer came before the final one.
	got1xx(code int, header textproto.MIMEHeader) error
	// body is the request's body, all of it (req.ContentLength bytes).
	body() []byte
}

// exchange writes req on a connection to its upstream and reads the
// answer's head; the body is read through the returned response. ctx
// ending aborts it (at any point until the body is closed), and so does
// deadline, if set (a deadline on the connection: no timer of its own).
// With hooks nil, the request's context's ClientTrace hears what they
// would. Every write of req's bytes is checked against f's fence first
// (engineConn.Write).
func (e *engine) exchange(ctx context.Context, req *http.Request, f *forward, deadline time.Time, hooks exchangeHooks) (*http.Response, error) {
	c, err := e.get(ctx, req.URL.Host, deadline)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	if !deadline.IsZero() {
		c.deadline = true
		_ = c.nc.SetDeadline(deadline)
	}
	// A context that ends unblocks the connection's I/O at once.
	stop := context.AfterFunc(ctx, c.abort)
	c.fw = f
	fail := func(err error) (*http.Response, error) { return nil, c.failed(ctx, stop, deadline, err) }
	var trace *httptrace.ClientTrace
	switch {
	case hooks != nil && c.host != nil && req.Host == "":
		// Request.Write's bytes without its allocations (engine_write.go).
		if err = writeHead(c.bw, req, c.host); err == nil {
			hooks.wroteHeaders()
			_, err = c.bw.Write(hooks.body())
		}
	case hooks != nil:
		// The connection's own trace tells when the head was written.
		req = req.WithContext(c.trace)
		err = req.Write(c.bw)
		if c.wroteHead {
			c.wroteHead = false
			hooks.wroteHeaders()
		}
	default:
		// Request.Write reports WroteHeaders to the context's trace once
		// the head is in the buffer, then writes the body.
		trace = httptrace.ContextClientTrace(ctx)
		err = req.Write(c.bw)
	}
	// One flush sends head and body.
	if err != nil {
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		return fail(err)
	}
	c.fw = nil // all of the request has left
	c.limit = e.maxHead + int64(c.br.Size())
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(c.br, req)
		if err != nil {
			return fail(err)
		}
		code := resp.StatusCode
		if code == http.StatusSwitchingProtocols {
			// Upgrades go to the Transport; an upstream that switches
			// protocols unasked is broken.
			return fail(errors.New("the upstream switched protocols unasked"))
		}
		if code < 100 || code > 199 {
			break
		}
		var err error
		switch {
		case hooks != nil:
			err = hooks.got1xx(code, textproto.MIMEHeader(resp.Header))
		case trace != nil && trace.Got1xxResponse != nil:
			err = trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header))
		default:
			continue
		}
		if err != nil {
			return fail(err)
		}
		c.limit = e.maxHead + int64(c.br.Size())
	}
	c.limit = -1
	b := &engineBody{e: e, c: c, rc: resp.Body, stop: stop, reuse: !resp.Close && !req.Close}
	if resp.Body == http.NoBody {
		b.eof = true
	}
	resp.Body = b
	return resp, nil
}

// failed closes c after a failed exchange and returns err with what ended
// it: ctx (its cause) or the deadline (context.DeadlineExceeded).
func (c *engineConn) failed(ctx context.Context, stop func() bool, deadline time.Time, err error) error {
	stop()
	_ = c.nc.Close()
	switch {
	case ctx.Err() != nil:
		err = errors.Join(context.Cause(ctx), err)
	case !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded):
		err = errors.Join(context.DeadlineExceeded, err)
	}
	return err
}

// aLongTimeAgo is a deadline in the past: it fails blocked I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// get returns a live idle connection to addr, or dials one (by deadline,
// if set).
func (e *engine) get(ctx context.Context, addr string, deadline time.Time) (*engineConn, error) {
	now := time.Now()
	e.mu.Lock()
	for list := e.idle[addr]; len(list) > 0; list = e.idle[addr] {
		c := list[len(list)-1]
		list[len(list)-1] = nil
		e.idle[addr] = list[:len(list)-1]
		e.mu.Unlock()
		if (e.idleTimeout <= 0 || now.Sub(c.idleAt) < e.idleTimeout) && c.alive() {
			return c, nil
		}
		_ = c.nc.Close()
		e.mu.Lock()
	}
	e.mu.Unlock()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	nc, err := e.dial(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			err = errors.Join(context.Cause(ctx), err)
		}
		return nil, err
	}
	c := &engineConn{nc: nc, addr: addr, limit: -1}
	c.abort = func() { _ = c.nc.SetDeadline(aLongTimeAgo) }
	c.host, _ = hostLine(addr) // nil: Request.Write writes the head
	c.trace = httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{WroteHeaders: func() { c.wroteHead = true }})
	c.br = bufio.NewReaderSize(c, 4<<10)
	c.bw = bufio.NewWriterSize(c, 4<<10)
	return c, nil
}

// put keeps c for the next write to its upstream, or closes it. It also
// closes the connections idle for longer than idleTimeout (the oldest are
// first in the list), so that they do not linger half-closed while writes
// keep coming. (With no writes at all they stay until the next one or
// CloseIdleConnections; their number is bounded by maxIdle.)
func (e *engine) put(c *engineConn) {
	c.idleAt = time.Now()
	var stale []*engineConn
	e.mu.Lock()
	list := e.idle[c.addr]
	for len(list) > 0 && e.idleTimeout > 0 && c.idleAt.Sub(list[0].idleAt) >= e.idleTimeout {
		stale = append(stale, list[0])
		list[0] = nil
		list = list[1:]
	}
	keep := len(list) < e.maxIdle
	if keep {
		list = append(list, c)
	}
	e.idle[c.addr] = list
	e.mu.Unlock()
	for _, s := range stale {
		_ = s.nc.Close()
	}
	if !keep {
		_ = c.nc.Close()
	}
}

// CloseIdleConnections closes the idle connections of the engine and of
// the Transport.
func (e *engine) CloseIdleConnections() {
	e.mu.Lock()
	idle := e.idle
	e.idle = map[string][]*engineConn{}
	e.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			_ = c.nc.Close()
		}
	}
	e.std.CloseIdleConnections()
}

// engineConn is one upstream connection. Its reader counts the bytes of a
// response head against limit (-1: no limit, while a body is read).
type engineConn struct {
	nc     net.Conn
	addr   string
	br     *bufio.Reader // reads through the engineConn (the limit)
	bw     *bufio.Writer
	limit  int64
	idleAt time.Time
	// deadline: the exchange set a deadline on nc, to be lifted before
	// the connection is reused.
	deadline bool
	// trace is a context whose ClientTrace sets wroteHead, for exchanges
	// with hooks (one per connection, not one per request).
	trace     context.Context
	wroteHead bool
	abort     func() // fails blocked I/O on nc at once (made once)
	host      []byte // the Host line of its requests (engine_write.go)
	// fw is the write whose request is being written, whose fence each
	// write system call checks first (sendcheck.go); nil between requests.
	fw *forward
	// The idle check's (engine_alive.go), made once.
	raw     syscall.RawConn
	peek    func(fd uintptr) bool
	peekBuf [1]byte
	peekOK  bool
}

var errHeadTooLarge = errors.New("the upstream's response head is too large")

func (c *engineConn) Read(p []byte) (int, error) {
	if c.limit == 0 {
		return 0, errHeadTooLarge
	}
	if c.limit > 0 && int64(len(p)) > c.limit {
		p = p[:c.limit]
	}
	n, err := c.nc.Read(p)
	if c.limit > 0 {
		c.limit -= int64(n)
	}
	return n, err
}

// Write sends p, the bytes of c.fw's request, if c.fw's fence is still
// provably held (sendcheck.go); else it resets the connection and sends
// nothing. The exchange then fails and closes c.
func (c *engineConn) Write(p []byte) (int, error) {
	f := c.fw
	if f == nil {
		return c.nc.Write(p)
	}
	if err := f.sendCheck(); err != nil {
		resetOnClose(c.nc)
		return 0, err
	}
	n, err := c.nc.Write(p)
	f.sentBytes(n)
	return n, err
}

// engineBody is a response body over an engine connection. Its end, if
// framed and clean, returns the connection to the pool; a close before
// the end closes the connection (never drains it: the upstream may send
// forever).
type engineBody struct {
	e     *engine
	c     *engineConn
	rc    io.ReadCloser // ReadResponse's body, framed by net/http
	stop  func() bool   // stops the context's abort; false if it ran
	reuse bool          // neither side asked to close
	eof   bool
	done  bool
}

func (b *engineBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.done {
		return 0, errors.New("read on a closed response body")
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *engineBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	// ReadResponse's body at its end has nothing left to drain; before
	// its end it is not closed (that would read the rest) but dropped with
	// the connection.
	if b.stop() && b.eof && b.reuse && b.c.br.Buffered() == 0 {
		if b.c.deadline {
			b.c.deadline = false
			_ = b.c.nc.SetDeadline(time.Time{})
		}
		b.e.put(b.c)
		return nil
	}
	return b.c.nc.Close()
}
