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
	"net/http"
	"net/textproto"
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
	lineEnd := indexCRLF(head)
	if lineEnd < 0 {
		return nil, false
	}
	method, target, ok := leanRequestLine(head[:lineEnd])
	if !ok {
		return nil, false
	}
	// Header lines: their count sizes the map, and every byte is checked
	// before anything is allocated.
	// The lines' ends are kept for the second pass, for a head of as many
	// fields as a fenced write's commonly has.
	var ends [16]int
	fields := 0
	for rest := head[lineEnd+2:]; len(rest) > 2; fields++ {
		end := indexCRLF(rest)
		if end < 0 || !plainField(rest[:end]) {
			return nil, false
		}
		if fields < len(ends) {
			ends[fields] = end
		}
		rest = rest[end+2:]
	}

	s := string(head) // every string of the request is a part of this one
	// Every field but Host, which is the request's, not the map's.
	h, vals := into.header, into.vals
	switch {
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
		clear(vals) // the last request's strings are not kept alive
	} else {
		vals = make([]string, fields)
		if fields <= leanKeep {
			into.vals = vals
		}
	}
	var host, contentLength string
	hosts, lengths := 0, 0
	closing := false
	// The names taken so far, while they fit: a repeated name is found
	// by comparing them, which costs less than a lookup in the map.
	var names [16]string
	named := 0
	rest := s[lineEnd+2:]
	for i := 0; i < fields; i++ {
		end := 0
		if i < len(ends) {
			end = ends[i]
		} else {
			end = strings.IndexByte(rest, '\n') - 1 // every line ends in CRLF (checked above)
		}
		line := rest[:end]
		rest = rest[end+2:]
		colon := strings.IndexByte(line, ':')
		key := wire.CanonicalKey(line[:colon])
		value := textproto.TrimString(line[colon+1:]) // textproto's trim: no CR or LF here (plainField)
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
		case "Pragma", "Transfer-Encoding", "Expect":
			// Pragma: Go's parser may add a Cache-Control for it; the
			// other two are never the loop's (mine).
			return nil, false
		}
		if framingLookalike(key) {
			return nil, false // the scanner refuses it: it follows this head itself
		}
		repeated := false
		if named < len(names) {
			for _, n := range names[:named] {
				if n == key {
					repeated = true
					break
				}
			}
			if !repeated {
				names[named] = key
				named++
			}
		} else {
			_, repeated = h[key]
		}
		if !repeated {
			vals[i] = value
			h[key] = vals[i : i+1 : i+1] // as textproto: an append never writes into the next value
		} else {
			h[key] = append(h[key], value)
		}
	}
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
	r.Method = s[:len(method)]
	r.RequestURI = s[len(method)+1 : len(method)+1+len(target)]
	lr.url.Path, lr.url.RawQuery, lr.url.ForceQuery = splitQuery(r.RequestURI)
	r.URL = &lr.url
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.Header = h
	r.Host = host
	r.ContentLength = length
	r.Body = http.NoBody // the loop's own body replaces it when there is one
	r.Close = closing    // httpguts.HeaderValuesContainsToken(h["Connection"], "close"), value by value
	lr.lineLen, lr.hasLength = lineEnd, lengths == 1
	return r, true
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
	return h
}

// leanRequestLine splits a request line the loop took (a method Own takes,
// a target, " HTTP/1.1") if its target is plain: a path of characters
// net/url keeps as they are (no escape, no RawPath) and a query of
// printable ASCII.
func leanRequestLine(line []byte) (method, target []byte, ok bool) {
	const proto = " HTTP/1.1"
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || len(line) < sp+1+len(proto) || string(line[len(line)-len(proto):]) != proto {
		return nil, nil, false
	}
	method, target = line[:sp], line[sp+1:len(line)-len(proto)]
	for _, b := range method {
		if !httpguts.IsTokenRune(rune(b)) {
			return nil, nil, false
		}
	}
	if len(target) == 0 || target[0] != '/' {
		return nil, nil, false
	}
	inQuery := false
	for _, b := range target {
		switch {
		case b == '?':
			inQuery = true
		case inQuery:
			if b <= ' ' || b >= 0x7f || b == '#' {
				return nil, nil, false
			}
		case !wire.PlainPathByte(b):
			return nil, nil, false
		}
	}
	return method, target, true
}

// splitQuery is net/url's split of a request target into path and query:
// a lone '?' at the end is ForceQuery.
func splitQuery(target string) (path, query string, force bool) {
	if strings.HasSuffix(target, "?") && strings.Count(target, "?") == 1 {
		return target[:len(target)-1], "", true
	}
	path, query, _ = strings.Cut(target, "?")
	return path, query, false
}

// plainField reports whether a header line is "name:value" with a token
// name and a value of printable ASCII, spaces and tabs: one every check
// of textproto and of Go's server takes as it is.
func plainField(line []byte) bool {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return false
	}
	for _, b := range line[:colon] {
		if !httpguts.IsTokenRune(rune(b)) {
			return false
		}
	}
	return wire.PlainValue(line[colon+1:])
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

// indexCRLF is the index of the CRLF ending b's first line, -1 if that line
// does not end in CRLF.
func indexCRLF(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return -1
	}
	return i - 1
}
