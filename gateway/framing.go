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
//
// The parts, one job to a file: the listener and its connections
// (framing_listener.go), TLS termination (framing_tls.go), the scanner
// (framing_scan.go), and here the middleware that checks each request
// against its scanned head.

import (
	"net/http"
	"strings"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// framing is the outermost middleware: it takes the scanned head of each
// request on a connection from Listener and refuses requests whose framing
// is ambiguous, or could not be checked, with 400 and Connection: close.
// Requests framed by Transfer-Encoding are answered with Connection: close
// in any case, so bytes a front proxy framed differently are never read as
// a next request (RFC 9112 6.3). Without Listener (a test server, an
// embedder) only that last rule applies.
func (g *Gateway) framing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w, r = watchBody(w, r) // early.go
		fc, _ := r.Context().Value(framingKey{}).(*framingConn)
		if fc == nil {
			if len(r.TransferEncoding) > 0 {
				w = closeAfterAnswer(w)
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
			w = closeAfterAnswer(w)
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
			"method", r.Method, "path", logPath(r), "remote", r.RemoteAddr)
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
			"method", r.Method, "path", logPath(r), "remote", r.RemoteAddr)
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
		g.metrics.write(outcomeBadRequest)
	}
	w.Header().Set("Connection", "close")
	// net/http may still read up to 256 KiB of the unread body before it
	// closes the connection. Let it, briefly: what it reads is not left in
	// the socket to turn the close into a reset that could cost the client
	// this answer, and a client that stalls (one waiting for 100 Continue)
	// does not hold the connection.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(refusalLinger))
	writeProblem(w, r, g.log, &tokens.Error{Kind: tokens.ErrInvalid, Field: field,
		Detail: detail + "; nothing was forwarded and the connection is closed"})
}

// closeAfterAnswer makes w's final answer close the connection, so that
// nothing after a body framed by Transfer-Encoding is read as a next
// request. Setting the header once is not enough: the reverse proxy
// clears the header map after it forwards an upstream's 1xx, so the
// header is set again on the final status.
func closeAfterAnswer(w http.ResponseWriter) http.ResponseWriter {
	w.Header().Set("Connection", "close")
	return closingWriter{w}
}

type closingWriter struct{ http.ResponseWriter }

func (w closingWriter) WriteHeader(code int) {
	if code >= 200 {
		w.Header().Set("Connection", "close")
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController (flushes, deadlines) reach the
// connection's writer.
func (w closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
