package framing

// The listener: it wraps each accepted connection so that the scanner
// (scan.go) sees the plaintext bytes Go's server reads, and hands each
// request its scanned head (Check, framing.go).

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Listener returns ln prepared to serve srv: pass it to srv.Serve. Each
// connection's header blocks are scanned, so that a handler can refuse a
// request that carries both Content-Length and Transfer-Encoding, which
// Go's server would otherwise frame by the latter without telling it (see
// the package comment). srv.Handler must call Check once for every request
// (each call takes one scanned head).
//
// With tlsConfig the listener terminates TLS itself (the scanner must see
// plaintext) and Check returns each request's TLS state, so that the
// handler can set the request's TLS field (X-Forwarded-Proto stays
// https). It serves HTTP/1.1 only: ALPN offers http/1.1 and srv.Protocols
// is set to HTTP/1 (also without TLS: no h2c).
//
// Listener also sets srv.ConnContext and srv.ConnState (keeping any hooks
// already there) and srv.DisableGeneralOptionsHandler, so that "OPTIONS *"
// reaches the handler like every other request. It reads srv.MaxHeaderBytes,
// the header timeouts (which also bound the TLS handshake) and ErrorLog:
// set them first.
//
// refuse renders the whole HTTP/1.1 answer (status line, header, body) that
// replaces the plain-text answer Go's server writes itself, before any
// handler, for a request it cannot take (see ownAnswer): status is 431
// for a head too large (Go's 431), 417 for an expectation other than
// 100-continue (Go's 417), else 400 (Go's 400, and its 501 for an
// unsupported Transfer-Encoding and 505 for an HTTP version it does not
// speak, which are the client's fault too), and 400 with no field for a
// plain HTTP request to the TLS port (tls.go); nil: a bare problem.
//
// With own, the listener serves the requests own takes itself, and lends
// Go's server the rest (own.go): pass the listener to srv.Serve all the
// same, and call its Shutdown after srv.Shutdown.
func Listener(srv *http.Server, ln net.Listener, tlsConfig *tls.Config, refuse func(status int, field, reason string) []byte, own Own) ServingListener {
	maxHeader := srv.MaxHeaderBytes
	if maxHeader <= 0 {
		maxHeader = http.DefaultMaxHeaderBytes
	}
	l := &listener{
		Listener: ln,
		// Go's server allows MaxHeaderBytes plus 4 KiB of slack, and bytes
		// already in its 4 KiB read buffer do not count: never stop before
		// Go would.
		maxHead:   maxHeader + 16<<10,
		hsTimeout: handshakeTimeout(srv),
		errorLog:  srv.ErrorLog,
		refuse:    refuse,
	}
	if l.refuse == nil {
		l.refuse = bareRefusal
	}
	if own != nil {
		l.own = newOwnLoop(srv, own)
	}
	if tlsConfig != nil {
		l.tls = tlsConfig.Clone()
		l.tls.NextProtos = []string{"http/1.1"}
	}
	var p http.Protocols
	p.SetHTTP1(true)
	srv.Protocols = &p
	srv.DisableGeneralOptionsHandler = true
	connContext := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if lc, ok := c.(*lent); ok {
			c = lc.conn
		}
		if fc, ok := c.(*conn); ok {
			ctx = context.WithValue(ctx, connKey{}, fc)
		}
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		return ctx
	}
	connState := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if lc, ok := c.(*lent); ok {
			lc.idle.Store(s == http.StateIdle)
			c = lc.conn
		}
		if fc, ok := c.(*conn); ok {
			switch s {
			case http.StateHijacked:
				// What follows is not HTTP/1 (an upgraded connection).
				fc.hijacked.Store(true)
				fc.stop()
			case http.StateIdle:
				// The handler's answer is written in whole: what Go's
				// server writes before the next handler may be its own.
				fc.serving.Store(false)
			}
		}
		if connState != nil {
			connState(c, s)
		}
	}
	return l
}

// handshakeTimeout is what Go's server would allow a TLS handshake: the
// least of its read-header, read and write timeouts that are set.
func handshakeTimeout(srv *http.Server) time.Duration {
	var d time.Duration
	for _, t := range []time.Duration{srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout} {
		if t > 0 && (d == 0 || t < d) {
			d = t
		}
	}
	return d
}

type connKey struct{}

// ServingListener is the listener Listener returns: pass it to
// http.Server.Serve. Shutdown waits for the requests its own loop serves
// (Go's server's Shutdown waits for the others): call it after the
// server's Shutdown, which closes the listener. Abort is Close for the own
// loop's busy connections too: call it with the server's Close when a
// graceful Shutdown ran out of time, then Shutdown again to wait for the
// handlers it cut short.
type ServingListener interface {
	net.Listener
	Shutdown(ctx context.Context) error
	Abort()
}

type listener struct {
	net.Listener
	own       *ownLoop // nil: Go's server serves every connection
	tls       *tls.Config
	maxHead   int
	hsTimeout time.Duration
	errorLog  interface{ Printf(string, ...any) }
	refuse    func(status int, field, reason string) []byte
}

func (l *listener) Accept() (net.Conn, error) {
	if l.own != nil {
		return l.acceptOwn()
	}
	c, err := l.acceptConn()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes the listener; the own loop's connections stop keep-alive.
func (l *listener) Close() error {
	err := l.Listener.Close()
	if l.own != nil {
		l.own.close()
	}
	return err
}

// Abort closes the listener and every connection its own loop serves,
// busy ones too, as http.Server.Close closes Go's server's (a close only
// stops the loop's keep-alive): a handler waiting for its body sees the
// read fail (within lingerTime: the close lingers), one writing its answer
// the write fail. The connections Go's server serves are its Close's.
func (l *listener) Abort() {
	_ = l.Close()
	if l.own != nil {
		l.own.abort()
	}
}

func (l *listener) acceptConn() (*conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &conn{Conn: c, tcp: c, l: l}
	fc.scan.init(l.maxHead)
	if l.tls != nil {
		fc.tlsConn = tls.Server(c, l.tls)
		fc.Conn = fc.tlsConn
	}
	return fc, nil
}

// conn is one accepted connection as Go's server sees it: the TCP
// connection, or the TLS connection over it.
type conn struct {
	net.Conn
	tcp     net.Conn // the accepted connection, under TLS if any
	l       *listener
	tlsConn *tls.Conn
	hsTried bool // Read only: Go's server never reads concurrently

	closed     atomic.Bool // Close was called
	halfClosed atomic.Bool // CloseWrite was called (net/http's own linger)
	hijacked   atomic.Bool // its hijacker closes it as it likes
	// serving: a handler took a request (Check) and its answer may still
	// be written; no write is then taken for Go's own answer, whatever
	// its bytes (a body that happens to start like one).
	serving atomic.Bool

	mu       sync.Mutex
	scan     scanner
	tlsState *tls.ConnectionState
	dl       lazyDeadlines // deadlines not yet on the socket (deadline.go)
}

func (c *conn) Read(p []byte) (int, error) {
	c.begin(true) // the deadline last set (deadline.go)
	if c.tlsConn != nil && !c.hsTried {
		c.hsTried = true
		if err := c.handshake(); err != nil {
			c.mu.Lock()
			c.dl.read.busy--
			c.mu.Unlock()
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.dl.read.busy--
	if n > 0 {
		c.scan.feed(p[:n])
	}
	c.mu.Unlock()
	return n, err
}

// Write writes p, unless p is an answer Go's server wrote itself, before
// any handler: in plain text (ownAnswer), or its 417 to an expectation
// other than 100-continue (expectationFailed). Then the gateway's problem
// goes out in its place: 431 for Go's 431, 417 for its 417, else 400.
// Every other write (the handlers' answers) only pays for a flag.
func (c *conn) Write(p []byte) (int, error) {
	c.begin(false) // the deadline last set (deadline.go)
	defer c.endWrite()
	if c.serving.Load() {
		return c.Conn.Write(p)
	}
	var code int
	var field, reason string
	if status, text, ok := ownAnswer(p); ok {
		code = http.StatusBadRequest
		if status == http.StatusRequestHeaderFieldsTooLarge {
			code = status
		}
		field, reason = c.refusal(status, text)
	} else if expectationFailed(p) {
		code, field, reason = http.StatusExpectationFailed, "Expect", "an expectation this server does not meet (only 100-continue is; RFC 9110 10.1.1)"
	} else {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(c.l.refuse(code, field, reason)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// expectationFailed reports whether p, written while no handler is serving
// (so by Go's server itself), is its 417 to an expectation other than
// 100-continue (net/http's sendExpectationFailed). It goes through the
// response writer, with a Date, so its bytes alone do not tell it from a
// handler's: the serving flag does.
func expectationFailed(p []byte) bool {
	return bytes.HasPrefix(p, []byte("HTTP/1.1 417 Expectation Failed\r\n"))
}

// refusal says what is wrong with the request Go's server refused with
// status: what the scanner found, if it refused the head Go parsed next,
// else Go's own words.
func (c *conn) refusal(status int, text string) (field, reason string) {
	c.mu.Lock()
	if q := c.scan.queue; len(q) > 0 && q[0].bad != "" {
		field, reason = q[0].badField, q[0].bad
	}
	c.mu.Unlock()
	// Go's words: "431 Request Header Fields Too Large", "400 Bad
	// Request" (a head it could not parse), or "400 Bad Request: " and
	// what is wrong ("missing required Host header", "invalid header
	// name", ...).
	_, said, _ := strings.Cut(text, ": ")
	switch {
	case status == http.StatusRequestHeaderFieldsTooLarge:
		return fieldHeaders, "too large (net/http: " + text + ")"
	case reason != "":
		return field, reason
	case status == http.StatusNotImplemented:
		return "Transfer-Encoding", "only a single \"chunked\" is accepted (RFC 9112 6.1)"
	case status == http.StatusHTTPVersionNotSupported:
		return "HTTP-version", "not one this server speaks (HTTP/1.0 or HTTP/1.1)"
	case said == "":
		return fieldHeaders, "not a request net/http can parse (a malformed request line or header line; net/http: " + text + ")"
	case strings.Contains(said, "Host header"):
		return "Host", "net/http: " + said
	}
	return fieldHeaders, "net/http: " + said
}

// goErrorHeaders is the header every answer that Go's server writes itself
// carries after its status line (net/http server.go, errorHeaders); the
// answers of handlers always carry a Date, so they never look like this.
const goErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// ownAnswer reports whether p is a whole 4xx or 5xx answer Go's server
// wrote itself for a request it would not take, and its status and text.
// A handler's answer is told apart by its first nine bytes unless it is a
// 4xx or 5xx too, and then by the header that follows its status line
// (and by the conn's serving flag before that).
func ownAnswer(p []byte) (status int, text string, ok bool) {
	const prefix = "HTTP/1.1 "
	if len(p) < len(prefix)+3 || string(p[:len(prefix)]) != prefix {
		return 0, "", false
	}
	d := p[len(prefix) : len(prefix)+3]
	if d[0] != '4' && d[0] != '5' || d[1] < '0' || d[1] > '9' || d[2] < '0' || d[2] > '9' {
		return 0, "", false
	}
	end := bytes.Index(p, []byte("\r\n"))
	if end < 0 || !bytes.HasPrefix(p[end:], []byte(goErrorHeaders)) {
		return 0, "", false
	}
	return int(d[0]-'0')*100 + int(d[1]-'0')*10 + int(d[2]-'0'), string(p[end+len(goErrorHeaders):]), true
}

// bareRefusal is a problem without the gateway's type URIs, for a
// Listener given none.
func bareRefusal(status int, field, reason string) []byte {
	if field != "" {
		reason = field + ": " + reason
	}
	body, _ := json.Marshal(map[string]any{"title": http.StatusText(status), "status": status, "detail": reason})
	return []byte("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) +
		"\r\nContent-Type: application/problem+json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
}

// CloseWrite lets Go's server half-close before closing (its
// "rstAvoidance"), as it does with a bare TCP or TLS connection.
func (c *conn) CloseWrite() error {
	c.halfClosed.Store(true)
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close closes the connection, without a reset that would lose the
// answer: see linger. A lingering close happens in a goroutine of its own,
// and Close returns at once: Server.Close closes the active connections one
// after another, and must not wait lingerTime for each.
func (c *conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil // closed already, or lingering towards it
	}
	if !c.halfClosed.Load() && !c.hijacked.Load() && (c.midRequest() || unreadBytes(c.tcp)) {
		go func() {
			c.linger()
			_ = c.Conn.Close()
		}()
		return nil
	}
	return c.Conn.Close()
}

// midRequest reports whether the client may still be sending a request:
// the scanner is not between two requests (it is in a head or a body, or
// stopped following the connection: after a Transfer-Encoding head or a
// head it refused). Held for the loop (scanner.hold) with nothing read,
// it is between two.
func (c *conn) midRequest() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.scan
	return s.state != scanStart && (s.state != scanHeld || s.held > 0)
}

// A lingering close reads and drops at most lingerBytes for at most
// lingerTime: net/http's own figures (maxPostHandlerReadBytes, what its
// server reads of a body a handler left; rstAvoidanceDelay, how long its
// closeWriteAndWait waits).
const (
	lingerBytes = 256 << 10
	lingerTime  = 500 * time.Millisecond
)

// linger ends the gateway's side of a connection that holds bytes nobody
// read, or is closed in the middle of a request, before it is closed. Go's server answers a request it cannot parse
// (a request line with a space in its target, a header line without a
// colon, no Host) itself, before any handler, and closes the connection at
// once. A close with unread bytes in the socket is a TCP reset (RFC 9293
// 3.6.1), and the client's kernel drops what it had not read yet: the
// client loses the 400 and sees "connection reset by peer" instead
// (docs/design.md, guarantee 8: bad input gets a 4xx, never a reset). After the answers of
// handlers, net/http half-closes and waits (closeWriteAndWait, and then
// halfClosed is set and this does nothing); after the ones it sends before
// them, it does not. So here the gateway says it is done writing (TLS
// close_notify, then FIN: the client reads the answer to its end) and
// reads and drops what the client still sends until it stops, lingerTime
// passes or lingerBytes came; only then is the connection closed.
// A connection closed between requests (keep-alive's end, an idle
// timeout) costs one non-blocking peek (unreadBytes) and closes at once;
// a hijacked one is its hijacker's.
func (c *conn) linger() {
	// First: it also bounds a Read of Go's server blocked meanwhile (which
	// holds the read lock; a Server.Close in the middle of a handler).
	// The close_notify below goes out under the write deadline last set.
	c.settle()
	_ = c.tcp.SetReadDeadline(time.Now().Add(lingerTime))
	c.mu.Lock()
	c.dl.read.on.Forget() // set here past the lazy deadlines
	c.mu.Unlock()
	if c.tlsConn != nil {
		_ = c.tlsConn.CloseWrite() // fails harmlessly before a handshake
	}
	if cw, ok := c.tcp.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	var buf [4 << 10]byte
	for n := 0; n < lingerBytes; {
		m, err := c.tcp.Read(buf[:])
		n += m
		if err != nil {
			return
		}
	}
}

func (c *conn) stop() {
	c.mu.Lock()
	c.scan.state = scanStopped
	c.mu.Unlock()
}

// next takes the scanned head of the request being served: HTTP/1
// requests on a connection are served one after the other, pipelined ones
// too, so the first head queued is its own. For a head with
// Transfer-Encoding (always the last the scanner queues) it also returns
// why its chunked body is malformed, if the bytes read so far show it.
func (c *conn) next() (h head, tlsState *tls.ConnectionState, badBody string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.scan.queue
	if len(q) == 0 {
		return head{}, c.tlsState, "", false
	}
	f := q[0]
	n := copy(q, q[1:])
	c.scan.queue = q[:n]
	if f.flags&hasTE != 0 && n == 0 {
		badBody = c.scan.chunk.bad
	}
	return f, c.tlsState, badBody, true
}
