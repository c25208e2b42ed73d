package engine

// The request writer of Exchange with Hooks (the gateway's direct
// forward): the bytes Request.Write would write for the requests the
// direct forward carries (a method, a URL with
// a path and maybe a query, the Host of the URL, a header map, no body or
// one of known length in memory, no Transfer-Encoding, no trailers, not to
// a proxy), without its allocations (a transfer writer, a body wrapper,
// formatted lines) and with the moment the head is complete known to the
// caller, so that no ClientTrace is needed for the drain rule.
// TestWriteHeadMatchesRequestWrite and FuzzWriteHead hold it to
// Request.Write byte for byte.
//
// The Host line is Request.Write's own: it is written once per connection
// by Request.Write itself (hostLine), since every request on a connection
// has the same URL host.

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// hostLine returns the Host header line Request.Write writes for a request
// to http://addr (punycode, an invalid host left empty, an IPv6 zone
// removed: all its rules), by asking it.
func hostLine(addr string) ([]byte, error) {
	var b bytes.Buffer
	req := &http.Request{Method: "GET", URL: &url.URL{Scheme: "http", Host: addr, Path: "/"}, Header: http.Header{"User-Agent": {""}}}
	if err := req.Write(&b); err != nil {
		return nil, err
	}
	_, rest, _ := bytes.Cut(b.Bytes(), []byte("\r\n"))
	line, _, ok := bytes.Cut(rest, []byte("\r\n"))
	if !ok || !bytes.HasPrefix(line, []byte("Host: ")) {
		return nil, errors.New("unexpected request head from Request.Write")
	}
	return append(line, '\r', '\n'), nil
}

// writeExcluded are the header fields Request.Write writes from the
// request's fields, not from its Header (its reqWriteExcludeHeader).
var writeExcluded = []string{"Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer"}

var errCTLInURL = errors.New("net/http: can't write control character in Request.URL")

// writeHead writes the head of req, whose header is fields (see the top
// of this file; host is hostLine's for req.URL.Host), to w, as
// Request.Write would with fields.Header() as req.Header; order is the
// connection's (wire.WriteSortedIn), or nil.
func writeHead(w *bufio.Writer, req *http.Request, fields wire.Fields, host []byte, order *wire.Order) error {
	u := req.URL
	method := req.Method
	if method == "" {
		method = "GET"
	}
	var path, query string
	withQuery := u.Opaque == "" && (u.ForceQuery || u.RawQuery != "")
	if u.Opaque != "" {
		path = u.RequestURI()
	} else {
		if path = wire.EscapedPath(u); path == "" {
			path = "/"
		}
		if withQuery {
			query = u.RawQuery
		}
	}
	if hasCTL(path) || hasCTL(query) {
		return errCTLInURL
	}
	ua, uaOK := fields.Lookup("User-Agent")
	n := outgoingLength(req)
	withLength := n > 0 || n == 0 && (method == "POST" || method == "PUT" || method == "PATCH")
	// The lines before the fields are put in the writer's free space and
	// written with one Write, as wire's writeLines puts the fields: a
	// WriteString a part was 9 calls and 580 instructions of a fenced
	// write's head. A head whose start does not fit is written a part at
	// a time, as before, so that the writer flushes (and the connection
	// checks each write's fence) where and as it did.
	b := w.AvailableBuffer()
	if len(method)+len(path)+len(query)+len(host)+len("  ? HTTP/1.1\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: -9223372036854775808\r\n")+userAgentLen(ua) > cap(b) {
		writeStart(w, method, path, query, withQuery, host, ua, uaOK, n, withLength)
	} else {
		b = append(b, method...)
		b = append(b, ' ')
		b = append(b, path...)
		if withQuery {
			b = append(b, '?')
			b = append(b, query...)
		}
		b = append(b, " HTTP/1.1\r\n"...)
		b = append(b, host...)
		if uaOK && len(ua) > 0 && ua[0] != "" {
			b = append(b, "User-Agent: "...)
			b = append(b, wire.Value(ua[0])...)
			b = append(b, "\r\n"...)
		} else if !uaOK {
			b = append(b, "User-Agent: Go-http-client/1.1\r\n"...)
		}
		if withLength {
			b = append(b, "Content-Length: "...)
			b = strconv.AppendInt(b, n, 10)
			b = append(b, "\r\n"...)
		}
		_, _ = w.Write(b)
	}
	wire.WriteSortedIn(w, fields, writeExcluded, order)
	_, err := w.WriteString("\r\n")
	return err
}

// userAgentLen is the most bytes the User-Agent value ua takes in the
// head (wire.Value only ever shortens it).
func userAgentLen(ua []string) int {
	if len(ua) > 0 {
		return len(ua[0])
	}
	return 0
}

// writeStart writes the head's lines before its fields a part at a time:
// writeHead's, for a head whose start does not fit in w's free space.
func writeStart(w *bufio.Writer, method, path, query string, withQuery bool, host []byte, ua []string, uaOK bool, n int64, withLength bool) {
	_, _ = w.WriteString(method)
	_ = w.WriteByte(' ')
	_, _ = w.WriteString(path)
	if withQuery {
		_ = w.WriteByte('?')
		_, _ = w.WriteString(query)
	}
	_, _ = w.WriteString(" HTTP/1.1\r\n")
	_, _ = w.Write(host)
	if uaOK && len(ua) > 0 && ua[0] != "" {
		_, _ = w.WriteString("User-Agent: ")
		_, _ = w.WriteString(wire.Value(ua[0]))
		_, _ = w.WriteString("\r\n")
	} else if !uaOK {
		_, _ = w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	}
	if withLength {
		_, _ = w.WriteString("Content-Length: ")
		_, _ = w.Write(strconv.AppendInt(w.AvailableBuffer(), n, 10))
		_, _ = w.WriteString("\r\n")
	}
}

// outgoingLength is Request.outgoingLength for a body of known length.
func outgoingLength(req *http.Request) int64 {
	if req.Body == nil || req.Body == http.NoBody {
		return 0
	}
	return req.ContentLength
}

func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return true
		}
	}
	return false
}
