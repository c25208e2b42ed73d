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
		if resp := readHead(c.br, req, c.into, c.intoList, true); resp != nil {
			return resp, nil
		}
	} else if resp := readHead(c.br, req, c.header(), nil, false); resp != nil {
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
func readHead(br *bufio.Reader, req *http.Request, hdr http.Header, list *wire.Fields, hop bool) *http.Response {
	var h headScan
	if br.Buffered() == 0 { // as it is when an answer is awaited: no scan of nothing
		if _, err := br.Peek(1); err != nil {
			return nil // ReadResponse meets the same end
		}
	}
	var buf []byte
	for {
		buf, _ = br.Peek(br.Buffered())
		h.scan(buf)
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

	head := string(buf[:h.end])
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
	var pragma, connection, hopField bool
	if list != nil {
		*list = (*list)[:0] // filled below for the common answer only
	}
	if h.distinct && h.fields <= len(h.lines) {
		// Known names, none repeated (the common answer's): each is its
		// key, and which fields the head has is in h.seen. The general
		// loop (readFields) cost 70 instructions a field more.
		connection = h.seen&(1<<nameConnection) != 0
		hopField = connection || h.seen&(1<<nameKeepAlive) != 0
		var listed wire.Fields // nil: not listed
		if list != nil && !(hop && hopField) {
			listed = *list
		}
		for i := range h.fields {
			l := &h.lines[i]
			vals[i] = head[l.value:l.valueEnd]
			name, vv := knownNames[l.known], vals[i:i+1:i+1]
			hdr[name] = vv
			if listed != nil {
				listed = append(listed, wire.Field{Name: name, Values: vv})
			}
		}
		if listed != nil {
			*list = listed
		}
	} else {
		pragma, connection, hopField = readFields(head, &h, hdr, vals)
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

// readFields reads the field lines of head, scanned by h, into hdr, the
// values' slices from vals (one each), and reports whether it has the
// fields readHead asks about.
func readFields(head string, h *headScan, hdr http.Header, vals []string) (pragma, connection, hopField bool) {
	// A repeated name is found among the names taken so far (a few), not
	// by a lookup of each; so are the two fields asked about below.
	var names [answerFields]string
	taken := names[:0]
	for i, start := 0, h.rest; i < h.fields; i++ {
		var key, value string
		if i < len(h.lines) {
			l := &h.lines[i]
			if key = knownNames[l.known]; key == "" {
				key = wire.CanonicalKey(head[l.name:l.colon])
			}
			value = head[l.value:l.valueEnd]
		} else { // past the lines scan kept
			eol := start + indexCRLF(head[start:])
			colon := start + indexColon(head[start:eol])
			key, value = wire.CanonicalKey(head[start:colon]), trimOWS(head[colon+1:eol])
			start = eol + 2
		}
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
			hopField = true // (Transfer-Encoding is ReadResponse's: scan)
		}
		vals[0] = value
		hdr[key], vals = vals[:1:1], vals[1:]
	}
	return pragma, connection, hopField
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
// value slices are one allocation (answer), and whose lines' parts
// readHead takes from scan.
const answerFields = 8

// answer is a Response and the array of its header's value slices.
type answer struct {
	resp http.Response
	vals [answerFields]string
}

// headScan is what scan found in a buffer.
type headScan struct {
	state     int
	end       int   // the head's length, with its empty line
	statusEnd int   // where the status line's CRLF begins
	code      int   // the status code
	fields    int   // header lines
	length    int64 // the Content-Length, -1 if none
	// distinct: every field's name is a known one (knownName), none
	// repeated (seen: bit k, knownNames[k] was), so that readHead need
	// canonicalize no name and look for no repeated one.
	distinct bool
	seen     uint32
	// lines are the first field lines' parts, from the head's start, so
	// that readHead need not look for them again; rest is where the line
	// after them begins.
	lines [answerFields]fieldLine
	rest  int
}

// fieldLine is where a field line's parts are.
type fieldLine struct {
	name, colon     int32 // the name, if it is not known
	value, valueEnd int32 // the value, without OWS
	known           uint8 // the name's index in knownNames, 0 if none
}

const (
	headPartial  = iota // all complete lines are accepted; more to read
	headComplete        // the whole head is there, and accepted
	headRefused         // ReadResponse's to read
)

// scan checks the lines of buf against the common case (and a line not
// yet complete, as far as it goes: what it refuses there is
// ReadResponse's to read, so nothing is waited for): "HTTP/1.1 " 3DIGIT
// (200 to 599) SP reason CRLF, then field lines token ":" OWS value OWS
// CRLF (no obs-fold, no control bytes but HTAB, no Transfer-Encoding, at
// most one Content-Length of at most 18 digits), then CRLF. Each line is
// read once, a byte's worth of work each for its name (none for a known
// one's: knownName) and an eighth for its value (lineEnd): a pass that
// found each line's end and colon with IndexByte, then checked their
// bytes and compared the name with the two asked about cost 600
// instructions more for an answer of three fields (BenchmarkReadAnswer),
// and readHead canonicalized and trimmed again.
func (h *headScan) scan(buf []byte) {
	h.state, h.fields, h.length, h.distinct, h.seen = headPartial, 0, -1, true, 0
	if len(buf) < len("HTTP/1.1 200 ") {
		if bytes.IndexByte(buf, '\n') >= 0 {
			h.state = headRefused // a line too short to be a status line
		}
		return
	}
	d0, d1, d2 := buf[9], buf[10], buf[11]
	if string(buf[:len("HTTP/1.1 ")]) != "HTTP/1.1 " || d0 < '2' || d0 > '5' || !isDigit(d1) || !isDigit(d2) || buf[12] != ' ' {
		h.state = headRefused
		return
	}
	h.code = int(d0-'0')*100 + int(d1-'0')*10 + int(d2-'0')
	pos := lineEnd(buf, len("HTTP/1.1 200 "))
	if pos < 0 {
		h.state = headRefused
		return
	}
	if pos == len(buf) {
		return
	}
	h.statusEnd = pos
	pos += 2
	for {
		if pos >= len(buf) {
			return
		}
		if buf[pos] == '\r' {
			if pos+1 < len(buf) {
				if buf[pos+1] != '\n' {
					h.state = headRefused
					return
				}
				h.state, h.end = headComplete, pos+2
			}
			return
		}
		known := knownName(buf[pos:])
		colon := pos + len(knownNames[known])
		isLength := known == nameContentLength
		if known != 0 {
			if h.seen&(1<<known) != 0 {
				h.distinct = false
			}
			h.seen |= 1 << known
		} else {
			for colon < len(buf) && wire.TokenByte[buf[colon]] {
				colon++
			}
			if colon == len(buf) {
				return
			}
			if colon == pos || buf[colon] != ':' {
				h.state = headRefused // also a leading space: obs-fold
				return
			}
			name := buf[pos:colon]
			if asciiEqualFold(name, "Transfer-Encoding") {
				h.state = headRefused
				return
			}
			isLength = asciiEqualFold(name, "Content-Length")
			h.distinct = false
		}
		v := colon + 1
		for v < len(buf) && (buf[v] == ' ' || buf[v] == '\t') {
			v++
		}
		eol := lineEnd(buf, v)
		if eol < 0 {
			h.state = headRefused
			return
		}
		if eol == len(buf) {
			return
		}
		ve := eol
		for ve > v && (buf[ve-1] == ' ' || buf[ve-1] == '\t') {
			ve--
		}
		if isLength {
			if h.length >= 0 || ve == v || ve-v > 18 {
				h.state = headRefused
				return
			}
			h.length = 0
			for _, c := range buf[v:ve] {
				if !isDigit(c) {
					h.state = headRefused
					return
				}
				h.length = h.length*10 + int64(c-'0')
			}
		}
		if h.fields < len(h.lines) {
			h.lines[h.fields] = fieldLine{int32(pos), int32(colon), int32(v), int32(ve), uint8(known)}
		}
		pos = eol + 2
		if h.fields++; h.fields == len(h.lines) {
			h.rest = pos
		}
	}
}

// lineEnd returns where the value (or reason) from i in b ends, at the CR
// of its line's CRLF, if each of its bytes is a value's
// (httpguts.ValidHeaderFieldValue's, textproto's too: no control byte but
// HTAB; obs-text allowed); -1 if one is not, or the CR is not followed by
// LF; len(b) if the line is not complete. The bytes are passed over eight
// at a time up to the first that is not printable ASCII
// (wire.Unprintable): the CR that ends the line, else a tab or obs-text
// (taken) or a refused byte.
func lineEnd(b []byte, i int) int {
	for {
		if i = wire.Unprintable(b, i); i >= len(b) {
			return len(b)
		}
		switch c := b[i]; {
		case c == '\r':
			if i+1 == len(b) {
				return len(b)
			}
			if b[i+1] != '\n' {
				return -1
			}
			return i
		case c >= ' ' && c != 0x7f || c == '\t':
			i++
		default:
			return -1
		}
	}
}

// knownNames are the field names of nearly every answer, by index, as
// a header map keys them (canonical): readHead takes such a name as its
// key, where it checked each byte of a name and canonicalized it
// (CanonicalKey).
var knownNames = [...]string{
	nameContentType: "Content-Type", nameContentLength: "Content-Length", nameDate: "Date", nameServer: "Server",
	nameCacheControl: "Cache-Control", nameEtag: "Etag", nameLastModified: "Last-Modified", nameVary: "Vary",
	nameConnection: "Connection", nameKeepAlive: "Keep-Alive", nameXRequestID: "X-Request-Id",
	nameLocation: "Location", nameExpires: "Expires", nameContentEncoding: "Content-Encoding",
}

const (
	nameContentType = 1 + iota // 0: none
	nameContentLength
	nameDate
	nameServer
	nameCacheControl
	nameEtag
	nameLastModified
	nameVary
	nameConnection
	nameKeepAlive
	nameXRequestID
	nameLocation
	nameExpires
	nameContentEncoding
)

// knownName is the index in knownNames of the name, followed by its
// colon, at the start of b (as written there, or as commonly written
// otherwise: ETag, X-Request-ID, which canonicalize to it), 0 if none
// is: a switch on the first byte, then a comparison of one or two words
// for each name it may be (colonAt).
func knownName(b []byte) int {
	if len(b) < len("Date:") {
		return 0
	}
	switch b[0] {
	case 'C':
		switch {
		case colonAt(b, 12) && string(b[:12]) == "Content-Type":
			return nameContentType
		case colonAt(b, 14) && string(b[:14]) == "Content-Length":
			return nameContentLength
		case colonAt(b, 13) && string(b[:13]) == "Cache-Control":
			return nameCacheControl
		case colonAt(b, 10) && string(b[:10]) == "Connection":
			return nameConnection
		case colonAt(b, 16) && string(b[:16]) == "Content-Encoding":
			return nameContentEncoding
		}
	case 'D':
		if colonAt(b, 4) && string(b[:4]) == "Date" {
			return nameDate
		}
	case 'S':
		if colonAt(b, 6) && string(b[:6]) == "Server" {
			return nameServer
		}
	case 'E':
		switch {
		case colonAt(b, 4) && string(b[:4]) == "Etag", colonAt(b, 4) && string(b[:4]) == "ETag":
			return nameEtag
		case colonAt(b, 7) && string(b[:7]) == "Expires":
			return nameExpires
		}
	case 'L':
		switch {
		case colonAt(b, 13) && string(b[:13]) == "Last-Modified":
			return nameLastModified
		case colonAt(b, 8) && string(b[:8]) == "Location":
			return nameLocation
		}
	case 'V':
		if colonAt(b, 4) && string(b[:4]) == "Vary" {
			return nameVary
		}
	case 'K':
		if colonAt(b, 10) && string(b[:10]) == "Keep-Alive" {
			return nameKeepAlive
		}
	case 'X':
		if colonAt(b, 12) && string(b[:12]) == "X-Request-Id" || colonAt(b, 12) && string(b[:12]) == "X-Request-ID" {
			return nameXRequestID
		}
	}
	return 0
}

// colonAt reports whether b has a colon at n. (The names are compared
// where knownName names them: a constant compared with a string is one or
// two comparisons of words, a name passed to a function is a memequal
// call, 25 instructions.)
func colonAt(b []byte, n int) bool { return len(b) > n && b[n] == ':' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

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

// trimOWS trims spaces and tabs at both ends, as textproto trims a
// field line and its value.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
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
