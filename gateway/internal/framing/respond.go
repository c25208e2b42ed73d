package framing

// The own loop's answers: an http.ResponseWriter that keeps net/http's
// response rules (its response and chunkWriter, server.go), so that a
// handler's answer reaches the client as Go's server would have written
// it: the status line; the handler's header with what Go adds (Date, a
// Content-Length for a short answer the handler finished, chunking for one
// of unknown length, a sniffed Content-Type, Connection: close when the
// connection ends); 1xx answers; trailers (declared, or TrailerPrefix);
// flushes; ErrContentLength and ErrBodyNotAllowed; the request's unread
// body discarded (at most 256 KiB) before the head, or the connection
// closed. The loop serves HTTP/1.1 requests with a Content-Length alone
// (Own), so the rules for HTTP/1.0, HEAD, chunked bodies and 100 Continue
// are not needed here: Go's server serves those requests.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// net/http's figures: the body buffered before the head is decided
// (bufferBeforeChunkingSize), and the most of a request's unread body read
// after the handler to keep the connection (maxPostHandlerReadBytes).
const (
	bufferBeforeChunking    = 2048
	maxPostHandlerReadBytes = 256 << 10
)

// response is the answer to one request, reused by its connection.
type response struct {
	c    *ownConn
	req  *http.Request
	body *requestBody // nil: the request has no body

	header http.Header // the handler's
	// sent is the header as it was when the final status was given, if
	// the head waits for the body's first bytes (to sniff a type, or to
	// count a short body's length); nil: the head went out at once.
	sent        http.Header
	status      int
	wroteHeader bool // a final status was given
	headOut     bool // its head is in the connection's buffer
	handlerDone bool
	chunking    bool
	closeAfter  bool
	closeWanted bool // the request asks for the connection's close (wantsClose)

	contentLength int64 // declared by the handler, -1 if not
	written       int64
	trailers      []string // declared in Trailer
	// answer lists header's fields when its filler listed them
	// (Verdict.Answer): taken for the header while the two have as many
	// names. Its storage is kept for the connection's next answer.
	answer wire.Fields

	w      *bufio.Writer // the body before its head is decided (net/http's 2048 bytes)
	bodies requestBody   // the request's body, reused

	clenBuf  [20]byte
	chunkBuf [16]byte
}

func (w *response) reset(c *ownConn, req *http.Request) {
	hdr := w.header
	if hdr == nil {
		hdr = make(http.Header)
	} else {
		clear(hdr)
	}
	bw := w.w
	if bw == nil {
		bw = bufio.NewWriterSize(chunkWriter{w}, bufferBeforeChunking)
	}
	answer := w.answer[:0]
	if answer == nil {
		answer = make(wire.Fields, 0, answerListed)
	}
	*w = response{c: c, req: req, header: hdr, contentLength: -1, w: bw, trailers: w.trailers[:0],
		closeWanted: wantsClose(req, &c.leanStore), answer: answer}
	if req.ContentLength > 0 {
		w.bodies = requestBody{r: c.br, n: req.ContentLength}
		w.body = &w.bodies
		req.Body = w.body
	}
}

func (w *response) Header() http.Header { return w.header }

// WriteHeader is net/http's: a 1xx goes out at once with the header as it
// is, a final status is taken once.
func (w *response) WriteHeader(code int) {
	if w.wroteHeader {
		w.c.o.logf("http: superfluous response.WriteHeader call")
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		bw := w.c.bw
		writeStatusLine(bw, code)
		wire.WriteFields(bw, w.header, excludedHeadersNoBody)
		_, _ = bw.WriteString("\r\n")
		_ = bw.Flush()
		return
	}
	w.wroteHeader = true
	w.status = code
	// The head goes out now unless it depends on the body: a Content-Type
	// to sniff, or the length of a short body the handler finishes. Then
	// it is the header as it is now (net/http's snapshot, taken before an
	// invalid Content-Length is dropped from the handler's header).
	h := w.header
	var facts headFacts
	var list wire.Fields
	if a := w.answer; len(a) > 0 && len(a) == len(h) {
		if VerifyLists {
			Verify(a, h, &Taken.Answer, "answer")
		}
		facts, list = factsOfList(a), a // it is this answer's: the head may sort it in place
	} else {
		var fields [16]wire.Field // a header of more fields is listed on the heap
		facts, list = factsOf(h, fields[:0])
	}
	w.answer = w.answer[:0] // the header's from here on, whatever changes it
	later := bodyAllowedForStatus(code) && facts.te == "" &&
		(!facts.haveType && facts.contentEncoding == "" || facts.contentLength == "" && !facts.haveTrailer && !facts.trailerPrefix)
	if later {
		w.sent = h.Clone()
	}
	if cl := facts.contentLength; cl != "" {
		v, ok := plainLength(cl) // the common length, digits alone: ParseInt's sign and range checks cost 120 instructions
		if !ok {
			var err error
			v, err = strconv.ParseInt(cl, 10, 64)
			ok = err == nil && v >= 0
		}
		if ok {
			w.contentLength = v
		} else {
			w.c.o.logf("http: invalid Content-Length of %q", cl)
			h.Del("Content-Length")
			facts.contentLength = ""
			list = nil // the header changed: writeHeadOf walks it again
		}
	}
	if !later {
		w.writeHeadOf(nil, &facts, list)
	}
}

// headFacts is what the response rules ask of a handler's header, read in
// one pass over it (factsOf), where a lookup of each cost more: each
// field's first value, or its presence; and the fields themselves, listed
// in the same pass for the head's writing (writeHeadOf), where a second
// walk of the map cost as much as the first.
type headFacts struct {
	te, contentLength, connection, contentEncoding string
	declared                                       []string // the Trailer field's values
	haveType, haveDate, haveTrailer, haveTE        bool
	trailerPrefix                                  bool // a name with http.TrailerPrefix
}

// answerListed is the capacity of a connection's list of answer fields
// (response.answer): an answer of more is listed on the heap.
const answerListed = 16

// factsOf reads h's facts, and lists its fields after those of list if
// list is not nil (unsorted).
func factsOf(h http.Header, list wire.Fields) (headFacts, wire.Fields) {
	listed := list
	if listed == nil {
		var fields [16]wire.Field // a header of more fields is listed on the heap
		listed = fields[:0]
	}
	for k, vv := range h {
		listed = append(listed, wire.Field{Name: k, Values: vv})
	}
	f := factsOfList(listed)
	if list == nil {
		return f, nil
	}
	return f, listed
}

// factsOfList reads the facts of a header listed as fs.
func factsOfList(fs wire.Fields) headFacts {
	var f headFacts
	for i := range fs {
		k, vv := fs[i].Name, fs[i].Values
		switch k {
		case "Transfer-Encoding":
			f.te, f.haveTE = wire.First(vv), true
		case "Content-Length":
			f.contentLength = wire.First(vv)
		case "Connection":
			f.connection = wire.First(vv)
		case "Content-Type":
			f.haveType = true
		case "Content-Encoding":
			f.contentEncoding = wire.First(vv)
		case "Date":
			f.haveDate = true
		case "Trailer":
			f.declared, f.haveTrailer = vv, true
		default:
			if strings.HasPrefix(k, http.TrailerPrefix) {
				f.trailerPrefix = true
			}
		}
	}
	return f
}

func (w *response) Write(p []byte) (int, error) {
	direct, err := w.take(len(p))
	if err != nil || len(p) == 0 {
		return 0, err
	}
	if direct {
		return w.c.bw.Write(p)
	}
	return w.w.Write(p)
}

func (w *response) WriteString(s string) (int, error) {
	direct, err := w.take(len(s))
	if err != nil || len(s) == 0 {
		return 0, err
	}
	if direct {
		return w.c.bw.WriteString(s)
	}
	return w.w.WriteString(s)
}

// take is net/http's checks before n bytes of body are written (a 200 if
// no status was given, none for a status without a body, no more than a
// declared Content-Length); direct: they may go straight to the
// connection's buffer, as there is nothing to decide and nothing before
// them.
func (w *response) take(n int) (direct bool, err error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if n == 0 {
		return false, nil
	}
	if !bodyAllowedForStatus(w.status) {
		return false, http.ErrBodyNotAllowed
	}
	w.written += int64(n)
	if w.contentLength != -1 && w.written > w.contentLength {
		return false, http.ErrContentLength
	}
	return w.headOut && !w.chunking && w.w.Buffered() == 0, nil
}

func (w *response) Flush() { _ = w.FlushError() }

// FlushError sends what is written so far (http.ResponseController).
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	err := w.w.Flush()
	if !w.headOut {
		w.writeHead(nil)
	}
	if e := w.c.bw.Flush(); err == nil {
		err = e
	}
	return err
}

// SetReadDeadline and SetWriteDeadline are the connection's
// (http.ResponseController).
func (w *response) SetReadDeadline(t time.Time) error  { return w.c.fc.SetReadDeadline(t) }
func (w *response) SetWriteDeadline(t time.Time) error { return w.c.fc.SetWriteDeadline(t) }

// finish ends the answer after the handler returned, and reports whether
// the connection may carry the next request (net/http's finishRequest and
// shouldReuseConnection).
func (w *response) finish() bool {
	w.handlerDone = true
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	_ = w.w.Flush()
	if !w.headOut {
		w.writeHead(nil)
	}
	bw := w.c.bw
	if w.chunking {
		_, _ = bw.WriteString("0\r\n")
		if t := w.finalTrailers(); t != nil {
			_ = t.Write(bw)
		}
		_, _ = bw.WriteString("\r\n")
	}
	_ = bw.Flush()
	if w.body != nil && !w.closeAfter {
		_ = w.body.Close() // the rest of the body, if the handler read on after the head
	}
	switch {
	case w.closeAfter,
		w.contentLength != -1 && bodyAllowedForStatus(w.status) && w.contentLength != w.written,
		w.c.we.err != nil,
		w.body != nil && w.body.earlyClosed:
		return false
	}
	return true
}

// chunkWriter takes the body from the response's 2048-byte buffer: the
// head is decided on its first bytes, then each write is a chunk if the
// answer is chunked.
type chunkWriter struct{ w *response }

func (cw chunkWriter) Write(p []byte) (int, error) {
	w := cw.w
	if !w.headOut {
		w.writeHead(p)
	}
	bw := w.c.bw
	if w.chunking {
		_, _ = bw.Write(strconv.AppendUint(w.chunkBuf[:0], uint64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
	}
	n, err := bw.Write(p)
	if w.chunking && err == nil {
		_, err = bw.WriteString("\r\n")
	}
	return n, err
}

// writeHead writes the head to the connection's buffer: net/http's
// chunkWriter.writeHeader, for an HTTP/1.1 request that is not HEAD. p is
// the body's first bytes (to sniff a type from, and, once the handler is
// done, the whole body).
func (w *response) writeHead(p []byte) { w.writeHeadOf(p, nil, nil) }

// writeHeadOf is writeHead with the facts of the header it writes and its
// fields, if the caller has them (nil: read here).
func (w *response) writeHeadOf(p []byte, facts *headFacts, fields wire.Fields) {
	w.headOut = true
	header, owned := w.sent, w.sent != nil
	if !owned {
		header = w.header
	}
	var excluded [4]string
	exclude := excluded[:0]
	del := func(key string) {
		if owned {
			header.Del(key)
			return
		}
		if _, ok := header[key]; !ok {
			return
		}
		exclude = append(exclude, key)
	}
	var set extraHeader

	// One pass over the header finds every field the rules below ask
	// about, where a lookup of each cost more than the pass.
	if facts == nil {
		f, _ := factsOf(header, nil)
		facts = &f
	}
	te, contentLength, connection, contentEncoding := facts.te, facts.contentLength, facts.connection, facts.contentEncoding
	haveType, haveDate, trailers := facts.haveType, facts.haveDate, facts.trailerPrefix
	if trailers {
		for k := range header {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				exclude = append(exclude, k)
			}
		}
	}
	for _, v := range facts.declared {
		trailers = true
		foreachHeaderElement(v, w.declareTrailer)
	}

	hasTE := te != ""
	if w.handlerDone && !trailers && !hasTE && bodyAllowedForStatus(w.status) && contentLength == "" {
		w.contentLength = int64(len(p))
		set.contentLength = strconv.AppendInt(w.clenBuf[:0], int64(len(p)), 10)
	}
	hasCL := w.contentLength != -1

	keepAlives := !w.c.o.closing()
	if w.closeWanted {
		w.closeAfter = true
	}
	if connection == "close" || !keepAlives {
		w.closeAfter = true
	}

	// The request's body: read what the handler left (at most 256 KiB)
	// before the answer, so the next request can follow, or close.
	if b := w.body; b != nil && !w.closeAfter {
		var discard, tooBig bool
		switch {
		case b.closed:
			if !b.sawEOF {
				w.closeAfter = true
			}
		case b.n >= maxPostHandlerReadBytes:
			tooBig = true
		default:
			discard = true
		}
		if discard {
			_, err := io.CopyN(io.Discard, b, maxPostHandlerReadBytes+1)
			switch err {
			case nil:
				tooBig = true
			case http.ErrBodyReadAfterClose:
			case io.EOF:
				_ = b.Close()
			default:
				w.closeAfter = true
			}
		}
		if tooBig {
			w.closeAfter = true
			del("Connection")
			if owned {
				connection = "" // gone from the header read again below
			}
			set.connection = "close"
		}
	}

	code := w.status
	if bodyAllowedForStatus(code) {
		if !haveType && !hasTE && len(p) > 0 && contentEncoding == "" {
			set.contentType = http.DetectContentType(p)
		}
	} else {
		for _, k := range suppressedHeaders(code) {
			del(k)
		}
	}
	if !haveDate {
		set.date = httpDate(time.Now())
	}
	if hasCL && hasTE && te != "identity" {
		w.c.o.logf("http: WriteHeader called with both Transfer-Encoding of %q and a Content-Length of %d", te, w.contentLength)
		del("Content-Length")
		hasCL = false
	}
	// A header without Transfer-Encoding (the facts say: nearly every
	// answer's) has none to take out: no lookup of it.
	delTE := func() {
		if facts.haveTE {
			del("Transfer-Encoding")
		}
	}
	switch {
	case !bodyAllowedForStatus(code) || code == http.StatusNoContent:
		delTE()
	case hasCL:
		delTE()
	case hasTE && te == "identity":
		w.chunking = false
		w.closeAfter = true
		delTE()
	default:
		w.chunking = true
		set.transferEncoding = "chunked"
		if hasTE && te == "chunked" {
			delTE()
		}
	}
	if w.chunking {
		del("Content-Length")
	}
	if w.closeAfter && (!keepAlives || !hasToken(connection, "close")) {
		del("Connection")
		set.connection = "close"
	}

	bw := w.c.bw
	writeStatusLine(bw, code)
	if fields != nil && !owned {
		// The fields factsOf listed are the header's still: a field the
		// rules above take out of a header not owned is excluded, not
		// deleted.
		wire.WriteSortedIn(bw, fields, exclude, &w.c.answerOrder)
	} else {
		wire.WriteFields(bw, header, exclude)
	}
	set.write(bw)
	_, _ = bw.WriteString("\r\n")
}

func (w *response) declareTrailer(k string) {
	k = http.CanonicalHeaderKey(k)
	if !httpguts.ValidTrailerHeader(k) {
		return
	}
	w.trailers = append(w.trailers, k)
}

func (w *response) finalTrailers() http.Header {
	var t http.Header
	for k, vv := range w.header {
		if kk, found := strings.CutPrefix(k, http.TrailerPrefix); found {
			if t == nil {
				t = make(http.Header)
			}
			t[kk] = vv
		}
	}
	for _, k := range w.trailers {
		if t == nil {
			t = make(http.Header)
		}
		for _, v := range w.header[k] {
			t.Add(k, v)
		}
	}
	return t
}

// extraHeader is what net/http adds to a handler's header, in its order.
type extraHeader struct {
	contentType, connection, transferEncoding string
	date, contentLength                       []byte
}

func (h extraHeader) write(bw *bufio.Writer) {
	if h.date != nil {
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.Write(h.date)
		_, _ = bw.WriteString("\r\n")
	}
	if h.contentLength != nil {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(h.contentLength)
		_, _ = bw.WriteString("\r\n")
	}
	for i, v := range [...]string{h.contentType, h.connection, h.transferEncoding} {
		if v != "" {
			_, _ = bw.WriteString([...]string{"Content-Type: ", "Connection: ", "Transfer-Encoding: "}[i])
			_, _ = bw.WriteString(v)
			_, _ = bw.WriteString("\r\n")
		}
	}
}

var excludedHeadersNoBody = []string{"Content-Length", "Transfer-Encoding"}

// writeStatusLine is net/http's, for HTTP/1.1.
func writeStatusLine(bw *bufio.Writer, code int) {
	switch code { // the answers to most writes, in one write each
	case http.StatusOK:
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\n")
		return
	case http.StatusCreated:
		_, _ = bw.WriteString("HTTP/1.1 201 Created\r\n")
		return
	case http.StatusNoContent:
		_, _ = bw.WriteString("HTTP/1.1 204 No Content\r\n")
		return
	}
	_, _ = bw.WriteString("HTTP/1.1 ")
	if text := http.StatusText(code); text != "" {
		_ = bw.WriteByte(byte('0' + code/100))
		_ = bw.WriteByte(byte('0' + code/10%10))
		_ = bw.WriteByte(byte('0' + code%10))
		_ = bw.WriteByte(' ')
		_, _ = bw.WriteString(text)
		_, _ = bw.WriteString("\r\n")
	} else {
		_, _ = fmt.Fprintf(bw, "%03d status code %d\r\n", code, code)
	}
}

// bodyAllowedForStatus is net/http's.
func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199:
		return false
	case status == 204:
		return false
	case status == 304:
		return false
	}
	return true
}

// suppressedHeaders is net/http's.
func suppressedHeaders(status int) []string {
	switch {
	case status == 304:
		return []string{"Content-Type", "Content-Length", "Transfer-Encoding"}
	case !bodyAllowedForStatus(status):
		return []string{"Content-Length", "Transfer-Encoding"}
	}
	return nil
}

// httpDate is now as a Date field's value (http.TimeFormat), as net/http's
// server writes it. It is formatted once a second, for every answer in
// that second, as fasthttp and nginx do; the bytes are never changed.
func httpDate(now time.Time) []byte {
	sec := now.Unix()
	d := lastDate.Load()
	if d == nil || d.sec != sec {
		d = &dateStamp{sec: sec, text: now.UTC().AppendFormat(nil, http.TimeFormat)}
		lastDate.Store(d)
	}
	return d.text
}

// dateStamp is a second's Date value.
type dateStamp struct {
	sec  int64
	text []byte
}

var lastDate atomic.Pointer[dateStamp]

// wantsClose is net/http's Request.wantsClose, for HTTP/1.1: r.Close, or
// a Connection field of r's header naming close, read as Go's server reads
// it, before the handler runs (a handler that sets the field does not
// close the connection). A head the loop parsed itself into lr without a
// Connection field wants no close: no lookup of the field.
func wantsClose(r *http.Request, lr *leanRequest) bool {
	if r.Close {
		return true
	}
	if r == &lr.req && !lr.connection {
		return false
	}
	return hasToken(wire.Get(r.Header, "Connection"), "close")
}

// hasToken is net/http's: whether the comma-separated list v names token,
// case-insensitively.
func hasToken(v, token string) bool {
	if len(token) > len(v) || token == "" {
		return false
	}
	if v == token {
		return true
	}
	for sp := 0; sp <= len(v)-len(token); sp++ {
		if b := v[sp]; b != token[0] && b|0x20 != token[0] {
			continue
		}
		if sp > 0 && !isTokenBoundary(v[sp-1]) {
			continue
		}
		if endPos := sp + len(token); endPos != len(v) && !isTokenBoundary(v[endPos]) {
			continue
		}
		if strings.EqualFold(v[sp:sp+len(token)], token) {
			return true
		}
	}
	return false
}

func isTokenBoundary(b byte) bool { return b == ' ' || b == ',' || b == '\t' }

// foreachHeaderElement is net/http's.
func foreachHeaderElement(v string, fn func(string)) {
	v = strings.TrimSpace(v)
	if v == "" {
		return
	}
	if !strings.Contains(v, ",") {
		fn(v)
		return
	}
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			fn(f)
		}
	}
}

// requestBody is the body of a request the loop serves, framed by its
// Content-Length (net/http's body over a LimitedReader, with its server's
// early close).
type requestBody struct {
	mu          sync.Mutex
	r           io.Reader
	n           int64 // bytes left
	sawEOF      bool
	closed      bool
	earlyClosed bool // closed with more than 256 KiB unread: the connection ends
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.readLocked(p)
}

func (b *requestBody) readLocked(p []byte) (int, error) {
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.sawEOF || b.n <= 0 {
		b.sawEOF = true
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err == io.EOF {
		// The client went before the body's end: no more of it will come
		// (net/http counts that as the body's end too, for what follows).
		b.sawEOF = true
		if b.n > 0 {
			err = io.ErrUnexpectedEOF
		}
	}
	if err == nil && b.n == 0 {
		err, b.sawEOF = io.EOF, true
	}
	return n, err
}

// readToEnd reports whether the whole body was read: the connection's
// next bytes are not the body's.
func (b *requestBody) readToEnd() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sawEOF || b.n <= 0
}

// Close is net/http's server-side close: the rest of the body is read and
// dropped if it is at most 256 KiB, else the connection will not carry
// another request.
func (b *requestBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	var err error
	switch {
	case b.sawEOF:
	case b.n > maxPostHandlerReadBytes:
		b.earlyClosed = true
	default:
		var buf [512]byte
		for err == nil {
			_, err = b.readLocked(buf[:])
		}
		if err == io.EOF {
			err = nil
		}
	}
	b.closed = true
	return err
}

// logf writes to Go's server's error log, as Go's server does.
func (o *ownLoop) logf(format string, args ...any) {
	if o.srv.ErrorLog != nil {
		o.srv.ErrorLog.Printf(format, args...)
	}
}
