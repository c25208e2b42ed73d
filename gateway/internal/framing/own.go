package framing

// The gateway's own connection loop.
//
// Go's server costs a fenced write about a quarter of its CPU
// (docs/benchmarks.md): a goroutine's hand-offs, its background read, a
// per-request context, its response's buffers. So when the listener is
// given Own, it serves each connection itself: a loop that waits for a
// request, and serves the ones Own takes, plain HTTP/1.1 requests whose
// body has a Content-Length (the gateway's fenced writes, acquires and
// releases), with net/http's own parser (http.ReadRequest), the checks Go's
// server adds to it, and a response writer that keeps net/http's response
// rules (respond.go). Everything else (the rest of the control API, the
// dashboard, the live stream, a chunked or HEAD or HTTP/1.0 request, a head
// larger than the loop's buffer, one with Expect) is lent to Go's server:
// the connection, with the bytes the loop has read, is handed to
// http.Server.Serve through Accept, and Go's server serves it as if it had
// accepted it. It gives it back (lent.Read) once it waits, idle, for a
// request whose first bytes name one Own takes, with nothing of the
// connection buffered.
//
// The scanner sees every byte either server reads, and Check judges each
// request served either way, so the framing rules are the same on both.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// Own tells which requests the listener's own loop serves, from the start
// of a request line (the method, a space, the target's first bytes): a
// request it takes goes to the server's handler without Go's server. The
// loop takes only HTTP/1.1 requests without Transfer-Encoding or Expect,
// whose head fits its buffer, whatever Own says; nil: Go's server serves
// every request.
type Own func(line []byte) bool

// ownLoop is the part of the listener that serves connections itself.
type ownLoop struct {
	srv   *http.Server
	takes Own

	started   sync.Once
	lent      chan net.Conn // connections handed to Go's server (Accept)
	accepted  chan error    // errors of the real Accept, for Go's server
	closed    chan struct{} // the listener was closed: no keep-alive, no new connection
	shut      atomic.Bool   // closed is closed: read by every request, where a select on closed cost a lock-free channel receive each
	closeOnce sync.Once

	mu    sync.Mutex
	conns map[*ownConn]struct{}
	busy  sync.WaitGroup // connections serving a request of their own
}

func newOwnLoop(srv *http.Server, takes Own) *ownLoop {
	return &ownLoop{srv: srv, takes: takes, lent: make(chan net.Conn), accepted: make(chan error),
		closed: make(chan struct{}), conns: make(map[*ownConn]struct{})}
}

// accept is the listener's Accept with an own loop: the real listener is
// accepted from in a goroutine of its own, each connection served by the
// loop, and Go's server gets the connections the loop lends it.
func (l *listener) acceptOwn() (net.Conn, error) {
	o := l.own
	o.started.Do(func() { go l.acceptLoop() })
	select {
	case c := <-o.lent:
		return c, nil
	case err := <-o.accepted:
		return nil, err
	case <-o.closed:
		// The accept loop may have ended without handing over its error
		// (it stops as soon as the listener is closed).
		return nil, net.ErrClosed
	}
}

func (l *listener) acceptLoop() {
	o := l.own
	for {
		fc, err := l.acceptConn()
		if err != nil {
			// Go's server decides (it retries a temporary error after a
			// pause, and calls Accept again); a closed listener ends this.
			select {
			case o.accepted <- err:
			case <-o.closed:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		oc := &ownConn{fc: fc, o: o}
		if !o.add(oc) {
			_ = fc.Close()
			continue
		}
		go oc.serve()
	}
}

func (o *ownLoop) add(c *ownConn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing() {
		return false
	}
	o.conns[c] = struct{}{}
	return true
}

func (o *ownLoop) remove(c *ownConn) {
	o.mu.Lock()
	delete(o.conns, c)
	o.mu.Unlock()
}

// close stops keep-alive on the loop's connections: an idle one is closed
// now, a busy one after its answer (as Go's server after Shutdown or
// SetKeepAlivesEnabled(false)).
func (o *ownLoop) close() {
	o.closeOnce.Do(func() {
		o.mu.Lock()
		o.shut.Store(true)
		close(o.closed)
		for c := range o.conns {
			c.wake()
		}
		o.mu.Unlock()
	})
}

// abort closes every connection of the loop, busy ones included, and
// keeps new ones from being served (close). A connection lent to Go's
// server is closed too: its Close is idempotent (conn.Close).
func (o *ownLoop) abort() {
	o.close()
	o.mu.Lock()
	for c := range o.conns {
		_ = c.fc.Close()
	}
	o.mu.Unlock()
}

// begin counts a request the loop is about to serve, unless the listener
// is closed: under the lock close takes, so that Shutdown's wait sees every
// request begun before it (or none is begun).
func (o *ownLoop) begin() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closing() {
		return false
	}
	o.busy.Add(1)
	return true
}

func (o *ownLoop) closing() bool { return o.shut.Load() }

// Shutdown waits until the requests the loop serves itself are answered, or
// ctx ends: Go's server's Shutdown waits for the requests it serves, not
// for these. Call it after Close (Go's server's Shutdown closes the
// listener).
func (l *listener) Shutdown(ctx context.Context) error {
	if l.own == nil {
		return nil
	}
	l.own.close()
	done := make(chan struct{})
	go func() {
		l.own.busy.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ownConn is a connection the loop serves.
type ownConn struct {
	fc *conn
	o  *ownLoop

	br *bufio.Reader
	bw *bufio.Writer
	we errWriter // what bw writes to: the connection, noting a failed write

	ctx        context.Context // every request's (no per-request cancellation: see serve)
	neverDone  bool            // ctx's Done is nil: no request of the connection is ever cancelled
	remoteAddr string
	template   http.Request  // a request with ctx and remoteAddr: the lean parse's start (head.go)
	head       []byte        // the head mine took, in br's buffer until br reads again
	lean       *http.Request // the head mine took, parsed by the loop (head.go); nil: not plain
	leanStore  leanRequest   // lean's storage, each request's in turn

	idle      atomic.Bool // waiting for a request: a close of the listener closes it
	afterPost bool        // the last request the loop served was a POST
	watching  bool        // a WatchClient of the request being served reads the connection
	resp      response    // the answer being written (respond.go), reused
	// answerOrder is the name order of the last listed answer's head
	// (wire.WriteSortedIn).
	answerOrder wire.Order
}

// wake makes an idle connection's wait end (the listener closed).
func (c *ownConn) wake() {
	if c.idle.Load() {
		_ = c.fc.SetReadDeadline(time.Unix(1, 0))
	}
}

var (
	ownReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, ownBuffer) }}
	ownWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4<<10) }}
)

// ownBuffer is the loop's read buffer: a head must fit in it, or Go's
// server serves its request.
const ownBuffer = 4 << 10

func (c *ownConn) serve() {
	o, fc := c.o, c.fc
	defer o.remove(c)
	srv := o.srv
	c.remoteAddr = fc.RemoteAddr().String()
	ctx := context.Background()
	if srv.BaseContext != nil {
		// Go's server's context for its listener; the loop's is its own.
		if bc := srv.BaseContext(fc.l); bc != nil {
			ctx = bc
		}
	}
	ctx = context.WithValue(ctx, http.ServerContextKey, srv)
	ctx = context.WithValue(ctx, http.LocalAddrContextKey, fc.LocalAddr())
	if srv.ConnContext != nil {
		ctx = srv.ConnContext(ctx, fc)
	}
	ctx = context.WithValue(ctx, ownConnKey{}, c) // for WatchClient
	c.ctx, c.neverDone = ctx, ctx.Done() == nil
	// One context for every request of the connection: no per-request
	// cancellation, and no background read to tell a client gone (the
	// fenced write runs to its end without it, docs/design.md).
	c.template = *(&http.Request{RemoteAddr: c.remoteAddr}).WithContext(ctx)

	c.br = ownReaders.Get().(*bufio.Reader)
	c.br.Reset(fc)
	c.we = errWriter{w: fc}
	c.bw = ownWriters.Get().(*bufio.Writer)
	c.bw.Reset(&c.we)
	release := func() {
		c.br.Reset(nil)
		ownReaders.Put(c.br)
		c.bw.Reset(nil)
		ownWriters.Put(c.bw)
		c.br, c.bw = nil, nil
	}

	first, peekNext := true, 1
	for {
		// Wait for a request, as Go's server between two: the idle timeout
		// (before the first request, the header timeout) bounds the wait.
		if first {
			first = false
			if d := srv.ReadHeaderTimeout; d > 0 {
				_ = fc.SetReadDeadline(time.Now().Add(d))
			}
		} else {
			_ = fc.SetReadDeadline(idleDeadline(srv))
		}
		c.idle.Store(true)
		if o.closing() {
			c.idle.Store(false)
			release()
			_ = fc.Close()
			return
		}
		// As Go's server: four bytes of the next request, or the
		// connection ends without a word (its first request excepted).
		firstRequest := peekNext == 1
		// The loop scans the head it reads itself, if none of its bytes
		// were read yet (scanner.hold: between two requests, every head
		// taken; bytes Go's server gave back with the connection were
		// followed as it read them, so the scanner is not): a plain one
		// in the one pass that parses it (settleHead).
		held := c.br.Buffered() == 0 && fc.holdHead()
		_, err := c.br.Peek(peekNext)
		peekNext = 4
		c.idle.Store(false)
		if err != nil || o.closing() {
			if held {
				c.settleHead(nil, false)
			}
			release()
			_ = fc.Close()
			return
		}
		// The head's end (wire.HeadEnd), if found here, for mine not to
		// search again: a search was about 650 instructions of a fenced
		// write (scripts/callgrind-servers.sh).
		end := 0
		if d := readHeaderTimeout(srv); d > 0 && !firstRequest {
			// Bounds the rest of the head, from its first bytes, if it is
			// not all here yet (a head the loop lends Go's server is
			// bounded by Go's server). The first request's is bounded
			// from the connection's start, as Go's server bounds it.
			buf, _ := c.br.Peek(c.br.Buffered())
			if end = wire.HeadEnd(buf); end == 0 {
				_ = fc.SetReadDeadline(time.Now().Add(d))
			}
		}
		var lead [4]byte
		dropped := 0
		if c.afterPost {
			// Go's server's tolerance of old clients (RFC 9112 2.2): the
			// CR and LF a client sends after a POST's body are dropped.
			peek, _ := c.br.Peek(4)
			dropped = copy(lead[:], peek[:leadingCRorLF(peek)])
			_, _ = c.br.Discard(dropped)
		}
		if dropped > 0 {
			end = 0 // found where the head started before: mine searches again
		}
		take, readErr := c.mine(end)
		if held {
			c.settleHead(lead[:dropped], take)
		}
		if !take {
			held := c.held()
			c.afterPost = false // Go's server drops what it would itself
			release()
			back, ok := c.lend(held, readErr)
			if !ok {
				return // closed by Go's server
			}
			c.br = ownReaders.Get().(*bufio.Reader)
			c.br.Reset(io.MultiReader(bytes.NewReader(back), fc))
			c.bw = ownWriters.Get().(*bufio.Writer)
			c.bw.Reset(&c.we)
			continue
		}
		if !o.begin() {
			// Closed meanwhile: as Go's server in shutdown, the request
			// read is not served.
			release()
			_ = fc.Close()
			return
		}
		keep := c.serveOne()
		o.busy.Done()
		if !keep {
			release()
			_ = fc.Close()
			return
		}
	}
}

// holdHead starts the loop's own scan of the next head (scanner.hold).
func (c *conn) holdHead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scan.hold()
}

// settleHead ends the loop's own scan of a head (holdHead), before the
// request is served or lent: the bytes read meanwhile (lead, which the
// loop dropped, and what its reader holds) are followed by the scanner as
// if it had followed them as they were read, but for a plain head the
// loop takes (c.lean), whose scan is its parse's (takeHead).
func (c *ownConn) settleHead(lead []byte, take bool) {
	rest, _ := c.br.Peek(c.br.Buffered())
	fc := c.fc
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if take && c.lean != nil {
		h := c.leanStore.scanned()
		h.answer, h.neverDone = &c.resp.answer, c.neverDone
		fc.scan.takeHead(lead, rest, len(c.head), h, c.lean.Method == http.MethodPost)
		return
	}
	fc.scan.release(lead, rest)
}

// leadingCRorLF is how many CR and LF start p (net/http's
// numLeadingCRorLF).
func leadingCRorLF(p []byte) int {
	n := 0
	for _, b := range p {
		if b != '\r' && b != '\n' {
			break
		}
		n++
	}
	return n
}

// idleDeadline is when a connection waiting for its next request is
// closed: Go's server's idle timeout (its read timeout if none), or never.
func idleDeadline(srv *http.Server) time.Time {
	d := srv.IdleTimeout
	if d == 0 {
		d = srv.ReadTimeout
	}
	if d <= 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

// readHeaderTimeout is Go's server's bound on reading a request's head.
func readHeaderTimeout(srv *http.Server) time.Duration {
	if srv.ReadHeaderTimeout > 0 {
		return srv.ReadHeaderTimeout
	}
	return srv.ReadTimeout
}

// mine reports whether the loop serves the request whose bytes start the
// buffer: a whole head in the buffer, HTTP/1.1, every line ending in CRLF,
// no obs-fold, Transfer-Encoding or Expect field, exactly one Host, and a
// request line Own takes. It reads until the head is whole, the buffer is
// full or a read fails (err: the header timeout passed, the client went),
// which Go's server is then lent to see and answer as it does. A plain
// head it takes it parses too (c.lean), for readRequest. end is
// wire.HeadEnd of the bytes buffered, if the caller found it (0 if not).
func (c *ownConn) mine(end int) (take bool, err error) {
	var head []byte
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if end == 0 {
			end = wire.HeadEnd(buf)
		}
		if end < 0 {
			return false, nil
		}
		if end > 0 {
			head = buf[:end]
			c.head = head
			break
		}
		if len(buf) >= ownBuffer {
			return false, nil
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return false, err
		}
	}
	// Every LF of head ends a CRLF (wire.HeadEnd): the first LF ends the
	// request line, found by one byte, where a search for "\r\n" cost a
	// general substring search.
	lf := bytes.IndexByte(head, '\n')
	line, rest := head[:lf-1], head[lf+1:]
	if !bytes.HasSuffix(line, []byte(" HTTP/1.1")) || !c.o.takes(line) {
		return false, nil
	}
	// A plain head (head.go) meets every condition below: parsed now, it
	// is not walked twice.
	if c.lean, _ = parseLean(head, &c.template, &c.leanStore); c.lean != nil {
		return true, nil
	}
	hosts := 0
	for len(rest) > 2 {
		var field []byte
		field, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		if len(field) > 0 && (field[0] == ' ' || field[0] == '\t') {
			return false, nil // obs-fold: Go's server unfolds it, and says what it makes of it
		}
		name, _, _ := bytes.Cut(field, []byte(":"))
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")), bytes.EqualFold(name, []byte("Expect")):
			return false, nil
		case bytes.EqualFold(name, []byte("Host")):
			// Go's server wants exactly one (checkRequest judges it);
			// http.ReadRequest does not say how many there were.
			hosts++
		}
	}
	return hosts == 1, nil
}

// held returns a copy of the bytes the loop read and did not serve.
func (c *ownConn) held() []byte {
	n := c.br.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := c.br.Peek(n)
	return bytes.Clone(b)
}

// lend hands the connection to Go's server with the bytes held (and then
// readErr, the error the loop's last read got, if any), and waits until it
// gives it back (the bytes it read for the loop, ok) or closes it.
func (c *ownConn) lend(held []byte, readErr error) (back []byte, ok bool) {
	lc := &lent{conn: c.fc, o: c.o, held: held, readErr: readErr, back: make(chan []byte, 1), takes: c.o.takes}
	select {
	case c.o.lent <- lc:
	case <-c.o.closed:
		_ = c.fc.Close()
		return nil, false
	}
	back, ok = <-lc.back
	return back, ok
}

// lent is a connection lent to Go's server.
type lent struct {
	*conn
	o       *ownLoop
	held    []byte // what the loop read; after given, what Read read for the loop
	readErr error  // what the loop's last read got: Go's server's first read after held gets it
	takes   Own
	idle    atomic.Bool // Go's server waits for a next request (ConnState)
	given   atomic.Bool // Read gave the connection back (io.EOF)
	back    chan []byte // closed: closed by Go's server; a value: given back

	mu    sync.Mutex
	ended bool // Close was called
}

// Read gives Go's server the bytes the loop held, then reads the
// connection. When Go's server waits for a next request with nothing of the
// connection in its buffer (idle, and the scanner between two requests,
// every head it queued taken), the first bytes of that request decide: a
// request Own takes ends Go's serving (io.EOF, which it takes for a client
// gone quiet, and closes the connection without a word: Close then gives it
// back to the loop with those bytes).
func (c *lent) Read(p []byte) (int, error) {
	if len(c.held) > 0 {
		n := copy(p, c.held)
		c.held = c.held[n:]
		return n, nil
	}
	if err := c.readErr; err != nil {
		c.readErr = nil
		return 0, err
	}
	if !c.idle.Load() || !c.conn.between() {
		return c.conn.Read(p)
	}
	n, err := c.conn.Read(p)
	if n > 0 && err == nil && c.takes(p[:n]) {
		c.held = bytes.Clone(p[:n])
		c.given.Store(true)
		return 0, io.EOF
	}
	return n, err
}

// Close ends Go's serving: the connection goes back to the loop if Read
// gave it back (and the listener is open), and is closed otherwise. Go's
// server may call it twice (its Shutdown closes an idle connection, then
// the connection's own goroutine closes it).
func (c *lent) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil
	}
	c.ended = true
	if c.given.Load() && !c.o.closing() {
		c.back <- c.held
		return nil
	}
	err := c.conn.Close()
	close(c.back)
	return err
}

// between reports whether the scanner is between two requests and every
// head it queued was taken by a handler: no byte read from the connection
// is left for a request not yet served.
func (c *conn) between() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scan.state == scanStart && len(c.scan.queue) == 0
}

// serveOne reads the request at the start of the buffer (mine took it),
// serves it with the server's handler and answers; keep: the connection
// may carry the next request.
func (c *ownConn) serveOne() (keep bool) {
	srv, fc := c.o.srv, c.fc
	req, err := c.readRequest()
	if err != nil {
		// What Go's server writes for such a request; the connection's
		// Write sends the gateway's problem in its place (ownAnswer).
		text := "400 Bad Request"
		var bad badRequest
		if errors.As(err, &bad) {
			text += ": " + string(bad)
		}
		_, _ = fc.Write([]byte("HTTP/1.1 " + text + goErrorHeaders + text))
		return false
	}
	if srv.ReadTimeout > 0 {
		_ = fc.SetReadDeadline(time.Now().Add(srv.ReadTimeout))
	} else {
		_ = fc.SetReadDeadline(time.Time{})
	}
	if srv.WriteTimeout > 0 {
		_ = fc.SetWriteDeadline(time.Now().Add(srv.WriteTimeout))
	}

	w := &c.resp
	w.reset(c, req)
	panicked := true
	defer func() {
		if !panicked {
			return
		}
		v := recover()
		if v != http.ErrAbortHandler {
			const size = 64 << 10
			buf := make([]byte, size)
			buf = buf[:runtime.Stack(buf, false)]
			if srv.ErrorLog != nil {
				srv.ErrorLog.Printf("http: panic serving %v: %v\n%s", c.remoteAddr, v, buf)
			}
		}
		_ = c.bw.Flush() // as Go's server: what reached its buffer goes out, then the close
		keep = false
	}()
	handler := srv.Handler
	if handler == nil {
		handler = http.DefaultServeMux // as Go's server
	}
	handler.ServeHTTP(w, req)
	panicked = false
	keep = w.finish()
	_ = fc.SetWriteDeadline(time.Time{})
	fc.serving.Store(false) // the answer is written: Go's server's StateIdle
	return keep && !c.o.closing()
}

// readRequest reads the head mine took: parsed by the loop itself when it
// is plain (head.go), by http.ReadRequest and Go's server's checks
// otherwise.
func (c *ownConn) readRequest() (*http.Request, error) {
	if req := c.lean; req != nil {
		c.lean = nil
		_, _ = c.br.Discard(len(c.head))
		c.afterPost = req.Method == http.MethodPost
		return req, nil
	}
	req, err := http.ReadRequest(c.br)
	c.afterPost = err == nil && req.Method == http.MethodPost
	if err == nil {
		err = checkRequest(req)
	}
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = c.remoteAddr
	return req.WithContext(c.ctx), nil
}

// badRequest is a check of Go's server that a request failed, in its
// words.
type badRequest string

func (e badRequest) Error() string { return string(e) }

// checkRequest is what Go's server checks of a request http.ReadRequest
// parsed, before any handler (net/http's conn.readRequest). Host is
// req.Host (http.ReadRequest takes it out of the header; the target of a
// request the loop takes has no host of its own), and mine made sure there
// was exactly one.
func checkRequest(req *http.Request) error {
	if !httpguts.ValidHostHeader(req.Host) {
		return badRequest("malformed Host header")
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return badRequest("invalid header name")
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return badRequest("invalid header value")
			}
		}
	}
	return nil
}

// errWriter writes to the connection and notes a failed write: the
// connection is then not reused.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}
