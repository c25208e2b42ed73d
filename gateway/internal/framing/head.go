package framing

// The loop's own parse of a plain request head. http.ReadRequest is about
// half of the allocations of a fenced write and a tenth of its CPU (a
// textproto reader, a request, a URL, a header map, a string per line, a
// copy of the request to give it the connection's context). Most heads a
// fenced write sends are plain: a target of unreserved characters, token
// names, printable ASCII values, one Host, at most one Content-Length. The
// loop parses such a head itself, into what http.ReadRequest and Go's
// server's checks make of it, field for field, with five allocations
// (the head as one string, the request with its URL, the header map and
// its table, its values). Any head that is not plain in every byte goes to
// http.ReadRequest, which says what is wrong with it or makes of it what
// Go's server does: the lean parse never decides a refusal, so it cannot
// refuse what Go's server takes, and FuzzLeanHeadMatchesReadRequest holds
// what it takes to http.ReadRequest's result.

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// leanRequest is the storage of the requests the loop parses itself on
// one connection: the request, its URL, its header map and the array of
// its values. Each request of the connection takes it over from the one
// before, which was served to its end by then (the loop reads a head only
// once the last answer is written, and nothing of the gateway keeps a
// request, its URL or its header map past its handler's return: the
// handlers copy what they keep), so a fenced write's head costs one
// allocation, its string.
type leanRequest struct {
	req    http.Request
	url    url.URL
	header http.Header
	vals   []string

	// fields lists header's fields in the order the head sent them, each
	// name once with the map's values (the names parseLean tells repeats
	// by, kept), for the handler that walks the header: a walk of a map
	// starts at a random place and was about 400 instructions a fenced
	// write, and its order then had to be sorted from random. listed is
	// how many; complete whether they are all of header's (not when the
	// head had more names than fields holds).
	fields   [16]wire.Field
	listed   int
	complete bool
	// connection: the head had a Connection field (wantsClose).
	connection bool

	// What the scanner would have noted of the head (scan.go, head):
	// its request line's length and whether it has a Content-Length.
	lineLen   int
	hasLength bool
}

// leanKeep is the most fields whose map and values a connection keeps for
// its next request: a head of more is the exception, and a map cleared
// for each request costs as much as its largest head.
const leanKeep = 32

// parseLean parses head (a whole head mine took: CRLF line ends, no
// obs-fold) into a request made from template (which carries the
// connection's context and remote address), as http.ReadRequest followed
// by checkRequest would; ok false when the head is not plain, for
// http.ReadRequest to parse.
func parseLean(head []byte, template *http.Request, into *leanRequest) (req *http.Request, ok bool) {
	line, ok := leanRequestLine(head)
	if !ok {
		return nil, false
	}
	// A field a line: every line of the head ends in CRLF, its last is
	// empty. The count sizes the map and vals. Each line is checked as it
	// is parsed, in one pass: a pass to check every line before the
	// string is made, and one to parse them, read each twice and kept
	// their ends between the two. A head declined half way costs its
	// string beside http.ReadRequest's own allocations.
	fields := bytes.Count(head[line.end+2:], []byte("\n")) - 1
	if fields < 0 {
		return nil, false
	}
	s := string(head) // every string of the request is a part of this one
	// Every field but Host, which is the request's, not the map's. The
	// map of the connection's last request is set over rather than
	// cleared, while the names fit in names: each of this head's names
	// is set, and any other deleted after (none, when a client sends the
	// same fields each time). A clear (each slot, and a new hash seed)
	// cost about 150 instructions a head more than setting over the
	// same names (BenchmarkHeadParse/client).
	names := &into.fields
	h, vals := into.header, into.vals
	kept := h != nil && fields <= len(names)
	switch {
	case kept:
	case h != nil && fields <= leanKeep:
		clear(h)
	case fields <= leanKeep:
		h = make(http.Header, max(fields-1, 0))
		into.header = h
	default:
		h = make(http.Header, fields-1)
	}
	if cap(vals) >= fields {
		vals = vals[:fields]
	} else {
		vals = make([]string, fields)
		if fields <= leanKeep {
			into.vals = vals
		}
	}
	var host, contentLength string
	hosts, lengths := 0, 0
	closing, connection := false, false
	// The names taken so far, while they fit: a repeated name is found
	// by comparing them, which costs less than a lookup in the map, and
	// only once one of its length was taken (sizes: a bit a length, mod
	// 64), as a head's names commonly all differ in length.
	named, sizes, overflow := 0, uint64(0), false
	p := line.end + 2
	for i := 0; i < fields; i++ {
		f, ok := plainField(head, p)
		if !ok {
			return nil, false
		}
		key := f.name
		if key == "" {
			key = wire.CanonicalKey(s[p:f.colon])
			if framingLookalike(key) {
				return nil, false // the scanner refuses it: it follows this head itself
			}
		}
		value := s[f.from:f.to] // trimmed as textproto trims it
		p = f.next
		vals[i] = value // every one, Host's too: a parsed head's vals hold no earlier head's strings, with no clear
		switch key {
		case "Host":
			// The request's Host, never a header field (as
			// http.ReadRequest): not put in the map to be taken out.
			hosts++
			host = value
			continue
		case "Content-Length":
			lengths++
			contentLength = value
		case "Connection":
			closing = closing || httpguts.HeaderValuesContainsToken([]string{value}, "close")
			connection = true
		case "Pragma", "Transfer-Encoding", "Expect":
			// Pragma: Go's parser may add a Cache-Control for it; the
			// other two are never the loop's (mine).
			return nil, false
		}
		if named < len(names) {
			at := -1 // the place of a name taken before
			if size := uint64(1) << (len(key) % 64); sizes&size == 0 {
				sizes |= size
			} else {
				at = wire.Fields(names[:named]).Index(key)
			}
			if at < 0 {
				vv := vals[i : i+1 : i+1] // as textproto: an append never writes into the next value
				names[named] = wire.Field{Name: key, Values: vv}
				named++
				h[key] = vv
			} else {
				vv := append(names[at].Values, value) // the map's values, without a lookup
				names[at].Values = vv
				h[key] = vv
			}
			continue
		}
		overflow = true
		if _, repeated := h[key]; !repeated {
			h[key] = vals[i : i+1 : i+1]
		} else {
			h[key] = append(h[key], value)
		}
	}
	if string(head[p:]) != "\r\n" {
		return nil, false // not a whole head (mine gives only whole ones)
	}
	if kept && len(h) != named {
		for k := range h {
			if wire.Fields(names[:named]).Index(k) < 0 {
				delete(h, k) // a name of an earlier head, or a handler's
			}
		}
	}
	into.listed, into.complete, into.connection = named, !overflow, connection
	if hosts != 1 || !httpguts.ValidHostHeader(host) || lengths > 1 {
		return nil, false
	}
	var length int64
	if lengths == 1 {
		if length, ok = plainLength(contentLength); !ok {
			return nil, false
		}
	}

	lr := into
	lr.req = *template
	lr.url = url.URL{}
	r := &lr.req
	r.Method = s[:line.method]
	r.RequestURI = s[line.method+1 : line.end-len(" HTTP/1.1")]
	lr.url.Path, lr.url.RawQuery, lr.url.ForceQuery = splitQuery(r.RequestURI, line.query-line.method-1)
	r.URL = &lr.url
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.Header = h
	r.Host = host
	r.ContentLength = length
	r.Body = http.NoBody // the loop's own body replaces it when there is one
	r.Close = closing    // httpguts.HeaderValuesContainsToken(h["Connection"], "close"), value by value
	lr.lineLen, lr.hasLength = line.end, lengths == 1
	return r, true
}

// knownName is name as a constant if it is one of the names a fenced
// write's head commonly carries (each canonical, so its own
// wire.CanonicalKey), "" if not. A name found here needs no check of its
// bytes, and the map kept from the connection's last request (parseLean)
// holds the same string, which a set finds equal by its pointer, not byte
// by byte.
func knownName(name []byte) string {
	switch string(name) {
	case "Host":
		return "Host"
	case "User-Agent":
		return "User-Agent"
	case "Content-Length":
		return "Content-Length"
	case "Content-Type":
		return "Content-Type"
	case "Accept-Encoding":
		return "Accept-Encoding"
	case "Accept":
		return "Accept"
	case "Authorization":
		return "Authorization"
	case "Fencing-Lease":
		return "Fencing-Lease"
	case "Fencing-Token":
		return "Fencing-Token"
	case "Idempotency-Key":
		return "Idempotency-Key"
	case "Traceparent":
		return "Traceparent"
	case "Tracestate":
		return "Tracestate"
	}
	return ""
}

// framingLookalike reports whether a field name is Content-Length or
// Transfer-Encoding with a '_' for a '-': Go takes it for another field,
// some proxies do not, and the scanner refuses it (scan.go, endName).
func framingLookalike(key string) bool {
	if len(key) != len(nameCL) && len(key) != len(nameTE) || strings.IndexByte(key, '_') < 0 {
		return false
	}
	dashed := strings.ReplaceAll(key, "_", "-")
	return strings.EqualFold(dashed, nameCL) || strings.EqualFold(dashed, nameTE)
}

// scanned is what the scanner would have noted of the head parseLean
// parsed into lr (scan.go, head), for takeHead.
func (lr *leanRequest) scanned() head {
	h := head{lineLen: lr.lineLen, length: lr.req.ContentLength, lean: true}
	if lr.hasLength {
		h.flags = hasCL
	}
	if lr.complete {
		h.fields = lr.fields[:lr.listed:lr.listed]
	}
	return h
}

// The classes of a head's bytes, one table lookup a byte where the
// checks were a function call each (httpguts.IsTokenRune decodes a rune).
const (
	tokenByte = 1 << iota // of a method or a field name (wire.TokenByte)
	pathByte              // net/url keeps it as it is in a path (wire.PlainPathByte)
	queryByte             // printable ASCII but '#': kept as it is in a query
)

var headBytes = func() (t [256]uint8) {
	for b := range 256 {
		if wire.TokenByte[b] {
			t[b] |= tokenByte
		}
		if wire.PlainPathByte(byte(b)) {
			t[b] |= pathByte
		}
		if b > ' ' && b < 0x7f && b != '#' {
			t[b] |= queryByte
		}
	}
	return t
}()

// requestLine is where a request line's parts end: the method at method,
// the path at query (the target's first '?', or its end), the line at
// end (its CR).
type requestLine struct{ method, query, end int }

// leanRequestLine finds the request line that starts head (a method Own
// takes, a target, " HTTP/1.1", CRLF) if its target is plain: a path of
// characters net/url keeps as they are (no escape, no RawPath) and a
// query of printable ASCII.
func leanRequestLine(head []byte) (line requestLine, ok bool) {
	const proto = " HTTP/1.1\r\n"
	i := 0
	for i < len(head) && headBytes[head[i]]&tokenByte != 0 {
		i++
	}
	if i == 0 || i+1 >= len(head) || head[i] != ' ' || head[i+1] != '/' {
		return line, false
	}
	line.method = i
	for i++; i < len(head) && headBytes[head[i]]&pathByte != 0; i++ {
	}
	line.query = i
	if i < len(head) && head[i] == '?' {
		for i++; i < len(head) && headBytes[head[i]]&queryByte != 0; i++ {
		}
	}
	// A space ends the target: neither a path nor a query has one.
	if len(head)-i < len(proto) || string(head[i:i+len(proto)]) != proto {
		return line, false
	}
	line.end = i + len(proto) - 2
	return line, true
}

// splitQuery is net/url's split of a request target into path and query
// at q, its first '?' (len(target) if none): a lone '?' at the end is
// ForceQuery.
func splitQuery(target string, q int) (path, query string, force bool) {
	if q >= len(target) {
		return target, "", false
	}
	return target[:q], target[q+1:], q == len(target)-1
}

// leanField is where a header line's parts are in its head: the name ends
// at colon, the value, trimmed, is [from, to), the next line starts at
// next. name is the name if it is a known one (knownName).
type leanField struct {
	name                  string
	colon, from, to, next int
}

// plainField finds the header line at head[p:] if it is "name:value" with
// a token name and a value of printable ASCII, spaces and tabs: one every
// check of textproto and of Go's server takes as it is.
func plainField(head []byte, p int) (f leanField, ok bool) {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	// The colon, eight bytes at a time (the lowest zero byte of x^':' is
	// exact in "Bit Twiddling Hacks"' haszero): a name found, if known,
	// is then not read again byte by byte. Where a line has no colon the
	// search goes on into the next, and the name it finds has the line's
	// CR, which no known name nor token has.
	i := p
	for ; len(head)-i >= 8; i += 8 {
		x := binary.LittleEndian.Uint64(head[i:]) ^ ':'*ones
		if m := (x - ones) &^ x & highs; m != 0 {
			i += bits.TrailingZeros64(m) >> 3
			break
		}
	}
	for i < len(head) && head[i] != ':' {
		i++
	}
	if i == p || i >= len(head) {
		return f, false
	}
	name := head[p:i]
	if f.name = knownName(name); f.name == "" {
		for _, b := range name {
			if headBytes[b]&tokenByte == 0 {
				return f, false
			}
		}
	}
	f.colon = i
	i++
	for i < len(head) && (head[i] == ' ' || head[i] == '\t') {
		i++
	}
	from := i
	// Values (a lease, a trace) are most of a head's bytes: passed over
	// eight at a time up to the first byte not printable ASCII
	// (wire.Unprintable), the line's CR, or a tab to step over, or a byte
	// refused.
	for {
		if i = wire.Unprintable(head, i); i >= len(head) || head[i] != '\t' {
			break
		}
		i++
	}
	if len(head)-i < 2 || binary.LittleEndian.Uint16(head[i:]) != '\r'|'\n'<<8 {
		return f, false
	}
	f.next = i + 2
	for i > from && (head[i-1] == ' ' || head[i-1] == '\t') {
		i--
	}
	f.from, f.to = from, i
	return f, true
}

// plainLength is a Content-Length of 1 to 18 digits (strconv.ParseUint's
// range for Go's parser, which takes leading zeros).
func plainLength(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}
