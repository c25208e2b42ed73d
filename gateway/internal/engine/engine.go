// Package engine is the gateway's forwarding engine: the one road every
// fenced write takes to its upstream (Transport.Exchange, called by the
// gateway's direct forward), and the check of a write's fence before each
// write that carries its bytes (sendcheck.go). In this package "the
// Transport" is net/http's http.Transport, whose configuration the engine
// takes and whose behaviour it keeps; the engine's own type is Transport,
// named as net/http names its own.
//
// net/http's Transport gives every upstream connection two goroutines (one writes
// requests, one reads responses) and hands each request and each response
// across them through channels: four goroutine switches and a few
// allocations per write that, by the profile in docs/benchmarks.md, cost
// more than everything the gateway checks. The engine writes the request
// and reads the answer on the calling goroutine, over a pool of keep-alive
// HTTP/1.1 connections per upstream.
//
// It parses as little as it can itself. The response is read by net/http's
// ReadResponse, with the Transport's head size limit, except the common
// answer (HTTP/1.1, a final status, plain header fields, a body framed by
// Content-Length or none): readAnswer (read.go) parses that one's head in
// the connection's buffer and frames its body itself, without
// ReadResponse's allocations, and steps aside for every other answer, held
// to ReadResponse's Response, body and connection state by
// TestReadAnswerMatchesReadResponse and FuzzReadAnswer. The request is
// serialised by net/http's own Request.Write (the function the Transport
// uses, so the bytes are the same, Host, Content-Length, chunked framing
// and trailer and all), except the head of a request with no body or one
// in memory: writeHead (write.go) writes that one without Request.Write's
// allocations, held to Request.Write's bytes by
// TestWriteHeadMatchesRequestWrite and FuzzWriteHead. What the engine adds
// is the connection's life:
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
//   - The exchange's context ending aborts a blocked read or write through
//     the connection's deadline. A context that cannot end (the gateway's:
//     a write is carried to its answer when its client goes away) costs
//     nothing: no abort is registered.
//   - Hooks.WroteHeaders reports the moment the Transport's ClientTrace
//     would, so the drain rule sees the same "the request left" moment;
//     1xx answers go to Hooks.Got1xx as the Transport's go to
//     Got1xxResponse, at most max1xx of them, and all the heads of an
//     answer, 1xx and final, within one MaxResponseHeaderBytes (heard1xx).
//
// It carries bodies in memory and bodies that stream (Content-Length or
// chunked, with trailers; Expect: 100-continue: expect.go), to http and
// https upstreams (TLS over its own connections, as the Transport's
// configuration says). Upgrades and CONNECT, which the gateway refuses
// before, it does not carry.
//
// The engine knows the gateway's writes only as Write, an interface it
// defines: it imports nothing of the gateway.
package engine

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/coarse"
	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// Write is one fenced write as the engine sees it: what it needs of the
// gateway's record of the write, which the gateway implements. The
// methods are called on the goroutine that writes the request.
type Write interface {
	// Body is the request's whole body if it was read into memory before
	// the forward, nil if it streams. A body in memory goes out with the
	// head in one write; one that streams is the request's Body, framed
	// and copied by Request.Write after the head.
	Body() []byte
	// CheckSend is called before each write system call that carries bytes
	// of the request: nil if the write's fence is still provably held. An
	// error stops the send: nothing more of the request is written, the
	// connection is reset (see sendcheck.go) and the exchange fails. It may
	// block, up to the write's own deadline (tokens.Held.Check waits for a
	// slow session check): the engine calls it from the Write of a
	// connection that carries this exchange alone, on the goroutine that
	// writes the request, with no lock held, so a proof that waits holds
	// up no other write.
	CheckSend() error
	// Sent tells that n bytes of the request went to the kernel (n may
	// be 0): from then on, a failure leaves the outcome unknown.
	Sent(n int)
	// Lost returns a channel that is closed once the write's fence is
	// definitely lost (CheckSend then fails at once, and for good); nil if
	// it cannot be lost. The engine watches it while a request is
	// half-sent, however long its body keeps it so (sendcheck.go). Called
	// once per exchange whose body streams, never for a body in memory.
	Lost() <-chan struct{}
	// Halt is called, on a watch's goroutine, once the watch has reset a
	// half-sent request on its lost fence, or once the upstream answered
	// a half-sent request and its body stalled (answerwatch.go): a read of
	// the request's body that waits (a client gone quiet mid-body) is to
	// fail now, so that the exchange ends and its client is answered at
	// once, not when it sends again. The exchange then fails on the fence,
	// or reads the upstream's answer, whatever error that read returns.
	Halt()
}

// Transport carries the gateway's fenced writes to their upstreams
// (Exchange), over its own pool of connections.
type Transport struct {
	std         *http.Transport // its configuration (New)
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle     int           // idle connections kept per upstream
	idleTimeout time.Duration // an idle connection older than this is closed

	mu   sync.Mutex
	idle map[upstreamKey]*idleList
	// last is the list looked up last, and its key: a write's get and
	// put find their upstream's list by a compare of its host (most often
	// the very string), where the map hashes the key (about 190
	// instructions each).
	last    *idleList
	lastKey upstreamKey
}

// list returns the idle list of key, made if create is set (else nil if it
// has none). Called with e.mu held.
func (e *Transport) list(key upstreamKey, create bool) *idleList {
	if e.last != nil && e.lastKey == key {
		return e.last
	}
	idle := e.idle[key]
	if idle == nil {
		if !create {
			return nil
		}
		idle = new(idleList)
		e.idle[key] = idle
	}
	e.last, e.lastKey = idle, key
	return idle
}

// idleList is an upstream's idle connections, most recent last. The map
// holds a pointer, so that taking and giving back a connection changes
// the list in place: an assignment to a map of struct keys, twice a
// write, cost more than the rest of get and put.
type idleList struct{ conns []*engineConn }

// upstreamKey names the upstream of a connection: its URL's host, and
// whether it speaks TLS.
type upstreamKey struct {
	host string // as in the URL, with or without a port
	tls  bool
}

// New returns a Transport configured as std (which it never hands a
// request): it dials through std.DialContext (read at each dial), speaks
// TLS to https upstreams by std.TLSClientConfig within
// std.TLSHandshakeTimeout, keeps std.MaxIdleConnsPerHost idle connections
// per upstream for std.IdleConnTimeout, allows the heads of an answer (its
// 1xx and its final head) std.MaxResponseHeaderBytes in all and waits std.ExpectContinueTimeout for 100
// Continue (read at each exchange), as std would.
func New(std *http.Transport) *Transport {
	return &Transport{
		std: std,
		dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if std.DialContext == nil {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
			return std.DialContext(ctx, network, addr)
		},
		maxIdle:     std.MaxIdleConnsPerHost,
		idleTimeout: std.IdleConnTimeout,
		idle:        map[upstreamKey]*idleList{},
	}
}

// maxHead is the response head bytes allowed, the Transport's limit.
func (e *Transport) maxHead() int64 {
	if n := e.std.MaxResponseHeaderBytes; n > 0 {
		return n
	}
	return 10 << 20 // the Transport's default
}

// inMemory reports whether req, which carries w, has no body or the whole
// of it in memory (w.Body()), and no trailer: writeHead's requests.
func inMemory(req *http.Request, w Write) bool {
	if len(req.TransferEncoding) > 0 || req.Trailer != nil {
		return false
	}
	return req.ContentLength == 0 || w.Body() != nil && req.ContentLength == int64(len(w.Body()))
}

// Hooks are the ears on an exchange (the gateway's direct forward's), in
// place of a ClientTrace in the request's context, which would cost a
// context per request.
type Hooks interface {
	// WroteHeaders: the request's head was written to the connection's
	// buffer (the moment ClientTrace.WroteHeaders reports in the
	// Transport), the one report of it: from then on the upstream may
	// act on the request.
	WroteHeaders()
	// Got1xx: an informational answer came before the final one.
	Got1xx(code int, header textproto.MIMEHeader) error
	// AnswerHeader is an empty map the final answer's header may be read
	// into, its hop-by-hop fields removed (and those its Connection field
	// names), or nil. A proxy passes the client's own header: the answer
	// is then relayed without a copy of its fields from map to map. The
	// common answer is read into it (read.go, readHead); any other has a
	// map of its own, with its hop-by-hop fields, and leaves it empty.
	AnswerHeader() http.Header
	// AnswerFields is a list the fields read into AnswerHeader's map may
	// also be listed in, in the order of the answer's head, each name
	// once with the map's values, or nil. The engine lists them for the
	// common answer (known names, none repeated, none hop-by-hop) and
	// leaves it empty otherwise: a writer of the answer's head then walks
	// the list, not the map.
	AnswerFields() *wire.Fields
}

// Exchange writes req, whose header is fields (req.Header is not read)
// and which carries w (its body is w.Body() if that is
// not nil, req.Body if it streams), on a connection to its upstream
// (req.URL: http or https), and reads the answer's head; the body is read
// through the returned response, which must be closed once, and neither
// the response's body nor its Header map used after (both may be the
// connection's, lent; the Header's value slices are the answer's own). ctx ending aborts
// it (at any point until the body is closed), and so does deadline, if
// set (a deadline on the connection: no timer of its own); the error then
// says which (context.Cause(ctx), or context.DeadlineExceeded). hooks hear
// the head leave and the 1xx answers. Every write of req's bytes is
// checked against w's fence first (w.CheckSend). req must not be CONNECT
// nor ask for an Upgrade (the gateway refuses both before).
func (e *Transport) Exchange(ctx context.Context, req *http.Request, fields wire.Fields, w Write, deadline time.Time, hooks Hooks) (*http.Response, error) {
	key := upstreamKey{host: req.URL.Host, tls: req.URL.Scheme == "https"}
	expect := expectsContinue(req, fields)
	// A request held whole on a plain connection is sent inside the wait
	// for its answer, its connection checked there (await_*.go).
	whole := !key.tls && req.Host == "" && !expect && inMemory(req, w)
	c, reused, err := e.get(ctx, key, deadline, whole)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	c.setDeadline(deadline)
	c.into, c.intoList = hooks.AnswerHeader(), hooks.AnswerFields()
	// A context that ends unblocks the connection's I/O at once. (No
	// cheaper registration that keeps the abort immediate was found: a
	// watcher goroutine per connection would cost the goroutine switches
	// this engine exists to avoid.)
	stop := neverAborted
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, c.abort)
	}
	c.fw, c.writeFailed = w, false
	// The answer's heads, 1xx and final, share one budget of bytes
	// (heard1xx).
	c.limit, c.infos = e.maxHead()+int64(c.br.Size()), 0
	fail := func(err error) (*http.Response, error) { return nil, c.failed(ctx, stop, deadline, err) }
	var cb *continueBody
	if expect {
		// The body waits for the upstream's leave (expect.go).
		cb = &continueBody{ReadCloser: req.Body, ctx: ctx, c: c, e: e, deadline: deadline, got1xx: hooks.Got1xx}
		r2 := *req
		r2.Body = cb
		req, cb.req = &r2, &r2
	}
	var watch *fenceWatch
	var early *answerWatch
	awaited, headOK := false, false
	switch {
	case c.host != nil && whole:
		// Request.Write's bytes without its allocations (write.go).
		if err = writeHead(c.bw, req, fields, c.host, &c.order); err == nil {
			headOK = true
			_, err = c.bw.Write(w.Body())
		}
		awaited = true
	default:
		if cb != nil || !inMemory(req, w) {
			// The request may stay half-sent, for as long as its body
			// (or the upstream's leave) keeps it: its fence is watched
			// meanwhile (sendcheck.go).
			watch = watchFence(w, c.tcp)
		}
		if cb == nil && !inMemory(req, w) {
			// The upstream may answer before the body is all sent
			// (answerwatch.go).
			early = watchAnswer(c, w)
		}
		// The connection's own trace tells when the head was written. A
		// body that streams is framed by Request.Write (Content-Length,
		// or chunked with its trailer), which flushes the head first and
		// then copies the body: every write of it is checked
		// (engineConn.Write).
		// Request.Write reads the header from a map: the one exchange
		// that builds one (a body that streams costs more than that).
		req = req.WithContext(c.trace)
		req.Header = fields.Header()
		err = req.Write(c.bw)
		if c.wroteHead {
			c.wroteHead = false
			hooks.WroteHeaders()
		}
	}
	var resp *http.Response
	if cb != nil && cb.final != nil {
		// The upstream answered instead of 100 Continue.
		resp = cb.final
		if cb.skipped {
			err = nil // the body was left unsent: the connection closes
		}
	}
	// One flush sends head and body (what is left of them).
	switch {
	case awaited:
		// Sent, and the answer waited for, in one pass (await_*.go).
		if err == nil {
			err = c.flushAwaitingAnswer()
		}
		if errors.Is(err, errUnsent) {
			// The connection's check, made as it was about to be sent
			// on, found it ended: nothing left. An idle one is dropped
			// for another (or a new one); a new one that ended at once
			// fails the exchange, the request unsent.
			if reused {
				stop()
				_ = c.nc.Close()
				return e.Exchange(ctx, req, fields, w, deadline, hooks)
			}
			return fail(err)
		}
		if headOK {
			hooks.WroteHeaders()
		}
	case err != nil || cb != nil && cb.skipped:
	default:
		err = c.bw.Flush()
	}
	heard := early.end(ctx)
	if watch.end() {
		// The fence was lost while the request was half-sent, and the
		// watch reset the connection: whatever the writes saw, the
		// exchange failed on the fence.
		return fail(errors.Join(lostFence(w), err))
	}
	broken := false
	if err != nil {
		if heard == heardHangUp {
			// Not err, the halted read of the client's body, which
			// would read as the client's fault or a timeout.
			return fail(errHungUp)
		}
		if !c.writeFailed && heard != heardAnswer {
			return fail(err)
		}
		// The upstream stopped taking the request (a write to it failed),
		// or answered while the body was half-sent (the watch saw its
		// status line, and the body that stalled was halted, or failed):
		// it may have answered already, as one that refuses a body early
		// does (413, 401). The Transport's read goroutine would hear that
		// answer; the engine looks for it before it gives up. A 1xx
		// first (103) is heard, and the answer after it read, below.
		if resp == nil {
			if resp, _ = readAnswer(c, req); resp == nil {
				return fail(err)
			}
		}
		broken = true
	}
	c.fw = nil // all of the request has left, or all it will
	for {
		if resp == nil {
			if resp, err = readAnswer(c, req); err != nil {
				return fail(err)
			}
		}
		code := resp.StatusCode
		if code < 100 {
			// No HTTP status (ReadResponse takes any three digits), and
			// one net/http's server would panic on (WriteHeader): no
			// answer, as if the head had been malformed.
			return fail(fmt.Errorf("the upstream answered with status code %d", code))
		}
		if code == http.StatusSwitchingProtocols {
			// Upgrades go to the Transport; an upstream that switches
			// protocols unasked is broken.
			return fail(errors.New("the upstream switched protocols unasked"))
		}
		if code < 100 || code > 199 {
			break
		}
		if err := c.heard1xx(); err != nil {
			return fail(err)
		}
		info := textproto.MIMEHeader(resp.Header)
		resp = nil
		if err := hooks.Got1xx(code, info); err != nil {
			return fail(err)
		}
	}
	c.limit, c.into, c.intoList = -1, nil, nil
	b := &c.body
	*b = engineBody{e: e, c: c, rc: resp.Body, stop: stop, reuse: !resp.Close && !req.Close && !broken}
	switch resp.Body {
	case nil: // framed by the engine (read.go)
		b.left = resp.ContentLength
	case http.NoBody:
		b.eof = true
	}
	resp.Body = b
	return resp, nil
}

// failed closes c after a failed exchange and returns err with what ended
// it: ctx (its cause) or the deadline (context.DeadlineExceeded).
func (c *engineConn) failed(ctx context.Context, stop func() bool, deadline time.Time, err error) error {
	stop()
	c.into, c.intoList = nil, nil
	_ = c.nc.Close()
	switch {
	case ctx.Err() != nil:
		err = errors.Join(context.Cause(ctx), err)
	case !deadline.IsZero() && errors.Is(err, os.ErrDeadlineExceeded):
		err = errors.Join(context.DeadlineExceeded, err)
	}
	return err
}

// neverAborted is the stop of an exchange whose context cannot end: the
// abort never runs (true: as if stopped in time).
func neverAborted() bool { return true }

// aLongTimeAgo is a deadline in the past: it fails blocked I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// get returns a live idle connection to the upstream at key, or dials one
// (by deadline, if set).
//
// With whole (a request held whole is to be sent on it), the check of an
// idle connection, and the first look at a new one, are left to its first
// send (unchecked: sendAwaiting, checkedWrite). It also says whether the
// connection was idle (reused).
func (e *Transport) get(ctx context.Context, key upstreamKey, deadline time.Time, whole bool) (*engineConn, bool, error) {
	now := monotonic()
	e.mu.Lock()
	for {
		// Looked up again after each connection dropped: meanwhile
		// CloseIdleConnections may have taken the lists away.
		idle := e.list(key, false)
		if idle == nil || len(idle.conns) == 0 {
			break
		}
		list := idle.conns
		c := list[len(list)-1]
		list[len(list)-1] = nil
		idle.conns = list[:len(list)-1]
		e.mu.Unlock()
		if e.idleTimeout > 0 && now-c.idleAt >= e.idleTimeout {
			_ = c.nc.Close()
			e.mu.Lock()
			continue
		}
		if c.deadline && time.Until(c.deadlineAt) < time.Second {
			// The last exchange's deadline, left set, passed while c
			// was idle (or is about to): the peek would fail on it.
			c.setDeadline(time.Time{})
		}
		if whole && c.host != nil && c.br.Buffered() == 0 && c.rawConn() != nil {
			c.unchecked = true
			return c, true, nil
		}
		if c.alive() {
			return c, true, nil
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
	tcp, err := e.dial(ctx, "tcp", dialAddr(key))
	if err != nil {
		if ctx.Err() != nil {
			err = errors.Join(context.Cause(ctx), err)
		}
		return nil, false, err
	}
	nc := tcp
	if key.tls {
		if nc, err = e.handshake(ctx, tcp, key.host); err != nil {
			_ = tcp.Close()
			if ctx.Err() != nil {
				err = errors.Join(context.Cause(ctx), err)
			}
			return nil, false, err
		}
	}
	c := &engineConn{nc: nc, tcp: tcp, key: key, limit: -1}
	c.abort = func() { _ = c.nc.SetDeadline(aLongTimeAgo) }
	c.host, _ = hostLine(key.host) // nil: Request.Write writes the head
	c.trace = httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{WroteHeaders: func() { c.wroteHead = true }})
	c.br = bufio.NewReaderSize(c, 4<<10)
	c.bw = bufio.NewWriterSize(c, 4<<10)
	c.unchecked = whole && c.host != nil && c.rawConn() != nil // nothing is expected from it before the request
	return c, false, nil
}

// header is the map the answers' heads read by readHead are read into
// (read.go), lent with the answer as its body is: one per connection, made
// at its first answer.
func (c *engineConn) header() http.Header {
	if c.hdr == nil {
		c.hdr = make(http.Header, 8)
	}
	return c.hdr
}

// dialAddr is the address to dial for key: its host, with the scheme's
// port if it has none (as the Transport does).
func dialAddr(key upstreamKey) string {
	h := key.host
	if i, j := strings.LastIndexByte(h, ':'), strings.LastIndexByte(h, ']'); i > j {
		return h
	}
	if key.tls {
		return h + ":443"
	}
	return h + ":80"
}

// handshake speaks TLS over tcp to host (a URL's host) as the Transport
// would: its TLSClientConfig (a copy), the host's name as ServerName if
// the configuration names none, within TLSHandshakeTimeout. No ALPN is
// offered unless the configuration does: the engine speaks HTTP/1.1.
func (e *Transport) handshake(ctx context.Context, tcp net.Conn, host string) (net.Conn, error) {
	var cfg *tls.Config
	if e.std.TLSClientConfig != nil {
		cfg = e.std.TLSClientConfig.Clone()
	} else {
		cfg = &tls.Config{}
	}
	if cfg.ServerName == "" {
		name := host
		if i, j := strings.LastIndexByte(host, ':'), strings.LastIndexByte(host, ']'); i > j {
			name = host[:i]
		}
		cfg.ServerName = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	}
	if d := e.std.TLSHandshakeTimeout; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	tc := tls.Client(tcp, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	return tc, nil
}

// put keeps c for the next write to its upstream, or closes it. It also
// closes the connections idle for longer than idleTimeout (the oldest are
// first in the list), so that they do not linger half-closed while writes
// keep coming. (With no writes at all they stay until the next one or
// CloseIdleConnections; their number is bounded by maxIdle.)
func (e *Transport) put(c *engineConn) {
	c.idleAt = monotonic()
	var stale []*engineConn
	e.mu.Lock()
	idle := e.list(c.key, true)
	list := idle.conns
	for len(list) > 0 && e.idleTimeout > 0 && c.idleAt-list[0].idleAt >= e.idleTimeout {
		stale = append(stale, list[0])
		list[0] = nil
		list = list[1:]
	}
	keep := len(list) < e.maxIdle
	if keep {
		list = append(list, c)
	}
	idle.conns = list
	e.mu.Unlock()
	for _, s := range stale {
		_ = s.nc.Close()
	}
	if !keep {
		_ = c.nc.Close()
	}
}

// CloseIdleConnections closes the idle connections of the engine and of
// the http.Transport.
func (e *Transport) CloseIdleConnections() {
	e.mu.Lock()
	idle := e.idle
	e.idle, e.last = map[upstreamKey]*idleList{}, nil
	e.mu.Unlock()
	for _, list := range idle {
		for _, c := range list.conns {
			_ = c.nc.Close()
		}
	}
	e.std.CloseIdleConnections()
}

// engineConn is one upstream connection. Its reader counts the bytes of a
// response head against limit (-1: no limit, while a body is read).
type engineConn struct {
	nc     net.Conn // tcp, or TLS over it
	tcp    net.Conn // as dialled: peeked at (alive.go), reset (sendcheck.go)
	key    upstreamKey
	br     *bufio.Reader // reads through the engineConn (the limit)
	bw     *bufio.Writer
	limit  int64
	idleAt time.Duration // since it went idle (monotonic)
	// deadline: a deadline is set on nc, deadlineAt (setDeadline), which
	// sock tracks.
	deadline   bool
	deadlineAt time.Time
	sock       coarse.Socket
	// trace is a context whose ClientTrace sets wroteHead, for exchanges
	// with hooks (one per connection, not one per request).
	trace     context.Context
	wroteHead bool
	abort     func()       // fails blocked I/O on nc at once (made once)
	host      []byte       // the Host line of its requests (write.go)
	hdr       http.Header  // the header of the answer being read (header)
	into      http.Header  // the exchange's hooks' map for the final answer's header, if any (AnswerHeader)
	intoList  *wire.Fields // the list of into's fields, if any (AnswerFields)
	infos     int          // the exchange's 1xx answers so far (heard1xx)
	// rec holds the bytes read while recording (readAnswer: a head read
	// by ReadResponse), whose Connection field ReadResponse may take out.
	rec       []byte
	recording bool
	// fw is the write whose request is being written, whose fence each
	// write system call checks first (sendcheck.go); nil between requests.
	fw Write
	// body is the body of the answer being read (one exchange at a time):
	// lent, not allocated, so it must not be touched once closed, when the
	// connection may already carry the next exchange.
	body engineBody
	// writeFailed: a write of the request to the connection failed (not
	// its fence check): the upstream may have answered early.
	writeFailed bool
	// unchecked: taken by get without its check, made at its first send.
	unchecked bool
	// await: the next Write is the flush of a request held whole in bw,
	// which sends it and waits for the answer (flushAwaitingAnswer); send
	// is that Write's state, inside the wait.
	await bool
	send  awaitedSend
	// sent counts the bytes of requests written, for the watch of a
	// half-sent one (answerwatch.go), on another goroutine.
	sent atomic.Int64
	// The idle check's (alive.go), made once.
	raw     syscall.RawConn
	peek    func(fd uintptr) bool
	peekBuf [1]byte
	peekOK  bool
	// order is the name order of the last head written on the connection
	// (writeHead).
	order wire.Order
}

// setDeadline sets an exchange's deadline (zero: none) on c's connection
// in place of the last exchange's, which is left set while c is idle (a
// deadline that passes there fails nothing, and lifting it would cost every
// exchange a second SetDeadline). The deadline is rounded up (package
// coarse: at most a 64th of its time late), and not set again when it
// rounds to the last one: exchanges a few milliseconds apart mostly do.
func (c *engineConn) setDeadline(t time.Time) {
	t, _ = c.sock.Set(c.nc, net.Conn.SetDeadline, t)
	c.deadline, c.deadlineAt = !t.IsZero(), t
}

// started is a reading of the monotonic clock that monotonic counts from.
var started = time.Now()

// monotonic is the time since started: one reading of the monotonic clock,
// where time.Now reads the wall clock too, for the pool's idle times.
func monotonic() time.Duration { return time.Since(started) }

var errHeadTooLarge = errors.New("the upstream's response head is too large")

// max1xx is the most informational (1xx) answers an exchange takes before
// its final answer: CPython's http.client's bound (_MAXINTERIMRESPONSES),
// and Ruby's and fasthttp's.
const max1xx = 100

var errTooMany1xx = fmt.Errorf("the upstream sent more than %d informational (1xx) answers", max1xx)

// heard1xx counts an informational answer of the exchange, and fails once
// there are more than max1xx. net/http's Transport hands each 1xx to the
// ClientTrace that asks for them (the reverse proxy's does, to relay them)
// with a head limit of its own each, leaving the bound to it; the bound is
// the engine's, for the gateway relays them. Bounded so, and by one budget
// of head bytes for all the heads of an exchange, 1xx and final (the
// Transport's rule for the 1xx it hands to no one, c.limit, set once per
// exchange), an upstream that sends 1xx after 1xx (a 103 flood) ends its
// exchange at once, not at its deadline: a broken exchange, as for a
// malformed answer.
func (c *engineConn) heard1xx() error {
	c.infos++
	if c.infos > max1xx {
		return errTooMany1xx
	}
	return nil
}

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
	if c.recording {
		c.rec = append(c.rec, p[:n]...)
	}
	return n, err
}

// Write sends p, the bytes of c.fw's request, if c.fw's fence is still
// provably held (sendcheck.go); else it resets the connection at once and
// sends nothing. The exchange then fails (and closes c again, a no-op).
func (c *engineConn) Write(p []byte) (int, error) {
	w := c.fw
	if w == nil {
		return c.nc.Write(p)
	}
	if err := w.CheckSend(); err != nil {
		resetNow(c.tcp)
		return 0, err
	}
	var n int
	var err error
	if c.await {
		c.await = false
		n, err = c.sendAwaiting(p)
	} else {
		n, err = c.checkedWrite(p)
	}
	w.Sent(n)
	c.sent.Add(int64(n))
	if err != nil {
		c.writeFailed = true
	}
	return n, err
}

// awaitedSend is the state of a send made inside the wait for its answer
// (await_unix.go): the callback, made once, and what its call did.
type awaitedSend struct {
	fn           func(fd uintptr) bool
	p            []byte // the bytes to send
	n            int    // sent
	errno        error  // the write's
	called, gone bool   // the callback ran; its check found the connection ended
}

// errUnsent: a connection's check, made as a request was about to be sent
// on it, found it ended (or holding bytes nobody asked for); nothing of the
// request left.
var errUnsent = errors.New("the upstream's connection ended before the request was sent")

// checkedWrite writes p, after the check of a connection taken without
// one (unchecked: get). A check that cannot be made (a deadline past, an
// abort) is no sign of the connection's end: the write meets the same
// failure, and only this connection is given up.
func (c *engineConn) checkedWrite(p []byte) (int, error) {
	if c.unchecked {
		c.unchecked = false
		if idle, err := c.check(); err == nil && !idle {
			return 0, errUnsent
		}
	}
	return c.nc.Write(p)
}

// engineBody is a response body over an engine connection. Its end, if
// framed and clean, returns the connection to the pool; a close before
// the end closes the connection (never drains it: the upstream may send
// forever).
type engineBody struct {
	e     *Transport
	c     *engineConn
	rc    io.ReadCloser // ReadResponse's body, framed by net/http; nil: framed here
	stop  func() bool   // stops the context's abort; false if it ran
	reuse bool          // neither side asked to close
	eof   bool
	done  bool
	// The engine's own framing of a Content-Length body (rc nil), as
	// net/http's body over an io.LimitedReader frames it: left bytes are
	// still to come; srcEOF: its end (or an early one) was reached.
	left   int64
	srcEOF bool
}

func (b *engineBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.done {
		return 0, errors.New("read on a closed response body")
	}
	var n int
	var err error
	if b.rc != nil {
		n, err = b.rc.Read(p)
	} else {
		n, err = b.readFramed(p)
	}
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// readFramed reads the body's next bytes from the connection's reader, up
// to its length, returning what net/http's body over an io.LimitedReader
// returns: io.EOF with the last bytes, io.ErrUnexpectedEOF if the
// connection ends before them (and io.EOF on the reads after).
func (b *engineBody) readFramed(p []byte) (int, error) {
	if b.srcEOF || b.left <= 0 {
		b.srcEOF = true
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.c.br.Read(p)
	b.left -= int64(n)
	switch {
	case err == io.EOF:
		b.srcEOF = true
		if b.left > 0 {
			err = io.ErrUnexpectedEOF
		}
	case err == nil && n > 0 && b.left == 0:
		b.srcEOF = true
		err = io.EOF
	}
	return n, err
}

func (b *engineBody) Close() error {
	if b.done {
		return nil
	}
	b.done = true
	// The body at its end (ReadResponse's or the engine's own) has
	// nothing left to drain; before its end it is not closed (that would
	// read the rest) but dropped with the connection.
	if b.stop() && b.eof && b.reuse && b.c.br.Buffered() == 0 {
		b.e.put(b.c) // its deadline stays until the next exchange's (setDeadline)
		return nil
	}
	return b.c.nc.Close()
}
