package gateway

// Small request bodies of fenced writes, read whole before the write is
// forwarded so that the head and the body leave in one write.

import (
	"errors"
	"io"
	"net/http"
)

// smallBody is the largest request body a fenced write reads in whole
// before it is forwarded. net/http's Transport writes a request's head and
// a body it knows to be in memory in one write (its bufio.Writer is 4 KiB),
// but flushes the head alone before any other body, such as the
// ReverseProxy's wrapper of the client's: two writes, two TCP segments and,
// usually, two reads and a wake-up in the upstream per write. For the small
// writes a fence usually guards that was the largest cost the gateway
// could remove (docs/benchmarks.md). nginx buffers request bodies before it
// forwards them for the same reasons (proxy_request_buffering, on by
// default).
const smallBody = 4 << 10

// bufferable reports whether r's body is read in whole before the forward:
// a Content-Length body of at most smallBody bytes, and no Expect:
// 100-continue (reading the body would send the client 100 Continue before
// the upstream agreed to take it; such bodies stream, as larger ones do).
func bufferable(r *http.Request, wf *writeFields) bool {
	return r.ContentLength > 0 && r.ContentLength <= smallBody && !wf.expect && len(r.TransferEncoding) == 0
}

// errShortBody: the client's body ended (or its connection broke) before
// its Content-Length.
var errShortBody = errors.New("the request body ended before its Content-Length")

// readSmallBody reads the whole body of a bufferable request, and its end:
// the body reader lifts its read deadline there (limitBody), and net/http
// sees the body consumed and can reuse the connection. The body was framed
// by net/http from the one Content-Length the framing check verified, so
// the bytes read here are the bytes that check framed; nothing parses the
// request a second way.
//
// At its end the body is closed: nothing reads it again, and net/http,
// which otherwise reads an unclosed body once more before it writes the
// answer's head (to find its end, with a LimitReader of its own), sees it
// closed after its end and reads nothing.
//
// The body is read into buf if it holds it and one byte more (to see its
// end in the same buffer), else into a new one.
func readSmallBody(body io.ReadCloser, n int64, buf []byte) ([]byte, error) {
	if int64(cap(buf)) > n {
		buf = buf[:n]
	} else {
		buf = make([]byte, n, n+1)
	}
	if _, err := io.ReadFull(body, buf); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			err = errShortBody
		}
		return nil, err
	}
	switch m, err := body.Read(buf[n : n+1]); {
	case m == 0 && err == io.EOF:
		_ = body.Close() // at its end: nothing is lost
		return buf, nil
	case err == nil || err == io.EOF:
		// net/http's body reader never yields more than Content-Length.
		return nil, errors.New("the request body is longer than its Content-Length")
	default:
		return nil, err
	}
}
