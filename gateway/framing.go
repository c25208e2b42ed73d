package gateway

// Request framing: refusing requests whose framing is ambiguous (both
// Content-Length and Transfer-Encoding, duplicate lengths, obs-fold, ...)
// with 400 and the connection closed, nothing forwarded. The listener that
// sees each head as sent, the scanner and the rules are package framing's
// (gateway/internal/framing, whose comment tells why Go's server alone
// cannot see it); here is the middleware that answers what Check finds.

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/tokens"
)

// Listener returns ln prepared to serve the gateway with srv: pass it to
// srv.Serve. It is framing.Listener (gateway/internal/framing), whose
// comment says how it serves tlsConfig, what it sets on srv (HTTP/1.1
// only, its connection hooks) and what it reads from srv (set
// MaxHeaderBytes, the header timeouts and ErrorLog first). srv.Handler
// must pass every request to the Gateway, which checks one scanned head
// per request and sets the request's TLS field.
//
// A request Go's server refuses itself before any handler runs, which it
// answers in plain text, is answered with the gateway's problem instead:
// 400 invalid_request for its 400s (no Host, a line it cannot parse, ...,
// in net/http's words) and for its 5xx (a Transfer-Encoding other than one
// "chunked", an HTTP version it does not speak: the client's fault, never
// the gateway's), 431 invalid_request for a head too large, 417
// invalid_request for an expectation other than 100-continue.
//
// Fenced writes, acquires and releases (plain HTTP/1.1 requests with a
// Content-Length or no body: ownsRequest) are served by the listener's own
// connection loop, without Go's server (gateway/internal/framing, own.go);
// every other request is Go's server's, on the same connection. Call the
// listener's Shutdown after srv.Shutdown: it waits for the requests the
// loop serves.
func Listener(srv *http.Server, ln net.Listener, tlsConfig *tls.Config) ServingListener {
	return framing.Listener(srv, ln, tlsConfig, framingRefusal, ownsRequest)
}

// ServingListener is the listener Listener returns.
type ServingListener = framing.ServingListener

// ownsRequest tells the listener which requests its own loop serves, from
// the start of the request line: a fenced write (the methods that have no
// need of Go's server's rules for HEAD, and a target under /v1/proxy/, the
// escaped path the proxy is dispatched on: dispatch), and the two control
// calls every lease makes, an acquire (POST /v1/leases) and a release
// (DELETE /v1/leases/{lease_id}). Every other request, and any the loop
// cannot take whatever this says (own.go: mine), is Go's server's.
func ownsRequest(line []byte) bool {
	sp := bytes.IndexByte(line, ' ') // not bytes.Cut, whose bytes.Index cost 50 instructions more
	if sp < 0 {
		return false
	}
	method, target := line[:sp], line[sp+1:]
	if bytes.HasPrefix(target, []byte(proxyPrefix)) {
		switch string(method) {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodGet:
			return true
		}
		return false
	}
	rest, ok := bytes.CutPrefix(target, []byte(pathLeases))
	switch {
	case !ok:
		return false
	case string(method) == http.MethodPost:
		return len(rest) == 0 || rest[0] == ' ' || rest[0] == '?'
	case string(method) == http.MethodDelete:
		return len(rest) > 1 && rest[0] == '/'
	}
	return false
}

// framingRefusal renders the invalid_request problem (status 400 or 431)
// that the listener sends in place of an answer Go's server would have
// written itself: the problem refuseFraming writes, as bytes on the wire.
func framingRefusal(status int, field, reason string) []byte {
	p, _ := problemFor(&tokens.Error{Kind: tokens.ErrInvalid, Field: field,
		Detail: reason + "; nothing was forwarded and the connection is closed"})
	p.Type = problemTypePrefix + p.Code
	if status != p.Status {
		p.Status, p.Title = status, http.StatusText(status)
	}
	body, err := json.Marshal(p)
	if err != nil { // a problem always encodes; never answer nothing
		body = []byte(`{"status":` + strconv.Itoa(status) + `}`)
	}
	body = append(body, '\n')
	return []byte("HTTP/1.1 " + strconv.Itoa(status) + " " + http.StatusText(status) + "\r\nContent-Type: " + problemContentType +
		"\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) +
		"\r\n\r\n" + string(body))
}

// framing is the outermost middleware: it takes the scanned head of each
// request on a connection from Listener (framing.Check) and refuses
// requests whose framing is ambiguous, or could not be checked, with 400
// and Connection: close. Requests framed by Transfer-Encoding are answered
// with Connection: close in any case, so bytes a front proxy framed
// differently are never read as a next request (RFC 9112 6.3). Without
// Listener (a test server, an embedder) only that last rule applies.
func (g *Gateway) framing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keepTrailer(r) // before anything copies r (trailers.go)
		// The request's own state, in one allocation: its scope, in the
		// context of a copy of r (live.go), the watch on that copy's
		// body (early.go) and, for a request to the proxy, its fenced
		// write's state (proxy.go). Other requests (grants, the
		// dashboard) take the smaller state without the write's.
		var st *requestBase
		var write *forward
		if strings.HasPrefix(r.URL.Path, proxyPrefix) {
			pst := new(requestState)
			st, write = &pst.requestBase, &pst.write
		} else {
			st = new(requestBase)
		}
		r = g.scopeInto(r, &st.scope, &st.req)
		st.scope.write = write
		w, r = watchBody(w, r, &st.body)
		v, scanned := framing.Check(r)
		if !scanned {
			if len(r.TransferEncoding) > 0 {
				w = closeAfterAnswer(w)
			}
			next.ServeHTTP(w, r)
			return
		}
		if v.Mismatch != "" {
			g.log.Warn("request framing: the scanned "+v.Mismatch+" does not match the request; refused",
				"method", r.Method, "path", logPath(r), "remote", r.RemoteAddr)
		}
		if v.Field != "" {
			g.refuseFraming(w, r, v.Field, v.Reason)
			return
		}
		if v.TransferEncoding {
			w = closeAfterAnswer(w)
		}
		if v.TLS != nil && r.TLS == nil {
			r.TLS = v.TLS // r is st.req, the gateway's own copy
		}
		st.scope.sent, st.scope.answer, st.scope.neverDone = v.Fields, v.Answer, v.NeverDone
		next.ServeHTTP(w, r)
	})
}

// requestBase is what the framing middleware keeps of each request.
type requestBase struct {
	scope scope
	body  unreadBody
	req   http.Request // the request as the handlers see it: a copy with the scope
}

// requestState is what it keeps of a request to the proxy: the base and
// the fenced write's state, in one allocation. A request whose escaped
// path alone names the proxy gets the base; serveProxy then allocates
// the write's state itself (newForward).
type requestState struct {
	requestBase
	write forward
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
