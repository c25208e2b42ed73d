// Package framing sees the head of every HTTP/1 request as the client sent
// it, so that the gateway can refuse requests whose framing is ambiguous:
// first of all those that carry both Content-Length and Transfer-Encoding.
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
// scanner that finds each request's head, notes its framing fields and
// skips its Content-Length body. The facts of each head are queued on the
// connection, which handlers reach through http.Server.ConnContext; Check,
// called by the outermost handler, takes one entry per request (HTTP/1
// requests on a connection are served one after the other, pipelined ones
// too) and judges it. The scanner never buffers or changes bytes, costs a
// few nanoseconds per head byte and nothing per Content-Length body byte;
// it follows the chunk lines of a chunked body (a few nanoseconds per
// chunk-line byte, nothing per data byte), so that a malformed one read
// with the head is refused before anything is forwarded. A Transfer-Encoding
// other than one "chunked", which Go's server would answer with its own
// 501, gets the gateway's 400 in its place (the connection's Write), as
// does every other plain-text answer Go's server writes itself before any
// handler (its 400s, its 505; its 431 stays a 431).
//
// Fail closed: the entry must describe the request Go parsed (the same
// request line, byte for byte, and the same framing) or the request is
// refused. The scanner stops following a connection after the body of a
// request with Transfer-Encoding (the gateway closes the connection after
// answering it),
// after anything it refuses, after a hijack and when its queue is full;
// every later request on that connection, if Go read one, would find no
// entry and be refused.
//
// The package knows nothing of the gateway: it says why a request must be
// refused, and the gateway answers. The parts, one job to a file: the
// listener and its connections (listener.go), TLS termination (tls.go), the
// scanner (scan.go) and its part for chunked bodies (chunk.go), the peek at unread bytes that decides how a connection
// is closed (unread.go), and here the check of each request against its
// scanned head.
package framing

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// Fields named by refusals, besides the names of single header fields.
const (
	fieldFraming = "Content-Length, Transfer-Encoding"
	fieldHeaders = "headers"
)

// unverified is the reason given for a request whose head was not scanned
// or does not match what Go parsed.
const unverified = "the request's framing could not be verified"

// Verdict is what the scanned head of a request says about its framing.
type Verdict struct {
	// Field and Reason say why the request must be refused: the header
	// field at fault ("headers" for the head as a whole) and what is wrong
	// with it. Field is "" if the request may go on.
	Field, Reason string
	// Mismatch names what of the scanned head disagreed with the request
	// Go's parser made of the same bytes ("head": the request line;
	// "framing": Content-Length or Transfer-Encoding), "" if nothing did.
	// Such a request is refused, never guessed at, and the disagreement
	// is worth a warning: it is a bug in the scanner or in Go's parser.
	Mismatch string
	// TransferEncoding: the request is framed by Transfer-Encoding. Its
	// answer must close the connection, so that bytes a front proxy framed
	// differently are never read as a next request (RFC 9112 6.3); the
	// scanner has stopped following the connection.
	TransferEncoding bool
	// TLS is the connection's TLS state if the listener terminated TLS,
	// for the request's TLS field (Go's server sets it only on connections
	// it terminated itself).
	TLS *tls.ConnectionState
	// Fields are the request's header fields in the order the client sent
	// them, each name once with its values as the header map holds them
	// (Host is the request's, not among them), for a head the listener's
	// own loop parsed itself; nil for any other. They are the header's
	// only while nothing changed the map: compare their count with its
	// length before taking them for it.
	Fields []wire.Field
	// Answer, for a head the own loop parsed itself, is a list the fields
	// a handler's answer has in its header map may also be listed in, in
	// the order they are to be walked, each name once with the map's
	// values: the answer's head then walks the list rather than the map,
	// while the two have as many names (nil for any other head). Whoever
	// fills it keeps it the map's, or empties it.
	Answer *wire.Fields
	// NeverDone: the request's context is never cancelled, its Done nil
	// (a head the own loop parsed itself, on a connection whose base
	// context has no end), known without asking it: the question walks
	// the context's layers of values.
	NeverDone bool
}

// VerifyLists, set by tests before any request, has every list of fields
// taken for its header map (Verdict.Fields by the handler, Verdict.Answer
// by the answer's head) checked against the map first, name by name, and
// panic if they differ: the count the road compares cannot see a value
// replaced in place, and the tests of every handler then would.
var VerifyLists bool

// Taken counts, while VerifyLists is set, the lists taken for their
// header maps and verified (Verify): the requests' and the answers'. A
// test that serves a plain fenced write tells by them that the road took
// the lists, which no answer of it shows.
var Taken struct{ Request, Answer atomic.Int64 }

// Verify checks fs, a list taken for its header map h (VerifyLists): it
// panics if the two differ (SameFields), else counts the list in n.
func Verify(fs []wire.Field, h http.Header, n *atomic.Int64, what string) {
	if !SameFields(fs, h) {
		panic(fmt.Sprintf("framing: the %s's list of fields %v is not its header %v", what, fs, h))
	}
	n.Add(1)
}

// SameFields reports whether fs lists h: each of h's names once, with the
// map's own values (the same array).
func SameFields(fs []wire.Field, h http.Header) bool {
	if len(fs) != len(h) {
		return false
	}
	for _, f := range fs {
		vv, ok := h[f.Name]
		if !ok || len(vv) != len(f.Values) || len(vv) > 0 && &vv[0] != &f.Values[0] {
			return false
		}
	}
	return true
}

// Check takes the scanned head of r, the request being served, and judges
// its framing. scanned is false if r did not come through a Listener (a
// test server, an embedder): then nothing was scanned, v is zero, and only
// the rule for Transfer-Encoding (Verdict.TransferEncoding) can be kept, by
// looking at r itself. Call it once per request: each call takes a head.
func Check(r *http.Request) (v Verdict, scanned bool) {
	c, _ := r.Context().Value(connKey{}).(*conn)
	if c == nil {
		return Verdict{}, false
	}
	c.serving.Store(true) // until the connection is idle again (Listener)
	h, tlsState, badBody, ok := c.next()
	v = judge(h, ok, r)
	if v.Field == "" && badBody != "" {
		// Go's reader will refuse the body: refuse the request before
		// anything of it is forwarded.
		v.Field, v.Reason = "body", badBody
	}
	v.TLS = tlsState
	if v.Field == "" {
		v.Fields, v.Answer, v.NeverDone = h.fields, h.answer, h.neverDone
	}
	return v, true
}

// judge compares h, the scanned head of r (ok: there was one), with r.
func judge(h head, ok bool, r *http.Request) Verdict {
	if !ok {
		return Verdict{Field: fieldHeaders, Reason: unverified}
	}
	if h.lean {
		// The loop parsed r from the bytes it took the scan from
		// (takeHead): its line can only be the one scanned.
		if len(r.Method)+len(r.RequestURI)+len(r.Proto)+2 != h.lineLen {
			return Verdict{Field: fieldHeaders, Reason: unverified, Mismatch: "head"}
		}
	} else if lh, n := requestLineHash(r); lh != h.lineHash || n != h.lineLen {
		return Verdict{Field: fieldHeaders, Reason: unverified, Mismatch: "head"}
	}
	if h.bad != "" {
		return Verdict{Field: h.badField, Reason: h.bad}
	}
	cl, te := h.flags&hasCL != 0, h.flags&hasTE != 0
	switch {
	case cl && te:
		return Verdict{Field: fieldFraming, Reason: "a request must not carry both (RFC 9112 6.3)"}
	case te && !r.ProtoAtLeast(1, 1):
		return Verdict{Field: "Transfer-Encoding", Reason: "not allowed in an HTTP/1.0 request (RFC 9112 6.1)"}
	case te != (len(r.TransferEncoding) > 0), !te && r.ContentLength != h.length && !h2Preface(r):
		// The scanner and Go's parser disagree: never guess.
		return Verdict{Field: fieldHeaders, Reason: unverified, Mismatch: "framing"}
	}
	return Verdict{TransferEncoding: te}
}

// h2Preface: net/http hands "PRI * HTTP/2.0" to handlers with an unknown
// length and closes the connection after it.
func h2Preface(r *http.Request) bool {
	return r.Method == "PRI" && r.RequestURI == "*" && r.ProtoMajor == 2 && r.ContentLength == -1
}
