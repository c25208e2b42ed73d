package gateway

// The direct forward: the one road of a fenced write once it is admitted,
// from the handler to the engine's Exchange (package engine) and back.
//
// It does what httputil.ReverseProxy with the gateway's Rewrite would do,
// in its order, without the machinery a general proxy needs (a clone of
// the request and of its header map, three derived contexts, a copy of
// every response header value, a media type parse: about a third of the
// gateway's allocations when writes went through it, by the profile in
// docs/benchmarks.md): through the same code where the code is exported
// (ProxyRequest.SetURL inside the gateway's rewrite, which sets the
// headers of SetXForwarded itself; Request.Write, ReadResponse, where the
// engine does not write or read the common case itself) and as
// copies of its few lines where it is not (the hop-by-hop headers, Te:
// trailers, the response's header, trailer and flush rules).
// httputil.ReverseProxy is the tests' reference road (oracle_test.go):
// TestEngineMatchesReverseProxy and its kin hold the two to the same bytes
// at the upstream and at the client. The forward timeout is a deadline on
// the upstream connection instead of a context.
//
// It takes every write (Upgrade and CONNECT are refused before:
// pathrule.go), to an http or an https upstream: with no body, one read
// in whole (a small one, smallbody.go; a keyed one, idempotency.go, whose
// answer it records before any of it goes back: recordKeyed), or one that
// streams (Content-Length or chunked, with its trailer: trailers.go),
// framed again by the engine, which waits for the upstream's 100 Continue
// first if the client asked for one. The query goes on as the client sent
// it, byte for byte (rewrite).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/engine"
	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// directState is what one direct forward needs besides its forward, lent
// by directPool: the outbound request, its URL and header fields, the
// hooks, and a small body's buffer (one pool for both: each sync.Pool's
// Get and Put cost about 180 instructions). The fields hold the client's
// value slices (capacity clipped, so that an append never writes into
// them); nothing keeps a reference to any of it past the forward (reset).
// The answer's 32 KiB copy buffer is not in it (bufferPool): a write that
// waits for its upstream would hold it all that time.
type directState struct {
	directUse
	fields [24]wire.Field // h's storage (a head of more fields grows on the heap)
	// small holds a small body read whole (readSmallBody): smallBody
	// bytes and one more to see its end. The engine writes a body in
	// memory from the handler's goroutine and keeps nothing of it after
	// its exchange.
	small [smallBody + 1]byte
}

// directUse is the state but the fields' storage.
type directUse struct {
	out   http.Request
	url   url.URL
	hooks directHooks
	h     wire.Fields // the outbound header (here, not on the stack: rewrite's tracing takes its address)
	vals  [4]string   // the values rewrite sets
	body  memBody     // a body in memory, as the outbound request's Body
	open  openBody    // a body that streams, as the outbound request's Body
}

// reset clears st for its next forward: its fields' storage only as far
// as h used it (the small body's buffer holds bytes only, and is written
// before it is read). A write uses a few of its 24 fields: with the pool's Put,
// the clear of the whole 1.6 KB state took 280 instructions a write (Go's
// client's fields), this one 245.
func (st *directState) reset() {
	n := len(st.fields) // h grew onto the heap, from a full array
	if cap(st.h) == n {
		// h is still in fields, which are empty past its length: set
		// fields are appended, and a field taken out (Fields.remove)
		// leaves its place at the end empty.
		n = len(st.h)
	}
	clear(st.fields[:n])
	st.directUse = directUse{}
}

// openBody is the client's body that streams, as the outbound request's
// Body, with a Close that leaves it open. Request.Write closes the body
// it sends, also when the send fails (a failed proof of the fence, an
// upstream gone), and the Close of a body from net/http's server first
// reads the rest of the client's body (up to 256 KiB) for as long as the
// client takes, up to the body timeout: the client would hear its answer
// (503 fence_lost, 502) only then. net/http's server closes the body
// itself, after the answer has gone out.
//
// It keeps the error of a failed read of the client's body: Request.Write
// returns that error inside a type of net/http's own, which errors.As does
// not see through (the Transport takes it out; the engine cannot name it),
// and forwardFailed must see it to answer for the client's body (413 for
// a chunked body past MaxBody).
type openBody struct {
	io.Reader
	err error
}

func (b *openBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (*openBody) Close() error { return nil }

// memBody is a body in memory (forward.buffered) as a request's Body. The
// engine writes the bytes themselves (Write.Body) and reads it only when
// the request waits for 100 Continue (Request.Write).
type memBody struct{ bytes.Reader }

func (*memBody) Close() error { return nil }

var directPool = sync.Pool{New: func() any { return new(directState) }}

// noUserAgent keeps Request.Write from sending Go's User-Agent, as the
// reverse proxy does for a client that sent none.
var noUserAgent = []string{""}

// testHookDirect, if set (tests), is called for each direct forward.
var testHookDirect func()

// takeDirect lends a direct forward its state; giveDirect takes it back.
func takeDirect() *directState { return directPool.Get().(*directState) }

func giveDirect(st *directState) {
	st.reset()
	directPool.Put(st)
}

// forwardDirect forwards r, admitted as f, through the engine and copies
// the answer to w, as the reverse proxy would, with the state st (its
// caller's, from takeDirect, zero but for its buffers). listed is r's
// fields that go upstream as they are (writeFields.listed; nil: not
// listed).
func (g *Gateway) forwardDirect(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, f *forward, listed []wire.Field, st *directState) {
	if testHookDirect != nil {
		testHookDirect()
	}
	// The outbound header, as a list (wire.Fields): it is copied, trimmed
	// and added to by name, and written once, so a map bought nothing.
	st.h = st.fields[:0]
	h := &st.h
	wf := &f.fields
	connection := wf.hasConnection
	if connection {
		// The client's Connection field names more fields that go: the
		// reverse proxy's steps before its Rewrite (ServeHTTP), on a map
		// of their own (a rare request).
		m := make(http.Header, len(r.Header))
		for k, v := range r.Header {
			m[k] = v[:len(v):len(v)]
		}
		wire.RemoveHopByHop(m)
		for k, v := range m {
			if k != "Content-Length" && !forwardingHeader(k) {
				h.Add(k, v)
			}
		}
	} else if listed != nil {
		// The fields that go (below, and in rewrite) are known by name:
		// they were left out of the list rather than copied and deleted.
		*h = append(*h, listed...)
	} else {
		for k, v := range r.Header {
			if goesUpstream(k) {
				h.Add(k, v[:len(v):len(v)])
			}
		}
	}
	st.url = *r.URL
	// st.out is zero (reset): set field by field, not as a composite
	// literal, which zeroed its 250 bytes again (80 instructions).
	out := &st.out
	out.Method, out.URL, out.Proto, out.ProtoMajor, out.ProtoMinor = r.Method, &st.url, r.Proto, r.ProtoMajor, r.ProtoMinor
	out.Host, out.ContentLength, out.RemoteAddr = r.Host, r.ContentLength, r.RemoteAddr
	if f.buffered != nil {
		st.body.Reset(f.buffered)
		out.Body = &st.body
	} else if r.ContentLength != 0 {
		// A body that streams: the client's, framed again by the engine
		// (Request.Write), its trailer fields copied in at its end
		// (forwardTrailer, in rewrite).
		st.open.Reader = r.Body
		out.Body, out.TransferEncoding, out.Trailer = &st.open, r.TransferEncoding, r.Trailer
	}
	if wf.teTrailers { // as the reverse proxy asks
		// As the reverse proxy: an upstream may learn that trailers of
		// its answer reach the client.
		h.Set("Te", teTrailers[:1:1])
	}
	g.rewrite(&httputil.ProxyRequest{In: r, Out: out}, h, f, &st.vals, true)
	// The client's User-Agent stays, unless its Connection field named it.
	if !wf.userAgent || connection {
		if _, ok := h.Lookup("User-Agent"); !ok {
			h.Add("User-Agent", noUserAgent[:1:1])
		}
	}
	deadline := time.Now().Add(g.cfg.ForwardTimeout)
	f.deadline = deadline
	fw := &st.hooks
	fw.w, fw.f, fw.http10 = w, f, !r.ProtoAtLeast(1, 1)
	dst := w.Header()
	if f.keyed == nil && len(dst) == 0 {
		// The common answer is read straight into the client's header,
		// its hop-by-hop fields left out (engine.Hooks.AnswerHeader): no
		// map of the engine's to copy from. A keyed answer is recorded
		// before any of it is the client's.
		fw.into, fw.list = dst, f.answer
	}
	// The whole request is the gateway's to carry from here: a client that
	// goes away (or only half-closes its connection, which net/http's
	// server takes for gone) does not abort the exchange. Aborted, the
	// write would not be unsent, only its outcome made unknown (a drain)
	// and a half-closed client refused its answer; carried on, it ends by
	// the upstream's answer or the forward timeout, as with the client
	// there. A client gone mid-body still ends it: its body's read fails.
	ctx := r.Context()
	if ctx.Done() != nil { // the own loop's context is never cancelled: nothing to take away
		ctx = context.WithoutCancel(ctx)
	}
	res, err := g.engine.Exchange(ctx, out, *h, f, deadline, fw)
	// The exchange is over: a client's body it did not read to its end (a
	// send that failed, an upstream that answered early) is no longer the
	// forward's, and the answer closes the connection rather than wait for
	// the rest (early.go).
	disownBody(w)
	if err != nil {
		clear(fw.into) // the engine fails no exchange whose answer it read, but the problem must not carry one
		if fw.list != nil {
			*fw.list = (*fw.list)[:0]
		}
		if st.open.err != nil {
			err = errors.Join(st.open.err, err)
		}
		g.forwardFailed(w, r, f, err, errors.Is(err, context.DeadlineExceeded) || !time.Now().Before(deadline))
		return
	}

	f.status = res.StatusCode
	// The reverse proxy's steps after its RoundTrip. The engine keeps the
	// answer's Connection field where ReadResponse takes it out (it names
	// close), so the fields it names go too (RFC 9110 7.6.1); it names
	// the trailer fields that do not go on either (answerTrailer).
	var conn []string
	var contentType string
	copied := fw.into != nil && len(dst) > 0 // read into dst by the engine
	if copied {
		contentType = answerType(dst, fw.list)
	} else {
		conn, contentType, copied = copyAnswerHeader(dst, res.Header, f.keyed == nil)
	}
	if !copied {
		// The fields Connection names go too; a keyed answer is recorded
		// as it goes on.
		wire.RemoveHopByHop(res.Header)
		if f.keyed != nil {
			// Its ModifyResponse, for a keyed write: the answer is
			// recorded before any of it goes back.
			if err := g.recordKeyed(r.Context(), f, res); err != nil {
				_ = res.Body.Close()
				g.forwardFailed(w, r, f, err, errors.Is(err, context.DeadlineExceeded) || !time.Now().Before(deadline))
				return
			}
		}
		for k, vv := range res.Header {
			if wire.IsHopHeader(k) {
				continue
			}
			if len(dst[k]) == 0 {
				dst[k] = vv // the value slices are this answer's alone (its map is the engine's, lent)
			} else {
				dst[k] = append(dst[k], vv...)
			}
		}
		contentType = wire.Get(res.Header, "Content-Type")
	}
	announcedTrailers := len(res.Trailer)
	if announcedTrailers > 0 {
		trailerKeys := make([]string, 0, len(res.Trailer))
		for k := range res.Trailer {
			if answerTrailer(k, conn) {
				trailerKeys = append(trailerKeys, k)
			}
		}
		if len(trailerKeys) > 0 {
			dst.Add("Trailer", strings.Join(trailerKeys, ", "))
		}
	}
	w.WriteHeader(res.StatusCode)
	// A body of unknown length, or an event stream, is flushed as it
	// comes (the reverse proxy's flushInterval -1), its head at once.
	flush := res.ContentLength == -1 || eventStream(contentType)
	if flush {
		_ = rc.Flush()
	}
	if err := g.copyAnswer(w, rc, res.Body, flush); err != nil {
		defer res.Body.Close()
		// As the reverse proxy: the answer is cut short, and the client
		// must see that (ErrAbortHandler) rather than a short body.
		if r.Context().Value(http.ServerContextKey) == nil {
			return
		}
		panic(http.ErrAbortHandler)
	}
	_ = res.Body.Close() // now, to populate res.Trailer
	if len(res.Trailer) == 0 {
		return // the common answer: no walk of an empty map (45 instructions)
	}
	// Force chunking, so that net/http does not add a Content-Length to a
	// short body.
	_ = rc.Flush()
	if len(res.Trailer) == announcedTrailers {
		for k, vv := range res.Trailer {
			if !answerTrailer(k, conn) {
				continue
			}
			for _, v := range vv {
				dst.Add(k, v)
			}
		}
		return
	}
	for k, vv := range res.Trailer {
		if !answerTrailer(k, conn) {
			continue
		}
		k = http.TrailerPrefix + k
		for _, v := range vv {
			dst.Add(k, v)
		}
	}
}

// answerType is the Content-Type of an answer read into h: found in the
// list of h's fields the engine made (AnswerFields), if it made one, by a
// few comparisons of names where a lookup in h cost about 120
// instructions.
func answerType(h http.Header, list *wire.Fields) string {
	if list == nil || len(*list) != len(h) {
		return wire.Get(h, "Content-Type")
	}
	vv, _ := list.Lookup("Content-Type")
	return wire.First(vv)
}

// copyAnswerHeader copies the answer's header src into the client's dst,
// the hop-by-hop fields left out, in the common case: dst empty, and
// may (the write is not keyed: a keyed answer is recorded first). It
// returns the answer's Connection field and Content-Type, read as it
// copies (no lookup of either), and whether it copied: not when it may
// not or dst is not empty, nor when src has a Connection field, whose
// names must go from src first (dst is then left empty again). The
// caller then copies as the reverse proxy does.
func copyAnswerHeader(dst, src http.Header, may bool) (conn []string, contentType string, copied bool) {
	if !may || len(dst) > 0 {
		return src["Connection"], "", false
	}
	for k, vv := range src {
		switch k {
		case "Connection":
			clear(dst)
			return vv, "", false
		case "Content-Type":
			contentType = wire.First(vv)
		}
		if !wire.IsHopHeader(k) {
			dst[k] = vv // the value slices are this answer's alone (its map is the engine's, lent)
		}
	}
	return nil, contentType, true
}

// answerTrailer reports whether an answer's trailer field named k (as
// the answer's Trailer map keys it) goes on to the client, conn being the
// answer's Connection field. The reverse proxy relays every one, and
// net/http's server writes those not announced (TrailerPrefix) as they
// are; the road drops what may not be a trailer field or is not the
// client's: an invalid name, a hop-by-hop field or one conn names (RFC
// 9110 7.6.1), and the fields RFC 9110 6.5.1 keeps out of trailers:
// framing, routing, request modifiers, authentication, response control
// and content processing (httpguts.ValidTrailerHeader's list, which
// net/http's server applies to the announced ones, and the cookies,
// authentication and response control fields it lacks).
func answerTrailer(k string, conn []string) bool {
	if !validFieldName(k) {
		return false
	}
	k = http.CanonicalHeaderKey(k) // as it is already, from textproto
	if wire.IsHopHeader(k) || !httpguts.ValidTrailerHeader(k) {
		return false
	}
	switch k {
	case "Set-Cookie", "Cookie", "Authentication-Info", "Proxy-Authentication-Info",
		"Age", "Date", "Expires", "Location", "Retry-After", "Vary", "Warning":
		return false
	}
	for _, v := range conn {
		for name := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(name), k) {
				return false
			}
		}
	}
	return true
}

// copyAnswer copies the answer's body to the client, as the reverse
// proxy's copyBuffer: write errors and read errors but io.EOF are
// returned, read errors are logged.
func (g *Gateway) copyAnswer(w http.ResponseWriter, rc *http.ResponseController, body io.Reader, flush bool) error {
	bp := g.buffers.take()
	defer g.buffers.give(bp)
	buf := *bp
	for {
		nr, rerr := body.Read(buf)
		if rerr != nil && rerr != io.EOF && rerr != context.Canceled {
			g.proxyLog.Printf("httputil: ReverseProxy read error during body copy: %v", rerr)
		}
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			if werr != nil {
				return werr
			}
			if nr != nw {
				return io.ErrShortWrite
			}
			if flush {
				_ = rc.Flush()
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return nil
			}
			return rerr
		}
	}
}

// directHooks hears an exchange of the direct forward.
type directHooks struct {
	w      http.ResponseWriter
	f      *forward
	http10 bool         // the client speaks HTTP/1.0, which has no 1xx
	into   http.Header  // the client's header, empty, for the answer's (AnswerHeader); nil: none
	list   *wire.Fields // the client's answer's list of into's fields (AnswerFields); nil: none
}

var _ engine.Hooks = (*directHooks)(nil)

// AnswerHeader: the client's header, for the answer's fields, if it is
// the forward's to fill.
func (d *directHooks) AnswerHeader() http.Header { return d.into }

// AnswerFields: the list of the client's answer (framing.Verdict.Answer),
// for the fields read into AnswerHeader's map, if it has one.
func (d *directHooks) AnswerFields() *wire.Fields { return d.list }

// WroteHeaders: the request left, and a failure from now on leaves the
// outcome unknown.
func (d *directHooks) WroteHeaders() { d.f.wroteRequest.Store(true) }

// Got1xx forwards an informational answer, as the reverse proxy's trace,
// but for 100 Continue (as continueOnce): the gateway's own server sends
// one to a client that asked when the body is first read, which the
// upstream's 100 triggers. Nor does an HTTP/1.0 client get any (RFC 9110
// 15.2): it would take the 1xx for the final answer, and the final
// answer's bytes for its body or the next answer; net/http's server
// writes one to it all the same, as the reverse proxy has it do. A 1xx
// loses its hop-by-hop fields as the final answer does (RFC 9110 7.6.1;
// the reverse proxy relays them): they were the upstream's to the gateway.
func (d *directHooks) Got1xx(code int, header textproto.MIMEHeader) error {
	if code == http.StatusContinue || d.http10 {
		return nil
	}
	wire.RemoveHopByHop(http.Header(header)) // the 1xx's own map
	h := d.w.Header()
	for k, vv := range header {
		for _, v := range vv {
			h.Add(k, v)
		}
	}
	d.w.WriteHeader(code)
	clear(h) // WriteHeader does not, for a 1xx
	return nil
}

var teTrailers = []string{"trailers"}

// forwardingHeader reports whether a field named k (canonical) is one the
// gateway drops from a request and sets itself (rewrite): the fencing
// fields, Forwarded, X-Forwarded-* and X-Real-Ip.
func forwardingHeader(k string) bool {
	return strings.HasPrefix(k, "Fencing-") || strings.HasPrefix(k, "X-Forwarded-") || k == "Forwarded" || k == "X-Real-Ip"
}

// eventStream reports whether a Content-Type is text/event-stream, as the
// reverse proxy decides it (mime.ParseMediaType), parsing only the values
// that could be.
func eventStream(ct string) bool {
	if !containsFold(ct, "event-stream") {
		return false
	}
	base, _, _ := mime.ParseMediaType(ct)
	return base == "text/event-stream"
}

// containsFold: s contains sub (lower-case ASCII) in any ASCII case.
func containsFold(s, sub string) bool {
	first := sub[0] // a letter: |0x20 folds its upper case, and no other byte, to it
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i]|0x20 == first && strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}
