package framing

// The scanner: follows the requests of an HTTP/1 byte stream as Go's
// server parses them, and notes each head's request line and framing
// fields for Check (framing.go).

import (
	"bytes"
	"math"
	"net/http"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// head is what the scanner saw in one request's head.
type head struct {
	lineHash uint64 // FNV-1a of the request line as Go's parser gets it
	lineLen  int
	length   int64 // the Content-Length value, if hasCL
	flags    uint8
	bad      string // why the gateway refuses the head, "" if it does not
	badField string // the field bad names
	// lean: the own loop parsed this head itself, from the bytes it would
	// have been scanned from (takeHead): lineHash is not computed, as the
	// request's line is those bytes.
	lean bool
	// fields: a lean head's fields but Host, in the order sent, as the
	// request's header holds them (leanRequest.fields); nil if not lean or
	// not all listed.
	fields []wire.Field
	// answer: for a lean head, the list its answer's fields may be listed
	// in (response.answer); nil otherwise.
	answer *wire.Fields
	// neverDone: for a lean head, its request's context is never
	// cancelled (its Done is nil).
	neverDone bool
}

// Flags of head.
const (
	hasCL uint8 = 1 << iota // a Content-Length field
	hasTE                   // a Transfer-Encoding field
)

// Scanner states.
const (
	scanStart       uint8 = iota // before a request line
	scanLine                     // in the request line
	scanFieldStart               // at the start of a field line or of the empty line ending the head
	scanFieldCR                  // after a CR that starts a line
	scanName                     // in a field name
	scanLength                   // in a Content-Length value
	scanValue                    // in another field's value
	scanBody                     // in a Content-Length body
	scanTE                       // in a Transfer-Encoding value
	scanChunkSize                // in a chunk-size line's hex digits (chunk.go)
	scanChunkOWS                 // after them: whitespace before the CRLF
	scanChunkExt                 // in a chunk extension
	scanChunkLF                  // after the CR that ends a chunk-size line
	scanChunkData                // in a chunk's data
	scanChunkDataCR              // after it: its CR
	scanChunkDataLF              // its LF
	scanLastCRLF                 // after the last chunk: "\r\n" or a trailer
	scanLastLF                   // the LF of that "\r\n"
	scanHeld                     // bytes counted for the own loop, which scans the head they start (hold)
	scanStopped                  // not following the connection any more
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

// scanner follows the requests in an HTTP/1 byte stream the way Go's
// server parses them (net/http readRequest, net/textproto), without
// buffering: lines end at LF, a CR right before it is dropped; after a POST
// up to 4 leading CR or LF bytes are skipped. A Content-Length body is
// skipped; a Transfer-Encoding head is the connection's last, and its
// chunked body is followed only to judge it (chunk.go).
type scanner struct {
	state    uint8
	cr       bool  // the previous byte was a CR not yet known to end a line
	skipCRLF int   // CR/LF bytes Go skips before the next request line
	bodyLeft int64 // bytes of the Content-Length body still to come
	held     int   // bytes read while held (scanHeld)
	headLen  int   // bytes of the current head so far
	maxHead  int

	// The current head.
	cur    head
	method int // bytes of "POST " matched at the start of the line; -1: not a POST
	isPost bool

	// The current field line.
	nameLen      int
	notCL, notTE bool // the name so far is not content-length / transfer-encoding
	underscore   bool // the name has a '_' where those have '-'
	digits       int  // digits of a Content-Length value so far
	trailing     bool // whitespace after them
	teMatched    int  // bytes of "chunked" matched in a Transfer-Encoding value
	teState      uint8

	// The chunked body after a Transfer-Encoding head (chunk.go).
	chunk chunkScan

	queue []head // heads scanned, not yet taken by a handler
}

const (
	nameCL = "content-length"
	nameTE = "transfer-encoding"
)

func (s *scanner) init(maxHead int) {
	s.maxHead = maxHead
	s.state = scanStart
}

// feed follows p, the next bytes read from the connection.
func (s *scanner) feed(p []byte) {
	i := 0
	for i < len(p) {
		switch s.state {
		case scanStopped:
			return
		case scanHeld:
			s.held += len(p) - i
			return
		case scanChunkSize, scanChunkOWS, scanChunkExt, scanChunkLF, scanChunkData,
			scanChunkDataCR, scanChunkDataLF, scanLastCRLF, scanLastLF:
			i += s.chunkBytes(p[i:])
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
			s.cur = head{lineHash: fnvOffset}
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
			for i < len(p) && !endsName[p[i]] {
				i++
			}
			s.nameBytes(p[start:i])
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
			case scanTE:
				s.teByte(b)
			}
		}
	}
}

// hold starts the own loop's scan of the next head (own.go): the bytes
// read from now on are only counted, until the loop, which reads them
// into its buffer, has them followed (release) or, for a head it parsed
// itself, takes its scan from that parse (takeHead). So the loop's plain
// head is read once, not once by the scanner and once by the parse. Only
// between two requests, every head scanned taken: false otherwise.
func (s *scanner) hold() bool {
	if s.state != scanStart || len(s.queue) > 0 {
		return false
	}
	s.state, s.held = scanHeld, 0
	return true
}

// release follows the bytes read while held, lead and then rest (the
// loop's buffer), as if they had been followed as they were read.
func (s *scanner) release(lead, rest []byte) {
	if !s.resume(lead, rest) {
		return
	}
	s.feed(lead)
	s.feed(rest)
}

// takeHead follows the bytes read while held, lead and then rest, where
// rest starts with a head of n bytes that the loop parsed itself (a
// plain head, parseLean) and whose scan is h: the scanner takes h for
// it, as endHead would have pushed it, and follows the bytes after it.
// lead is what the loop dropped before the head (the CR and LF after a
// POST); if the scanner would not have dropped it too, or the head is
// larger than it takes, it follows every byte itself, as release.
func (s *scanner) takeHead(lead, rest []byte, n int, h head, post bool) {
	if !s.resume(lead, rest) {
		return
	}
	queued := len(s.queue)
	s.feed(lead)
	if s.state != scanStart || len(s.queue) != queued || n > s.maxHead || n > len(rest) {
		s.feed(rest)
		return
	}
	s.skipCRLF = 0
	s.cur, s.isPost, s.headLen, s.cr = h, post, n, false
	s.endHead()
	s.feed(rest[n:])
}

// resume ends the hold, if there is one, for bytes lead and rest: false
// when there is none, or when they are not the bytes it counted (the
// scanner then stops following the connection: every request after is
// unverified, and refused).
func (s *scanner) resume(lead, rest []byte) bool {
	if s.state != scanHeld {
		return false
	}
	if s.held != len(lead)+len(rest) {
		s.state = scanStopped
		return false
	}
	s.state, s.held = scanStart, 0
	return true
}

// count adds n bytes to the current head; false if it grew too large (the
// scanner then stopped).
func (s *scanner) count(n int) bool {
	if s.headLen += n; s.headLen > s.maxHead {
		s.fail(fieldHeaders, "the header block is too large")
		return false
	}
	return true
}

// lineBytes adds seg, a piece of the request line that ends at its LF if
// it has one, to the line's hash as Go's parser gets the line: without the
// LF and one CR right before it.
func (s *scanner) lineBytes(seg []byte) {
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
	// The method's first bytes byte by byte (is it a POST?), then the
	// hash alone, in a loop of its own.
	for len(seg) > 0 && s.method >= 0 && s.method < len("POST ") {
		s.hashByte(seg[0])
		seg = seg[1:]
	}
	h := s.cur.lineHash
	for _, b := range seg {
		h = (h ^ uint64(b)) * fnvPrime
	}
	s.cur.lineHash = h
	s.cur.lineLen += len(seg)
	if ends {
		s.isPost = s.method == len("POST ")
		s.state = scanFieldStart
	}
}

// endsName marks the bytes that end a field name: its colon, or what
// makes the line malformed.
var endsName = [256]bool{':': true, '\r': true, '\n': true, ' ': true, '\t': true}

// nameBytes follows seg, more bytes of a field name: byte by byte only
// while the name may still be Content-Length or Transfer-Encoding (most
// names differ from both within a byte or two).
func (s *scanner) nameBytes(seg []byte) {
	for k, b := range seg {
		if s.notCL && s.notTE {
			s.nameLen += len(seg) - k // the rest cannot make it either
			return
		}
		s.nameByte(b)
	}
}

func (s *scanner) hashByte(b byte) {
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

func (s *scanner) nameByte(b byte) {
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

func (s *scanner) endName() {
	isCL := !s.notCL && s.nameLen == len(nameCL)
	isTE := !s.notTE && s.nameLen == len(nameTE)
	switch {
	case (isCL || isTE) && s.underscore:
		// Go takes Content_Length for another field; some proxies do not.
		s.fail(fieldFraming, "a header field name like these with '_' for '-'")
	case isCL && s.cur.flags&hasCL != 0:
		s.fail("Content-Length", "more than one such field")
	case isCL:
		s.cur.flags |= hasCL
		s.digits, s.trailing, s.cr = 0, false, false
		s.state = scanLength
	case isTE && s.cur.flags&hasTE != 0:
		// Go's server answers these itself, 501 before any handler
		// (listener.go turns that into the gateway's 400).
		s.cur.flags |= hasTE
		s.fail("Transfer-Encoding", "more than one such field; only a single \"chunked\" is accepted (RFC 9112 6.1)")
	case isTE:
		s.cur.flags |= hasTE
		s.teMatched, s.teState, s.cr = 0, teLeading, false
		s.state = scanTE
	default:
		s.state = scanValue
	}
}

// lengthByte follows a Content-Length value: optional whitespace, decimal
// digits that fit an int64, optional whitespace (what Go's parser accepts).
func (s *scanner) lengthByte(b byte) {
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

// States of a Transfer-Encoding value.
const (
	teLeading  uint8 = iota // whitespace before the coding
	teCoding                // in it
	teTrailing              // whitespace after it
)

// teByte follows a Transfer-Encoding value: the only one Go's server takes
// is "chunked" (any case) with optional whitespace around it; for anything
// else ("chunked, identity", "xchunked", "gzip, chunked", empty) it
// answers 501 before any handler runs. Such a value is refused here, so
// that the answer is the gateway's 400: a client's unsupported or
// obfuscated framing is its fault, and a front proxy that took the value
// for chunked (or not) would see other request boundaries.
func (s *scanner) teByte(b byte) {
	const chunked = "chunked"
	if s.cr && b != '\n' {
		s.fail("Transfer-Encoding", "a CR inside the value")
		return
	}
	switch {
	case b == '\r':
		s.cr = true
	case b == '\n':
		s.cr = false
		if s.teMatched != len(chunked) {
			s.fail("Transfer-Encoding", "only a single \"chunked\" is accepted (RFC 9112 6.1)")
			return
		}
		s.state = scanFieldStart
	case b == ' ' || b == '\t':
		if s.teState == teCoding {
			s.teState = teTrailing
		}
	case s.teState != teTrailing && s.teMatched < len(chunked) && b|0x20 == chunked[s.teMatched]:
		s.teState = teCoding
		s.teMatched++
	default:
		s.fail("Transfer-Encoding", "only a single \"chunked\" is accepted (RFC 9112 6.1)")
	}
}

func (s *scanner) endHead() {
	if !s.push(s.cur) {
		return
	}
	switch {
	case s.cur.flags&hasTE != 0:
		// The gateway closes the connection after this request (or refuses
		// it): nothing after it is read as a request. Its chunked body is
		// followed as far as it goes (chunk.go).
		s.chunk = chunkScan{}
		s.state = scanChunkSize
	case s.cur.lineHash == priHash && s.cur.lineLen == len(priLine):
		// The HTTP/2 preface: net/http reads no request after it.
		s.state = scanStopped
	case s.cur.flags&hasCL != 0 && s.cur.length > 0:
		s.bodyLeft = s.cur.length
		s.state = scanBody
	default:
		s.nextRequest()
	}
}

func (s *scanner) nextRequest() {
	s.state = scanStart
	s.skipCRLF = 0
	if s.isPost {
		s.skipCRLF = 4 // net/http: RFC 7230 section 3 tolerance for old buggy clients
	}
}

// fail records what is wrong with the current head (the gateway refuses
// it, if Go does not first) and stops following the connection.
func (s *scanner) fail(field, reason string) {
	s.cur.badField, s.cur.bad = field, reason
	s.push(s.cur)
	s.state = scanStopped
}

func (s *scanner) push(f head) bool {
	if len(s.queue) >= maxQueued {
		s.state = scanStopped
		return false
	}
	s.queue = append(s.queue, f)
	return true
}

// requestLineHash is the FNV-1a hash scanner computes for r's request
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
