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
// Request.Write would with fields.Header() as req.Header.
func writeHead(w *bufio.Writer, req *http.Request, fields wire.Fields, host []byte) error {
	u := req.URL
	method := req.Method
	if method == "" {
		method = "GET"
	}
	var path, query string
	if u.Opaque != "" {
		path = u.RequestURI()
	} else {
		if path = wire.EscapedPath(u); path == "" {
			path = "/"
		}
		if u.ForceQuery || u.RawQuery != "" {
			query = u.RawQuery
		}
	}
	if hasCTL(path) || hasCTL(query) {
		return errCTLInURL
	}
	_, _ = w.WriteString(method)
	_ = w.WriteByte(' ')
	_, _ = w.WriteString(path)
	if u.Opaque == "" && (u.ForceQuery || u.RawQuery != "") {
		_ = w.WriteByte('?')
		_, _ = w.WriteString(query)
	}
	_, _ = w.WriteString(" HTTP/1.1\r\n")
	_, _ = w.Write(host)
	if vs, ok := fields.Lookup("User-Agent"); ok && len(vs) > 0 && vs[0] != "" {
		_, _ = w.WriteString("User-Agent: ")
		_, _ = w.WriteString(wire.Value(vs[0]))
		_, _ = w.WriteString("\r\n")
	} else if !ok {
		_, _ = w.WriteString("User-Agent: Go-http-client/1.1\r\n")
	}
	if n := outgoingLength(req); n > 0 || n == 0 && (method == "POST" || method == "PUT" || method == "PATCH") {
		_, _ = w.WriteString("Content-Length: ")
		_, _ = w.Write(strconv.AppendInt(w.AvailableBuffer(), n, 10))
		_, _ = w.WriteString("\r\n")
	}
	wire.WriteSorted(w, fields, writeExcluded)
	_, err := w.WriteString("\r\n")
	return err
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
