package gateway

// Answers that come before the request's body was read.
//
// Go's HTTP/1 server, before it writes the head of an answer to a request
// whose body the handler left unread, reads that body (up to 256 KiB) so
// the connection can carry the next request. A client that sent a head and
// waits (for 100 Continue, or by malice) then gets no answer at all: a
// refusal that does not need the body (401, a foreign Host's 403, a missing,
// unknown or stale lease, an unknown upstream, 415, GET /healthz with a
// body) waited for a body that never came, and held its connection and
// goroutine while it did. Net/http skips that read when the answer closes
// the connection, and sends 100 Continue only when a handler reads the
// body. So such an answer goes out at once with Connection: close, and the
// connection may still be read (and what comes dropped) for refusalLinger
// before it is closed, so the close does not turn into a reset that costs
// the client its answer.

import (
	"io"
	"net/http"
	"time"
)

// unreadBody watches a request body and the answer to its request: if the
// answer starts before the body was read to its end, and the handler did
// not take charge of the body (admitted writes: the forward owns their
// body, proxy.go), the answer closes the connection.
type unreadBody struct {
	http.ResponseWriter
	body    io.ReadCloser
	length  int64 // the request's Content-Length, -1 if unknown (chunked)
	n       int64 // bytes read so far
	eof     bool
	off     bool // the handler owns the body's fate from here on
	decided bool // the answer's head was written (or the watch is off)
}

// watchBody wraps r's body and w, with u (the caller's storage, unused
// until then), when r has a body; otherwise it returns them as they are.
// r must be a copy of the request Go's server made, not that request
// itself: the server looks at its own request's body (its type) once the
// answer starts, to tell whether the handler read it to its end or closed
// it early, and must see its own.
func watchBody(w http.ResponseWriter, r *http.Request, u *unreadBody) (http.ResponseWriter, *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return w, r
	}
	*u = unreadBody{ResponseWriter: w, body: r.Body, length: r.ContentLength}
	r.Body = (*unreadReader)(u)
	return u, r
}

// unreadReader is the request body as the handlers read it.
type unreadReader unreadBody

func (b *unreadReader) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.n += int64(n)
	if err == io.EOF || b.length >= 0 && b.n >= b.length {
		b.eof = true
	}
	return n, err
}

func (b *unreadReader) Close() error { return b.body.Close() }

func (u *unreadBody) decide() {
	if u.decided {
		return
	}
	u.decided = true
	if u.off || u.eof {
		return
	}
	u.Header().Set("Connection", "close")
	// Bounded: net/http reads what the client still sends (at most
	// 256 KiB) after the answer, then closes.
	_ = http.NewResponseController(u.ResponseWriter).SetReadDeadline(time.Now().Add(refusalLinger))
}

func (u *unreadBody) WriteHeader(code int) {
	if code >= 200 {
		u.decide()
	}
	u.ResponseWriter.WriteHeader(code)
}

func (u *unreadBody) Write(p []byte) (int, error) {
	u.decide()
	return u.ResponseWriter.Write(p)
}

// Flush: the live stream flushes through the interface.
func (u *unreadBody) Flush() {
	u.decide()
	_ = http.NewResponseController(u.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController (flushes, deadlines) reach the
// connection's writer.
func (u *unreadBody) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// ownBody tells the watch on w, if any, that the handler took charge of
// the request's body (an admitted write): its answer is the forward's.
func ownBody(w http.ResponseWriter) {
	if u := watchOf(w); u != nil {
		u.off = true
	}
}

// disownBody gives the body back to the watch once the forward's exchange
// is over: if the body was not read to its end (the send to the upstream
// failed, or the upstream answered before it had all of it), the answer
// closes the connection. Otherwise net/http's server would read the rest,
// up to 256 KiB, before the answer's head, and a client that waits for an
// answer before it sends more (a stream it paces, a producer that stalls)
// would get none: a 502 or 503 fence_lost would wait for the body timeout.
func disownBody(w http.ResponseWriter) {
	if u := watchOf(w); u != nil {
		u.off = false
	}
}

// watchOf finds the watch on w's request body, nil if there is none.
func watchOf(w http.ResponseWriter) *unreadBody {
	for w != nil {
		if u, ok := w.(*unreadBody); ok {
			return u
		}
		uw, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = uw.Unwrap()
	}
	return nil
}
