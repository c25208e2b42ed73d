package engine

// The reader of the upstream's answer head: net/http's ReadResponse for
// the common answer (HTTP/1.1, a final status, plain header fields, a
// body framed by Content-Length or none), without its allocations (a
// textproto reader, a string per value, a transfer reader, a LimitReader
// and a body wrapper), the precedent being writeHead (write.go) on the
// request side. Every other answer (1xx, HTTP/1.0, chunked, a body
// delimited by the connection's close, anything odd or larger than the
// connection's read buffer) is read by ReadResponse itself, from the same
// reader, untouched: the engine's own parse only ever accepts what
// ReadResponse would read to the same Response, and otherwise steps
// aside. TestReadAnswerMatchesReadResponse and FuzzReadAnswer hold it to
// that.
//
// One thing of the head ReadResponse drops, the engine keeps: the
// Connection field, which ReadResponse takes out of an HTTP/1.1 answer's
// header when it names close (setting Close), with the other names it
// lists. Those name hop-by-hop fields (RFC 9110 7.6.1), which a proxy
// must not pass on: without the field, "Connection: close, X-Secret"
// would carry X-Secret to the client (as it does through
// httputil.ReverseProxy over the Transport). So readHead leaves the field
// in, and an answer ReadResponse reads is recorded as it is read
// (engineConn.rec) and, if it lost the field, the field is read again
// from the recorded head with textproto, ReadResponse's own reader.
//
// What the Response references outlives the connection's next exchange:
// forwardDirect hands its header's slices to the client's header map, and
// net/http may write them after the connection went back to the pool. So
// the head is copied once, into one string per answer, of which the
// status, the keys (when already canonical) and the values are
// substrings; the value slices share one array per answer, each capped at
// its length so that an append to one never writes into the next. The
// header map itself is the connection's, lent as its body is (Exchange):
// forwardDirect copies its slices out before it closes the body; or the
// client's own, which the exchange's hooks lend (Hooks.AnswerHeader), and
// then nothing is copied.

import (
	"bufio"
	"bytes"
	"net/http"
	"net/textproto"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// readAnswer reads the head of the upstream's answer to req from c.br:
// the common case by readHead (into c's header map), every other by
// http.ReadResponse. A Response with a nil Body is one whose body the
// engine frames itself (engineBody): the next ContentLength bytes of
// c.br. Its Header keeps its Connection field (above).
func readAnswer(c *engineConn, req *http.Request) (*http.Response, error) {
	if c.into != nil {
		if resp := readHead(c.br, req, c.into, true); resp != nil {
			return resp, nil
		}
	} else if resp := readHead(c.br, req, c.header(), false); resp != nil {
		return resp, nil
	}
	buffered, _ := c.br.Peek(c.br.Buffered()) // where the head begins
	c.rec = append(c.rec[:0], buffered...)
	c.recording = true
	resp, err := http.ReadResponse(c.br, req)
	c.recording = false
	if err == nil && resp.Close && resp.Header["Connection"] == nil {
		if conn := connectionField(c.rec); conn != nil {
			resp.Header["Connection"] = conn
		}
	}
	if cap(c.rec) > 64<<10 {
		c.rec = nil // a large head's: not kept with the connection
	}
	return resp, err
}

// connectionField returns the Connection field of the answer head at the
// start of b, read as ReadResponse reads it (textproto).
func connectionField(b []byte) []string {
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(b)))
	if _, err := tp.ReadLine(); err != nil {
		return nil
	}
	h, _ := tp.ReadMIMEHeader()
	return h["Connection"]
}

// readHead parses the answer's head in br's buffer and consumes it, or
// returns nil and leaves br as it found it but for bytes read into its
// buffer. It reads more only while every complete line so far is one it
// accepts (where ReadResponse too would read on), so it never waits for
// bytes ReadResponse would not have waited for. The answer's header is hdr,
// emptied first, if it is not nil (a map lent by the caller), else a new
// map. hop: the answer's hop-by-hop fields are removed from it, and those
// its Connection field names (wire.RemoveHopByHop), as a proxy removes
// them before the answer goes on; else they are kept.
func readHead(br *bufio.Reader, req *http.Request, hdr http.Header, hop bool) *http.Response {
	var h headScan
	for {
		buf, _ := br.Peek(br.Buffered())
		h = scanHead(buf)
		if h.state == headRefused {
			return nil
		}
		if h.state == headComplete {
			break
		}
		if len(buf) >= br.Size() {
			return nil // larger than the buffer: ReadResponse's
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			return nil // ReadResponse meets the same end (or the bytes before it)
		}
	}
	method := "GET" // readTransfer's, without a request
	if req != nil {
		method = req.Method
	}
	noBody := method == "HEAD" || h.code == http.StatusNoContent || h.code == http.StatusNotModified
	if !noBody && h.length < 0 {
		return nil // a body delimited by the connection's close
	}

	buf, _ := br.Peek(h.end)
	head := string(buf)
	// The Response and the value slices' array, in one allocation for a
	// head of a few fields (the common answer's).
	var resp *http.Response
	var vals []string
	if h.fields <= len(answer{}.vals) {
		a := &answer{}
		resp, vals = &a.resp, a.vals[:h.fields]
	} else {
		resp, vals = &http.Response{}, make([]string, h.fields)
	}
	*resp = http.Response{
		Status:     head[len("HTTP/1.1 "):h.statusEnd],
		StatusCode: h.code,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Request:    req,
	}
	if hdr == nil {
		hdr = make(http.Header, h.fields)
	} else {
		clear(hdr)
	}
	// A repeated name is found among the names taken so far (a few), not
	// by a lookup of each; so are the two fields asked about below.
	var names [answerFields]string
	taken := names[:0]
	pragma, connection, hopField := false, false, false
	for i, start := 0, h.statusEnd+2; start < h.end-2; i++ {
		var eol, colon int
		if i < len(h.lines) {
			eol, colon = int(h.lines[i].eol), int(h.lines[i].colon)
		} else {
			eol = start + indexCRLF(head[start:])
			colon = start + indexColon(head[start:eol])
		}
		key := wire.CanonicalKey(head[start:colon])
		value := trimOWS(head[colon+1 : eol])
		start = eol + 2
		if repeated(taken, key) {
			hdr[key] = append(hdr[key], value)
			continue
		}
		if len(taken) < len(names) {
			taken = append(taken, key)
		} else if _, ok := hdr[key]; ok { // past the names kept: a lookup
			hdr[key] = append(hdr[key], value)
			continue
		}
		switch key {
		case "Pragma":
			pragma = true
		case "Connection":
			connection, hopField = true, true
		case "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Upgrade":
			hopField = true // (Transfer-Encoding is ReadResponse's: scanHead)
		}
		vals[0] = value
		hdr[key], vals = vals[:1:1], vals[1:]
	}
	// ReadResponse's fixPragmaCacheControl.
	if pragma && hdr["Pragma"][0] == "no-cache" {
		if _, ok := hdr["Cache-Control"]; !ok {
			hdr["Cache-Control"] = []string{"no-cache"}
		}
	}
	// shouldClose for HTTP/1.1, but the Connection field is kept (above).
	resp.Close = connection && httpguts.HeaderValuesContainsToken(hdr["Connection"], "close")
	if hop && hopField {
		wire.RemoveHopByHop(hdr)
	}
	resp.Header = hdr
	switch {
	case method == "HEAD":
		resp.ContentLength, resp.Body = h.length, http.NoBody // -1 if none
	case noBody || h.length == 0:
		resp.Body = http.NoBody
	default:
		resp.ContentLength = h.length // Body nil: engineBody frames it
	}
	_, _ = br.Discard(h.end)
	return resp
}

// repeated reports whether key is one of names.
func repeated(names []string, key string) bool {
	for _, n := range names {
		if n == key {
			return true
		}
	}
	return false
}

// answerFields is the most header lines of an answer whose Response and
// value slices are one allocation (answer), and whose lines' ends
// readHead takes from scanHead.
const answerFields = 8

// answer is a Response and the array of its header's value slices.
type answer struct {
	resp http.Response
	vals [answerFields]string
}

// headScan is what scanHead found in a buffer.
type headScan struct {
	state     int
	end       int   // the head's length, with its empty line
	statusEnd int   // where the status line's CRLF begins
	code      int   // the status code
	fields    int   // header lines
	length    int64 // the Content-Length, -1 if none
	// lines are the first field lines' ends (where their CR is) and
	// colons, from the head's start, so that readHead need not look for
	// them again.
	lines [answerFields]struct{ eol, colon int32 }
}

const (
	headPartial  = iota // all complete lines are accepted; more to read
	headComplete        // the whole head is there, and accepted
	headRefused         // ReadResponse's to read
)

// scanHead checks the complete lines of buf against the common case:
// "HTTP/1.1 " 3DIGIT (200 to 599) SP reason CRLF, then field lines
// token ":" OWS value OWS CRLF (no obs-fold, no control bytes but HTAB,
// no Transfer-Encoding, at most one Content-Length of at most 18 digits),
// then CRLF.
func scanHead(buf []byte) headScan {
	h := headScan{length: -1}
	eol := bytes.IndexByte(buf, '\n')
	if eol < 0 {
		return h
	}
	line := buf[:eol]
	if len(line) < len("HTTP/1.1 200 \r") || string(line[:len("HTTP/1.1 ")]) != "HTTP/1.1 " || line[len(line)-1] != '\r' || line[12] != ' ' {
		return headScan{state: headRefused}
	}
	d0, d1, d2 := line[9], line[10], line[11]
	if d0 < '2' || d0 > '5' || !isDigit(d1) || !isDigit(d2) || !validValue(line[13:len(line)-1]) {
		return headScan{state: headRefused}
	}
	h.code = int(d0-'0')*100 + int(d1-'0')*10 + int(d2-'0')
	h.statusEnd = eol - 1
	pos := eol + 1
	for {
		eol := bytes.IndexByte(buf[pos:], '\n')
		if eol < 0 {
			return h
		}
		line := buf[pos : pos+eol]
		pos += eol + 1
		if len(line) == 0 || line[len(line)-1] != '\r' {
			return headScan{state: headRefused} // a bare LF
		}
		line = line[:len(line)-1]
		if len(line) == 0 {
			h.state, h.end = headComplete, pos
			return h
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validName(line[:colon]) || !validValue(line[colon+1:]) {
			return headScan{state: headRefused} // also a leading space: obs-fold
		}
		if h.fields < len(h.lines) {
			start := pos - eol - 1
			h.lines[h.fields].eol, h.lines[h.fields].colon = int32(start+len(line)), int32(start+colon)
		}
		name, value := line[:colon], trimOWSBytes(line[colon+1:])
		switch {
		case asciiEqualFold(name, "Transfer-Encoding"):
			return headScan{state: headRefused}
		case asciiEqualFold(name, "Content-Length"):
			if h.length >= 0 || len(value) == 0 || len(value) > 18 {
				return headScan{state: headRefused}
			}
			h.length = 0
			for _, c := range value {
				if !isDigit(c) {
					return headScan{state: headRefused}
				}
				h.length = h.length*10 + int64(c-'0')
			}
		}
		h.fields++
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// validName: a field name, httpguts.ValidHeaderFieldName's bytes.
func validName(b []byte) bool {
	for _, c := range b {
		if !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return len(b) > 0
}

// validValue: httpguts.ValidHeaderFieldValue's bytes (no control byte
// but HTAB; obs-text allowed), which are textproto's too. A plain value
// (wire.PlainValue, eight bytes at a time) is one; obs-text is checked a
// byte at a time.
func validValue(b []byte) bool {
	if wire.PlainValue(b) {
		return true
	}
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// asciiEqualFold: b is s (ASCII letters, digits and '-') in any case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	if string(b) == s {
		return true // as the name is nearly always written: one comparison, not one a byte
	}
	for i := range len(b) {
		if b[i]|0x20 != s[i]|0x20 {
			return false
		}
	}
	return true
}

// trimOWS and trimOWSBytes trim spaces and tabs at both ends, as
// textproto trims a field line and its value.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func trimOWSBytes(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// indexCRLF and indexColon find a scanned line's end and colon (there is
// one of each).
func indexCRLF(s string) int {
	for i := 0; ; i++ {
		if s[i] == '\r' {
			return i
		}
	}
}

func indexColon(s string) int {
	for i := 0; ; i++ {
		if s[i] == ':' {
			return i
		}
	}
}
