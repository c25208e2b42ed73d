package gateway

// Request framing: refusing requests that carry both Content-Length and
// Transfer-Encoding.
//
// Go's HTTP/1 server frames such a request by its Transfer-Encoding and
// deletes Content-Length before any handler runs (net/http's fixLength, as
// RFC 9112 6.3 asks of an intermediary that forwards it), so a handler
// cannot tell that both were sent. A front proxy that framed the same bytes
// by Content-Length sees a different request boundary: the classic
// smuggling set-up. RFC 9112 6.3 lets a server refuse such a request, and
// the gateway does: 400 invalid_request and the connection closed, nothing
// forwarded.
//
// To see the header block as sent, Listener wraps each connection: its Read
// feeds the plaintext bytes Go's server reads to a small synchronous
// scanner (frameScanner) that finds each request's head, notes its framing
// fields and skips its Content-Length body. The facts of each head are
// queued on the connection, which handlers reach through
// http.Server.ConnContext; the framing middleware, the outermost handler,
// takes one entry per request (HTTP/1 requests on a connection are served
// one after the other, pipelined ones too) and refuses ambiguous ones. The
// scanner never buffers or changes bytes, costs a few nanoseconds per head
// byte and nothing per body byte.
//
// Fail closed: the entry must describe the request Go parsed (the same
// request line, byte for byte, and the same framing) or the request is
// refused. The scanner stops following a connection after a request with
// Transfer-Encoding (the gateway closes the connection after answering it),
// after anything it refuses, after a hijack and when its queue is full;
// every later request on that connection, if Go read one, would find no
// entry and be refused.

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Listener returns ln prepared to serve the gateway with srv: pass it to
// srv.Serve. Each connection's header blocks are scanned, so the gateway
// can refuse a request that carries both Content-Length and
// Transfer-Encoding, which Go's server would otherwise frame by the latter
// without telling it (see the top of this file). srv.Handler must pass
// every request to the Gateway (it checks one scanned head per request).
//
// With tlsConfig the listener terminates TLS itself (the scanner must see
// plaintext) and the gateway sets each request's TLS field, so
// X-Forwarded-Proto stays https. It serves HTTP/1.1 only: ALPN offers
// http/1.1 and srv.Protocols is set to HTTP/1 (also without TLS: no h2c).
//
// Listener also sets srv.ConnContext and srv.ConnState (keeping any hooks
// already there) and srv.DisableGeneralOptionsHandler, so that "OPTIONS *"
// reaches the gateway like every other request. It reads srv.MaxHeaderBytes,
// the header timeouts (which also bound the TLS handshake) and ErrorLog:
// set them first.
func Listener(srv *http.Server, ln net.Listener, tlsConfig *tls.Config) net.Listener {
	maxHeader := srv.MaxHeaderBytes
	if maxHeader <= 0 {
		maxHeader = http.DefaultMaxHeaderBytes
	}
	l := &framingListener{
		Listener: ln,
		// Go's server allows MaxHeaderBytes plus 4 KiB of slack, and bytes
		// already in its 4 KiB read buffer do not count: never stop before
		// Go would.
		maxHead:   maxHeader + 16<<10,
		hsTimeout: handshakeTimeout(srv),
		errorLog:  srv.ErrorLog,
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
		if fc, ok := c.(*framingConn); ok {
			ctx = context.WithValue(ctx, framingKey{}, fc)
		}
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		return ctx
	}
	connState := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if fc, ok := c.(*framingConn); ok && s == http.StateHijacked {
			// What follows is not HTTP/1 (an upgraded connection).
			fc.stop()
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

type framingKey struct{}

type framingListener struct {
	net.Listener
	tls       *tls.Config
	maxHead   int
	hsTimeout time.Duration
	errorLog  interface{ Printf(string, ...any) }
}

func (l *framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &framingConn{Conn: c, l: l}
	fc.scan.init(l.maxHead)
	if l.tls != nil {
		fc.tlsConn = tls.Server(c, l.tls)
		fc.Conn = fc.tlsConn
	}
	return fc, nil
}

// framingConn is one accepted connection as Go's server sees it: the TCP
// connection, or the TLS connection over it.
type framingConn struct {
	net.Conn
	l       *framingListener
	tlsConn *tls.Conn
	hsTried bool // Read only: Go's server never reads concurrently

	mu       sync.Mutex
	scan     frameScanner
	tlsState *tls.ConnectionState
}

func (c *framingConn) Read(p []byte) (int, error) {
	if c.tlsConn != nil && !c.hsTried {
		c.hsTried = true
		if err := c.handshake(); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.scan.feed(p[:n])
		c.mu.Unlock()
	}
	return n, err
}

// CloseWrite lets Go's server half-close before closing (its
// "rstAvoidance"), as it does with a bare TCP or TLS connection.
func (c *framingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// handshake runs the TLS handshake that Go's server would run itself for a
// *tls.Conn, bounded the same way, and keeps its state for the requests.
func (c *framingConn) handshake() error {
	ctx := context.Background()
	if c.l.hsTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.l.hsTimeout)
		defer cancel()
	}
	if err := c.tlsConn.HandshakeContext(ctx); err != nil {
		reason := err.Error()
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
			_ = re.Conn.Close()
			reason = "client sent an HTTP request to an HTTPS server"
		}
		if c.l.errorLog != nil {
			c.l.errorLog.Printf("http: TLS handshake error from %s: %v", c.RemoteAddr(), reason)
		}
		return err
	}
	st := c.tlsConn.ConnectionState()
	c.mu.Lock()
	c.tlsState = &st
	c.mu.Unlock()
	return nil
}

func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

func (c *framingConn) stop() {
	c.mu.Lock()
	c.scan.state = scanStopped
	c.mu.Unlock()
}

// next takes the scanned head of the request being served.
func (c *framingConn) next() (frameInfo, *tls.ConnectionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.scan.queue
	if len(q) == 0 {
		return frameInfo{}, c.tlsState, false
	}
	f := q[0]
	n := copy(q, q[1:])
	c.scan.queue = q[:n]
	return f, c.tlsState, true
}

// frameInfo is what the scanner saw in one request's head.
type frameInfo struct {
	lineHash uint64 // FNV-1a of the request line as Go's parser gets it
	lineLen  int
	length   int64 // the Content-Length value, if frameCL
	flags    uint8
	bad      string // why the gateway refuses the head, "" if it does not
	badField string // the field bad names
}

// Flags of frameInfo.
const (
	frameCL uint8 = 1 << iota // a Content-Length field
	frameTE                   // a Transfer-Encoding field
)

// Scanner states.
const (
	scanStart      uint8 = iota // before a request line
	scanLine                    // in the request line
	scanFieldStart              // at the start of a field line or of the empty line ending the head
	scanFieldCR                 // after a CR that starts a line
	scanName                    // in a field name
	scanLength                  // in a Content-Length value
	scanValue                   // in another field's value
	scanBody                    // in a Content-Length body
	scanStopped                 // not following the connection any more
)

// maxQueued bounds the heads scanned ahead of the handlers (pipelining):
// Go's server reads at most 4 KiB ahead, so only a hijacked connection
// would get near it.
const maxQueued = 32

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// priLine opens the HTTP/2 connection preface.
const priLine = "PRI * HTTP/2.0"

var priHash = func() uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(priLine); i++ {
		h = (h ^ uint64(priLine[i])) * fnvPrime
	}
	return h
}()

// frameScanner follows the requests in an HTTP/1 byte stream the way Go's
// server parses them (net/http readRequest, net/textproto), without
// buffering: lines end at LF, a CR right before it is dropped; after a POST
// up to 4 leading CR or LF bytes are skipped; a body is only ever framed by
// Content-Length here (a Transfer-Encoding head is the connection's last).
type frameScanner struct {
	state    uint8
	cr       bool  // the previous byte was a CR not yet known to end a line
	skipCRLF int   // CR/LF bytes Go skips before the next request line
	bodyLeft int64 // bytes of the Content-Length body still to come
	headLen  int   // bytes of the current head so far
	maxHead  int

	// The current head.
	cur    frameInfo
	method int // bytes of "POST " matched at the start of the line; -1: not a POST
	isPost bool

	// The current field line.
	nameLen      int
	notCL, notTE bool // the name so far is not content-length / transfer-encoding
	underscore   bool // the name has a '_' where those have '-'
	digits       int  // digits of a Content-Length value so far
	trailing     bool // whitespace after them

	queue []frameInfo // heads scanned, not yet taken by a handler
}

const (
	nameCL = "content-length"
	nameTE = "transfer-encoding"
)

func (s *frameScanner) init(maxHead int) {
	s.maxHead = maxHead
	s.state = scanStart
}

// feed follows p, the next bytes read from the connection.
func (s *frameScanner) feed(p []byte) {
	i := 0
	for i < len(p) {
		switch s.state {
		case scanStopped:
			return
		case scanBody:
			n := min(int64(len(p)-i), s.bodyLeft)
			s.bodyLeft -= n
			i += int(n)
			if s.bodyLeft == 0 {
				s.nextRequest()
			}
		case scanStart:
			if b := p[i]; s.skipCRLF > 0 && (b == '\r' || b == '\n') {
				s.skipCRLF--
				i++
				continue
			}
			s.skipCRLF = 0
			s.cur = frameInfo{lineHash: fnvOffset}
			s.method, s.isPost, s.cr, s.headLen = 0, false, false, 0
			s.state = scanLine
		case scanLine:
			j := bytes.IndexByte(p[i:], '\n')
			end := len(p)
			if j >= 0 {
				end = i + j + 1
			}
			if !s.count(end - i) {
				return
			}
			s.lineBytes(p[i:end])
			i = end
		case scanName:
			start := i
			for i < len(p) {
				b := p[i]
				if b == ':' || b == '\r' || b == '\n' || b == ' ' || b == '\t' {
					break
				}
				s.nameByte(b)
				i++
			}
			if !s.count(i - start) {
				return
			}
			if i < len(p) {
				if !s.count(1) {
					return
				}
				if p[i] != ':' {
					s.fail(fieldHeaders, "a malformed header field name")
					return
				}
				s.endName()
				i++
			}
		case scanValue:
			// Values are most of a head: jump to the line's end.
			j := bytes.IndexByte(p[i:], '\n')
			end := len(p)
			if j >= 0 {
				end = i + j + 1
				s.state = scanFieldStart
			}
			if !s.count(end - i) {
				return
			}
			i = end
		default:
			b := p[i]
			i++
			if !s.count(1) {
				return
			}
			switch s.state {
			case scanFieldStart:
				switch b {
				case '\n':
					s.endHead()
				case '\r':
					s.state = scanFieldCR
				case ' ', '\t':
					// RFC 9112 5.2 lets a server refuse obs-fold; a front
					// proxy may read a folded line as a field of its own.
					s.fail(fieldHeaders, "a header line starts with whitespace (obs-fold)")
					return
				default:
					s.nameLen, s.notCL, s.notTE, s.underscore = 0, false, false, false
					s.state = scanName
					s.nameByte(b)
				}
			case scanFieldCR:
				if b != '\n' {
					s.fail(fieldHeaders, "a header line starts with a CR")
					return
				}
				s.endHead()
			case scanLength:
				s.lengthByte(b)
			}
		}
	}
}

// count adds n bytes to the current head; false if it grew too large (the
// scanner then stopped).
func (s *frameScanner) count(n int) bool {
	if s.headLen += n; s.headLen > s.maxHead {
		s.fail(fieldHeaders, "the header block is too large")
		return false
	}
	return true
}

// lineBytes adds seg, a piece of the request line that ends at its LF if
// it has one, to the line's hash as Go's parser gets the line: without the
// LF and one CR right before it.
func (s *frameScanner) lineBytes(seg []byte) {
	ends := len(seg) > 0 && seg[len(seg)-1] == '\n'
	if ends {
		seg = seg[:len(seg)-1]
	}
	if s.cr && (len(seg) > 0 || !ends) {
		s.hashByte('\r') // the CR before this piece did not end the line
	}
	s.cr = false
	if n := len(seg); n > 0 && seg[n-1] == '\r' {
		seg = seg[:n-1]
		s.cr = !ends // known only once the next byte comes
	}
	for _, b := range seg {
		s.hashByte(b)
	}
	if ends {
		s.isPost = s.method == len("POST ")
		s.state = scanFieldStart
	}
}

func (s *frameScanner) hashByte(b byte) {
	s.cur.lineHash = (s.cur.lineHash ^ uint64(b)) * fnvPrime
	s.cur.lineLen++
	if s.method >= 0 && s.method < len("POST ") {
		if "POST "[s.method] == b {
			s.method++
		} else {
			s.method = -1
		}
	}
}

func (s *frameScanner) nameByte(b byte) {
	c := b
	if 'A' <= c && c <= 'Z' {
		c += 'a' - 'A'
	}
	if c == '_' {
		s.underscore, c = true, '-'
	}
	i := s.nameLen
	s.notCL = s.notCL || i >= len(nameCL) || nameCL[i] != c
	s.notTE = s.notTE || i >= len(nameTE) || nameTE[i] != c
	s.nameLen++
}

func (s *frameScanner) endName() {
	isCL := !s.notCL && s.nameLen == len(nameCL)
	isTE := !s.notTE && s.nameLen == len(nameTE)
	switch {
	case (isCL || isTE) && s.underscore:
		// Go takes Content_Length for another field; some proxies do not.
		s.fail(fieldFraming, "a header field name like these with '_' for '-'")
	case isCL && s.cur.flags&frameCL != 0:
		s.fail("Content-Length", "more than one such field")
	case isCL:
		s.cur.flags |= frameCL
		s.digits, s.trailing, s.cr = 0, false, false
		s.state = scanLength
	case isTE:
		s.cur.flags |= frameTE
		s.state = scanValue
	default:
		s.state = scanValue
	}
}

// lengthByte follows a Content-Length value: optional whitespace, decimal
// digits that fit an int64, optional whitespace (what Go's parser accepts).
func (s *frameScanner) lengthByte(b byte) {
	if s.cr && b != '\n' {
		s.fail("Content-Length", "a CR inside the value")
		return
	}
	switch {
	case b == '\r':
		s.cr = true
	case b == '\n':
		s.cr = false
		if s.digits == 0 {
			s.fail("Content-Length", "empty")
			return
		}
		s.state = scanFieldStart
	case b == ' ' || b == '\t':
		s.trailing = s.digits > 0
	case '0' <= b && b <= '9' && !s.trailing:
		d := int64(b - '0')
		if s.cur.length > (math.MaxInt64-d)/10 {
			s.fail("Content-Length", "too large")
			return
		}
		s.cur.length = s.cur.length*10 + d
		s.digits++
	default:
		s.fail("Content-Length", "not one decimal number")
	}
}

func (s *frameScanner) endHead() {
	if !s.push(s.cur) {
		return
	}
	switch {
	case s.cur.flags&frameTE != 0:
		// The gateway closes the connection after this request (or refuses
		// it): nothing after it is read as a request.
		s.state = scanStopped
	case s.cur.lineHash == priHash && s.cur.lineLen == len(priLine):
		// The HTTP/2 preface: net/http reads no request after it.
		s.state = scanStopped
	case s.cur.flags&frameCL != 0 && s.cur.length > 0:
		s.bodyLeft = s.cur.length
		s.state = scanBody
	default:
		s.nextRequest()
	}
}

func (s *frameScanner) nextRequest() {
	s.state = scanStart
	s.skipCRLF = 0
	if s.isPost {
		s.skipCRLF = 4 // net/http: RFC 7230 section 3 tolerance for old buggy clients
	}
}

// fail records what is wrong with the current head (the gateway refuses
// it, if Go does not first) and stops following the connection.
func (s *frameScanner) fail(field, reason string) {
	s.cur.badField, s.cur.bad = field, reason
	s.push(s.cur)
	s.state = scanStopped
}

func (s *frameScanner) push(f frameInfo) bool {
	if len(s.queue) >= maxQueued {
		s.state = scanStopped
		return false
	}
	s.queue = append(s.queue, f)
	return true
}

// requestLineHash is the FNV-1a hash frameScanner computes for r's request
// line ("METHOD REQUEST-URI PROTO", which net/http splits at its first two
// spaces).
func requestLineHash(r *http.Request) (uint64, int) {
	h := uint64(fnvOffset)
	for _, s := range [...]string{r.Method, " ", r.RequestURI, " ", r.Proto} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * fnvPrime
		}
	}
	return h, len(r.Method) + len(r.RequestURI) + len(r.Proto) + 2
}

// framing is the outermost middleware: it takes the scanned head of each
// request on a connection from Listener and refuses requests whose framing
// is ambiguous, or could not be checked, with 400 and Connection: close.
// Requests framed by Transfer-Encoding are answered with Connection: close
// in any case, so bytes a front proxy framed differently are never read as
// a next request (RFC 9112 6.3). Without Listener (a test server, an
// embedder) only that last rule applies.
func (g *Gateway) framing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fc, _ := r.Context().Value(framingKey{}).(*framingConn)
		if fc == nil {
			if len(r.TransferEncoding) > 0 {
				w.Header().Set("Connection", "close")
			}
			next.ServeHTTP(w, r)
			return
		}
		f, tlsState, ok := fc.next()
		if field, detail := g.checkFraming(f, ok, r); field != "" {
			g.refuseFraming(w, r, field, detail)
			return
		}
		if f.flags&frameTE != 0 {
			w.Header().Set("Connection", "close")
		}
		if tlsState != nil && r.TLS == nil {
			r2 := *r
			r2.TLS = tlsState
			r = &r2
		}
		next.ServeHTTP(w, r)
	})
}

// Fields named by framing refusals.
const (
	fieldFraming = "Content-Length, Transfer-Encoding"
	fieldHeaders = "headers"
)

// checkFraming returns the field and detail of r's refusal, or "" if the
// request may go on.
func (g *Gateway) checkFraming(f frameInfo, ok bool, r *http.Request) (field, detail string) {
	const unverified = "the request's framing could not be verified"
	if !ok {
		return fieldHeaders, unverified
	}
	if h, n := requestLineHash(r); h != f.lineHash || n != f.lineLen {
		g.log.Warn("request framing: the scanned head does not match the request; refused",
			"method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		return fieldHeaders, unverified
	}
	if f.bad != "" {
		return f.badField, f.bad
	}
	cl, te := f.flags&frameCL != 0, f.flags&frameTE != 0
	switch {
	case cl && te:
		return fieldFraming, "a request must not carry both (RFC 9112 6.3)"
	case te && !r.ProtoAtLeast(1, 1):
		return "Transfer-Encoding", "not allowed in an HTTP/1.0 request (RFC 9112 6.1)"
	case te != (len(r.TransferEncoding) > 0), !te && r.ContentLength != f.length && !h2Preface(r):
		// The scanner and Go's parser disagree: never guess.
		g.log.Warn("request framing: the scanned framing does not match the request; refused",
			"method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		return fieldHeaders, unverified
	}
	return "", ""
}

// h2Preface: net/http hands "PRI * HTTP/2.0" to handlers with an unknown
// length and closes the connection after it.
func h2Preface(r *http.Request) bool {
	return r.Method == "PRI" && r.RequestURI == "*" && r.ProtoMajor == 2 && r.ContentLength == -1
}

// refusalLinger is how long a refused request's connection may still be
// read before it is closed (net/http waits as long before closing one whose
// body was too large).
const refusalLinger = 500 * time.Millisecond

// refuseFraming answers 400 invalid_request and closes the connection.
func (g *Gateway) refuseFraming(w http.ResponseWriter, r *http.Request, field, detail string) {
	if strings.HasPrefix(r.URL.Path, proxyPrefix) {
		g.obs.write(outcomeBadRequest)
	}
	w.Header().Set("Connection", "close")
	// net/http may still read up to 256 KiB of the unread body before it
	// closes the connection. Let it, briefly: what it reads is not left in
	// the socket to turn the close into a reset that could cost the client
	// this answer, and a client that stalls (one waiting for 100 Continue)
	// does not hold the connection.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refusalLinger))
	writeProblem(w, r, g.log, &tokens.Error{Kind: errRequest, Field: field,
		Detail: detail + "; nothing was forwarded and the connection is closed"})
}
