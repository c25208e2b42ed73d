package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// feedConn is an upstream connection that delivers input in pieces of
// at most chunk bytes (0: all at once), then io.EOF, or if stall is set
// errStalled: an upstream that sent its bytes and waits.
type feedConn struct {
	net.Conn // nil: only Read is used
	input    []byte
	chunk    int
	stall    bool
	stalled  int // reads that found no more input
}

var errStalled = errors.New("the upstream sent nothing more (a read would wait)")

func (f *feedConn) Read(p []byte) (int, error) {
	if len(f.input) == 0 {
		f.stalled++
		if f.stall {
			return 0, errStalled
		}
		return 0, io.EOF
	}
	if f.chunk > 0 && len(p) > f.chunk {
		p = p[:f.chunk]
	}
	n := copy(p, f.input)
	f.input = f.input[n:]
	return n, nil
}

// feedEngineConn is an engine connection reading input as the engine
// reads an answer: through its head limit (maxHead beyond its buffer).
func feedEngineConn(input []byte, chunk int, maxHead int64) *engineConn {
	c := &engineConn{nc: &feedConn{input: input, chunk: chunk}}
	c.br = bufio.NewReaderSize(c, 4<<10)
	c.limit = maxHead + int64(c.br.Size())
	return c
}

// bodyRead is what reading a body to its end gave.
type bodyRead struct {
	data  []byte
	err   error // the first error but io.EOF, nil if io.EOF
	after error // a Read's after the end
	eof   bool  // engineBody's view: its end was reached
}

// readBody reads b with reads of size step (the engine's body, as
// forwardDirect reads it) until an error, and once more.
func readBody(b *engineBody, step int) bodyRead {
	var r bodyRead
	buf := make([]byte, step)
	for i := 0; ; i++ {
		n, err := b.Read(buf)
		r.data = append(r.data, buf[:n]...)
		if err != nil {
			if err != io.EOF {
				r.err = err
			}
			break
		}
		if i > 1<<20 {
			r.err = errors.New("no end")
			break
		}
	}
	_, r.after = b.Read(buf)
	r.eof = b.eof
	return r
}

// checkReadAnswer requires readHead either to step aside (and leave the
// reader to ReadResponse, which then reads what it reads on a reader of
// its own), or to give ReadResponse's Response, body and what follows it.
func checkReadAnswer(t *testing.T, name string, input []byte, method string, chunk int, maxHead int64, step int) {
	t.Helper()
	req := &http.Request{Method: method}
	// readHead waits for bytes (reads on) only where ReadResponse would.
	sw, sg := feedEngineConn(input, chunk, maxHead), feedEngineConn(input, chunk, maxHead)
	sw.nc.(*feedConn).stall, sg.nc.(*feedConn).stall = true, true
	_, _ = http.ReadResponse(sw.br, req)
	_, _ = readAnswer(sg, req)
	if sg.nc.(*feedConn).stalled > 0 && sw.nc.(*feedConn).stalled == 0 {
		t.Fatalf("case %s: readAnswer waits for more bytes after %q, ReadResponse does not", name, truncate(string(input), 300))
	}
	wc := feedEngineConn(input, chunk, maxHead)
	want, werr := http.ReadResponse(wc.br, req)
	if werr == nil {
		keepConnection(want, input)
	}
	gc := feedEngineConn(input, chunk, maxHead)
	// Into a lent map, as the engine's, that held the last answer's header.
	lent := http.Header{"Content-Type": {"text/last"}, "X-Last": {"1"}}
	got := readHead(gc.br, req, lent, nil, false)
	if got == nil {
		// The fallback reads the same answer from the same reader.
		gc.hdr = lent
		got, gerr := readAnswer(gc, req)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("case %s: after readHead stepped aside ReadResponse gives %v, on its own reader %v", name, gerr, werr)
		}
		if werr == nil && (got.StatusCode != want.StatusCode || !reflect.DeepEqual(got.Header, want.Header) || got.ContentLength != want.ContentLength) {
			t.Fatalf("case %s: after readHead stepped aside ReadResponse reads %d %v %d, on its own reader %d %v %d", name, got.StatusCode, got.Header, got.ContentLength, want.StatusCode, want.Header, want.ContentLength)
		}
		return
	}
	if werr != nil {
		t.Fatalf("case %s: readHead accepts what ReadResponse refuses (%v): %q", name, werr, truncate(string(input), 300))
	}
	type fields struct {
		Status                 string
		StatusCode             int
		Proto                  string
		ProtoMajor, ProtoMinor int
		Header                 http.Header
		ContentLength          int64
		TransferEncoding       []string
		Close, Uncompressed    bool
		Trailer                http.Header
		Request                *http.Request
		NoBody                 bool
	}
	of := func(r *http.Response) fields {
		return fields{r.Status, r.StatusCode, r.Proto, r.ProtoMajor, r.ProtoMinor, r.Header, r.ContentLength,
			r.TransferEncoding, r.Close, r.Uncompressed, r.Trailer, r.Request, r.Body == http.NoBody}
	}
	if g, w := of(got), of(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("case %s: for %q\nreadHead:     %+v\nReadResponse: %+v", name, truncate(string(input), 300), g, w)
	}
	if got.Body != nil && got.Body != http.NoBody {
		t.Fatalf("case %s: readHead's body is %T, not nil (the engine's) or NoBody", name, got.Body)
	}
	// Read into the client's map (hop), the same answer comes without
	// the fields a proxy removes: ReadResponse's, then the gateway's
	// removal.
	hc := feedEngineConn(input, chunk, maxHead)
	list := wire.Fields{{Name: "X-Last", Values: []string{"1"}}} // the last answer's
	hopped := readHead(hc.br, req, http.Header{"X-Last": {"1"}}, &list, true)
	if hopped == nil {
		t.Fatalf("case %s: readHead steps aside when it removes the hop-by-hop fields, not otherwise", name)
	}
	if diff := listDiff(list, hopped.Header, string(input)); diff != "" {
		t.Fatalf("case %s: for %q the answer's list of fields %+v differs from its header %v: %s", name, truncate(string(input), 300), list, hopped.Header, diff)
	}
	stripped := want.Header.Clone()
	wire.RemoveHopByHop(stripped)
	if len(stripped) == 0 {
		stripped = http.Header{} // Clone of an empty header is nil; readHead's map is empty
	}
	g, w := of(hopped), of(want)
	g.Header, w.Header = nil, nil
	if !reflect.DeepEqual(g, w) || !reflect.DeepEqual(hopped.Header, stripped) {
		t.Fatalf("case %s: for %q\nreadHead into the client's map: %+v %v\nReadResponse, hop-by-hop fields removed: %+v %v", name, truncate(string(input), 300), g, hopped.Header, w, stripped)
	}
	// Each value's slice is its own: an append to one (forwardDirect's
	// dst.Add) must not write into another's.
	before := got.Header.Clone()
	for k := range got.Header {
		_ = append(got.Header[k], "appended")
	}
	if !reflect.DeepEqual(before, got.Header) {
		t.Fatalf("case %s: an append to one header value's slice changed another's", name)
	}
	// The bodies, through engineBody as Exchange wraps them.
	wc.limit, gc.limit = -1, -1
	wb := &engineBody{c: wc, rc: want.Body}
	if want.Body == http.NoBody {
		wb.eof = true
	}
	gb := &engineBody{c: gc, rc: got.Body}
	switch got.Body {
	case nil:
		gb.left = got.ContentLength
	case http.NoBody:
		gb.eof = true
	}
	wr, gr := readBody(wb, step), readBody(gb, step)
	if !bytes.Equal(wr.data, gr.data) || !errors.Is(gr.err, wr.err) || !errors.Is(wr.err, gr.err) || gr.after != wr.after || gr.eof != wr.eof {
		t.Fatalf("case %s: body read by the engine %q %v (then %v, eof %t), by ReadResponse's %q %v (then %v, eof %t)",
			name, truncate(string(gr.data), 100), gr.err, gr.after, gr.eof, truncate(string(wr.data), 100), wr.err, wr.after, wr.eof)
	}
	// What follows the body on the connection.
	wrest, _ := io.ReadAll(wc.br)
	grest, _ := io.ReadAll(gc.br)
	if !bytes.Equal(wrest, grest) {
		t.Fatalf("case %s: after the body the engine's reader holds %q, ReadResponse's %q", name, truncate(string(grest), 100), truncate(string(wrest), 100))
	}
}

// keepConnection puts back into resp, as ReadResponse read it from input,
// the Connection field ReadResponse took out (it names close), as the
// engine keeps it (read.go).
func keepConnection(resp *http.Response, input []byte) {
	if !resp.Close || resp.Header["Connection"] != nil {
		return
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(input)))
	if _, err := tp.ReadLine(); err != nil {
		return
	}
	if h, err := tp.ReadMIMEHeader(); err == nil && h["Connection"] != nil {
		resp.Header["Connection"] = h["Connection"]
	}
}

// Both readers keep the Connection field that names close, and with it the
// hop-by-hop fields it names (ReadResponse takes it out).
func TestReadAnswerKeepsConnection(t *testing.T) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nConnection: close\r\nX-Secret: s\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nConnection: close, X-Secret\r\nX-Secret: s\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", 6000) + "\r\nConnection: close, X-Secret\r\nContent-Length: 0\r\n\r\n",
	} {
		for _, chunk := range []int{0, 5} {
			c := feedEngineConn([]byte(s), chunk, 10<<20)
			resp, err := readAnswer(c, &http.Request{Method: "POST"})
			if err != nil {
				t.Fatal(err)
			}
			if !resp.Close || !httpguts.HeaderValuesContainsToken(resp.Header["Connection"], "x-secret") {
				t.Errorf("%.40q in pieces of %d: Close %t, Connection %q", s, chunk, resp.Close, resp.Header["Connection"])
			}
		}
	}
}

// answerSeeds are answers and would-be answers: the common ones readHead
// reads, and the odd ones it must leave to ReadResponse or read as it does.
var answerSeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Thu, 03 Dec 2026 16:00:00 GMT\r\nContent-Length: 12\r\n\r\nok /v1/write",
	"HTTP/1.1 201 Created\r\nLocation: /x/1\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-A: 1\r\nSet-Cookie: b=2\r\nset-cookie: c=3\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nConnection: x-hop\r\nX-Hop: 1\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nConnection: close, X-Secret\r\nX-Secret: s\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
	"HTTP/1.1 103 Early Hints\r\nConnection: close, X-Hop\r\nX-Hop: h\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.0 200 OK\r\nConnection: close, X-Hop\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 05\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
	"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length:  7 \t\r\n\r\nsevenxx",
	"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n X-Lead: a\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
	"HTTP/1.1 200 OK\r\nX-A: v\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: a\rb\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A : v\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n: v\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Tab:\tv\t \r\nX-Empty:\r\nX-Spaces:   \r\nX-Utf8: ünï\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nx-lower: 1\r\nCONTENT-TYPE: a\r\ncontent-length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: no-cache\r\nCache-Control: max-age=1\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTrailer: X-T\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\n\r\nuntil close",
	"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nEtag: \"x\"\r\n\r\n",
	"HTTP/1.1 304 Not Modified\r\nContent-Length: x\r\n\r\n",
	"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found",
	"HTTP/1.1 599 Odd\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 20x OK\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 O\x01K\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",
	"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n",
	"HTTP/1.1 200 OK\r\nX-A: v\n",
	"HTTP/1.1 200 OK\n\n",
	"HTTP/1.1 200 OK\r\n\n",
	"HTTP/1.1 100 Continue\r\n",
	"HTTP/1.0 200 OK\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
	"HTTP/1.1 200 OK\r\nContent-Len",
	"HTTP/1.1 200",
	"",
	"garbage\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 5000) + "\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 3000) + "\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + strings.Repeat("x", 5000) + "tail",
	// More names than readHead keeps to find a repeated one (8), each
	// repeated before and past that; Pragma and Connection repeated.
	"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nF: 6\r\nG: 7\r\nH: 8\r\nI: 9\r\nJ: 10\r\nA: 11\r\nJ: 12\r\nI: 13\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nPragma: x\r\nPragma: no-cache\r\nConnection: keep-alive\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\npragma: no-cache\r\nCache-Control: max-age=1\r\nContent-Length: 0\r\n\r\n",
	// Known names (scan's knownName) and their edges: in another case, a
	// name that begins as one does, one written two ways, repeated, more
	// of them than scan keeps, a hop-by-hop one.
	"HTTP/1.1 200 OK\r\ncontent-type: a\r\nContent-Type: b\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type: a\r\ncontent-type: b\r\nCONTENT-LENGTH: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nContent-Typed: a\r\nDates: b\r\nContent-Length2: 3\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type : a\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type\t: a\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type",
	"HTTP/1.1 200 OK\r\nContent-Type:",
	"HTTP/1.1 200 OK\r\nDate: a\r\nDate: b\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nETag: \"a\"\r\nEtag: \"b\"\r\nX-Request-ID: 1\r\nX-Request-Id: 2\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Type: t\r\nDate: d\r\nServer: s\r\nCache-Control: c\r\nETag: e\r\nLast-Modified: l\r\nVary: v\r\nX-Request-ID: x\r\nLocation: /l\r\nExpires: 0\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close, Server\r\nServer: s\r\nDate: d\r\nContent-Length: 0\r\n\r\n",
	// Values: tabs around them, empty, obs-text and refused bytes on
	// either side of an eight-byte word's edge, a CR without LF.
	"HTTP/1.1 200 OK\r\nContent-Type:\ttext/plain\t\r\nDate: \t d \t \r\nContent-Length:\t2\t\r\n\r\nok",
	"HTTP/1.1 200 OK\r\nContent-Type:\r\nServer: \r\nX-Empty:\t\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nServer: caf\xe9\r\nX-A: 1234567\xff89\r\nX-B: 12345678\x80\t9\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nServer: 1234567\x7f\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nServer: 12345678\x01\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nDate: abcdefgh\rijk\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nDate: abcdefgh\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nDate: abcdefgh\r",
	"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\rX\r\n\r\n",
	// Status lines whose reason has odd bytes, or is long.
	"HTTP/1.1 200 O\tK \xff\x80\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\x7f\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\rX\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 A reason longer than a word or two\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 \t\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 O",
	"HTTP/1.1 200\r",
	"HTTP/1.1 20",
	"\r\n",
}

// manyHeaders is a head with n fields, some duplicated.
func manyHeaders(n int) string {
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\n")
	for i := range n {
		b.WriteString("X-H" + strconv.Itoa(i%7) + ": v" + strconv.Itoa(i) + "\r\n")
	}
	b.WriteString("Content-Length: 3\r\n\r\nabc")
	return b.String()
}

// readHead reads the common answers to the same Response, body and rest
// as ReadResponse, and steps aside for every other (the seeds above,
// each for GET and HEAD, whole and in pieces, with a head limit that
// passes and one that does not).
func TestReadAnswerMatchesReadResponse(t *testing.T) {
	seeds := append(answerSeeds, manyHeaders(3), manyHeaders(40), manyHeaders(200))
	for i, s := range seeds {
		for _, method := range []string{"GET", "HEAD", "POST", ""} {
			for _, chunk := range []int{0, 1, 7, 100} {
				for _, maxHead := range []int64{10 << 20, 10} {
					for _, step := range []int{1, 3, 4096} {
						name := strconv.Itoa(i) + "/" + method + "/" + strconv.Itoa(chunk) + "/" + strconv.FormatInt(maxHead, 10) + "/" + strconv.Itoa(step)
						checkReadAnswer(t, name, []byte(s), method, chunk, maxHead, step)
					}
				}
			}
		}
	}
}

// readHead reads the common answer itself (it does not leave it to
// ReadResponse), and what the direct forward keeps of it (its status, its
// header's value slices; the map is the connection's, lent) does not
// change when the connection reads its next answer into the same buffer
// and the same map.
func TestReadAnswerReadsTheCommonCaseAndOutlivesTheConnection(t *testing.T) {
	first := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Id: first\r\nContent-Length: 2\r\n\r\nok"
	second := "HTTP/1.1 201 Created\r\nContent-Type: text/other\r\nX-Id: secnd\r\nContent-Length: 0\r\n\r\n"
	c := feedEngineConn([]byte(first+second), 0, 10<<20)
	req := &http.Request{Method: "POST"}
	res := readHead(c.br, req, c.header(), nil, false)
	if res == nil {
		t.Fatal("readHead left a common answer to ReadResponse")
	}
	b := &engineBody{c: c, left: res.ContentLength}
	if r := readBody(b, 512); string(r.data) != "ok" || r.err != nil {
		t.Fatalf("body %q %v", r.data, r.err)
	}
	xid, ct := res.Header["X-Id"], res.Header["Content-Type"]
	if res2 := readHead(c.br, req, c.header(), nil, false); res2 == nil || res2.StatusCode != 201 || res2.Header.Get("X-Id") != "secnd" {
		t.Fatalf("the second answer: %v", res2)
	}
	c.br.Reset(strings.NewReader(strings.Repeat("Z", 4096)))
	_, _ = c.br.Peek(4096)
	if res.Status != "200 OK" || len(xid) != 1 || xid[0] != "first" || len(ct) != 1 || ct[0] != "text/plain" {
		t.Fatalf("the first answer changed with the connection's buffer and map: %q %q %q", res.Status, xid, ct)
	}
}

// readHead reads itself (does not leave to ReadResponse) the common
// answers, whatever their names' spelling, their values' bytes and their
// fields' number: what TestReadAnswerMatchesReadResponse would still pass
// if readHead stepped aside.
func TestReadAnswerReadsCommonHeads(t *testing.T) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: d\r\nServer: s\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\ncontent-type: a\r\nContent-Type: b\r\nContent-Typed: c\r\ncontent-length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nETag: a\r\nEtag: b\r\nX-Request-ID: 1\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 O\tK \xff\r\nContent-Type:\ttext/plain\t\r\nServer:\r\nX-A: 1234567\xff89\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nConnection: close\r\nKeep-Alive: timeout=5\r\n\r\n",
		manyHeaders(3), manyHeaders(40),
		"HTTP/1.1 200 OK\r\nContent-Type: t\r\nDate: d\r\nServer: s\r\nCache-Control: c\r\nETag: e\r\nLast-Modified: l\r\nVary: v\r\nX-Request-ID: x\r\nLocation: /l\r\nExpires: 0\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
	} {
		for _, chunk := range []int{0, 1, 9} {
			c := feedEngineConn([]byte(s), chunk, 10<<20)
			if readHead(c.br, &http.Request{Method: "GET"}, nil, nil, false) == nil {
				t.Errorf("readHead left %q (in pieces of %d) to ReadResponse", truncate(s, 80), chunk)
			}
		}
	}
}

// The bytes readHead accepts in names and values are httpguts's: each
// byte alone, and at each place of the eight lineEnd reads at a time.
func TestReadAnswerBytesAreHttpgutsBytes(t *testing.T) {
	for c := range 256 {
		if wire.TokenByte[c] != httpguts.ValidHeaderFieldName(string([]byte{byte(c)})) {
			t.Errorf("name byte %#x: wire.TokenByte %t", c, wire.TokenByte[c])
		}
		for at := range 10 {
			v := []byte(strings.Repeat("v", at) + string([]byte{byte(c)}) + "vvvvvvvvvv\r\n")
			want := len(v) - 2
			if !httpguts.ValidHeaderFieldValue(string(v[:want])) {
				want = -1
			}
			if got := lineEnd(v, 0); got != want {
				t.Errorf("value byte %#x at %d: lineEnd %d, want %d", c, at, got, want)
			}
		}
	}
}

// FuzzReadAnswer: for any bytes from an upstream, readHead steps aside
// for ReadResponse, or reads the Response, body and rest ReadResponse
// reads; it never accepts what ReadResponse refuses.
// go test -fuzz FuzzReadAnswer ./gateway/internal/engine/
func FuzzReadAnswer(f *testing.F) {
	for i, s := range answerSeeds {
		f.Add([]byte(s), i%3 == 0, uint8(i%5), i%4 == 0, uint8(i))
	}
	f.Add([]byte(manyHeaders(30)), false, uint8(0), false, uint8(0))
	f.Fuzz(func(t *testing.T, input []byte, head bool, chunk uint8, smallLimit bool, step uint8) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		maxHead := int64(10 << 20)
		if smallLimit {
			maxHead = 16
		}
		checkReadAnswer(t, "fuzz", input, method, int(chunk), maxHead, 1+int(step))
	})
}

// BenchmarkReadAnswer: the common answer's head, by readHead and by
// ReadResponse.
func BenchmarkReadAnswer(b *testing.B) {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Thu, 03 Dec 2026 16:00:00 GMT\r\nContent-Length: 2\r\n\r\nok")
	req := &http.Request{Method: "POST"}
	r := bytes.NewReader(answer)
	br := bufio.NewReaderSize(r, 4<<10)
	lent := make(http.Header) // as the engine's connection lends it
	for _, bc := range []struct {
		name string
		read func() *http.Response
	}{
		{"readHead", func() *http.Response { return readHead(br, req, lent, nil, false) }},
		{"ReadResponse", func() *http.Response { res, _ := http.ReadResponse(br, req); return res }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(answer)
				br.Reset(r)
				if bc.read() == nil {
					b.Fatal("no answer")
				}
			}
		})
	}
}

// An exchange takes at most max1xx informational answers, and its heads,
// 1xx and final, share one budget of MaxResponseHeaderBytes: an upstream
// that floods 1xx fails the exchange, whether the request waits for 100
// Continue or not.
func TestInformationalAnswersAreBounded(t *testing.T) {
	hint := "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
	big := "HTTP/1.1 103 Early Hints\r\nLink: </" + strings.Repeat("a", 1000) + ">\r\n\r\n"
	final := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	cases := []struct {
		name, answer string
		expect       bool
		ok           bool
	}{
		{"100 hints", strings.Repeat(hint, max1xx) + final, false, true},
		{"101 hints", strings.Repeat(hint, max1xx+1) + final, false, false},
		{"expect: 99 hints and 100", strings.Repeat(hint, max1xx-1) + "HTTP/1.1 100 Continue\r\n\r\n" + final, true, true},
		{"expect: 100 hints and 100", strings.Repeat(hint, max1xx) + "HTTP/1.1 100 Continue\r\n\r\n" + final, true, false},
		{"heads within the budget", strings.Repeat(big, 4) + final, false, true},
		{"heads past the budget", strings.Repeat(big, 20) + final, false, false},
		{"expect: heads past the budget", strings.Repeat(big, 20) + "HTTP/1.1 100 Continue\r\n\r\n" + final, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				_, _ = io.WriteString(c, tc.answer)
				_, _ = io.Copy(io.Discard, br)
			}()
			std := &http.Transport{MaxResponseHeaderBytes: 8 << 10, ExpectContinueTimeout: time.Minute}
			e := New(std)
			defer e.CloseIdleConnections()
			req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/x", io.NopCloser(strings.NewReader("body")))
			req.ContentLength = 4
			w := &testWrite{}
			if tc.expect {
				req.Header.Set("Expect", "100-continue")
			} else {
				w.body = []byte("body")
			}
			heard := &hooksSeen{}
			resp, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Now().Add(10*time.Second), heard)
			if tc.ok != (err == nil) {
				t.Fatalf("after %d 1xx answers: %v, want success %t", len(heard.info), err, tc.ok)
			}
			if err == nil {
				_ = resp.Body.Close()
			} else if len(heard.info) > max1xx {
				t.Fatalf("%d 1xx answers went to the hooks", len(heard.info))
			}
		})
	}
}

// listDiff says how list, the fields readHead listed for an answer it read
// into h from head, differs from h: empty, or each of h's names once, in
// the order the head's lines name them, with the map's own values.
func listDiff(list wire.Fields, h http.Header, head string) string {
	if len(list) == 0 {
		return ""
	}
	if len(list) != len(h) {
		return fmt.Sprintf("%d listed, %d in the map", len(list), len(h))
	}
	var order []string
	for _, line := range strings.Split(head[:strings.Index(head, "\r\n\r\n")], "\r\n")[1:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			if k := textproto.CanonicalMIMEHeaderKey(name); !slices.Contains(order, k) {
				order = append(order, k)
			}
		}
	}
	for i, f := range list {
		vv := h[f.Name]
		if i >= len(order) || order[i] != f.Name {
			return fmt.Sprintf("%q listed %d, the head names %q", f.Name, i, order)
		}
		if !slices.Equal(f.Values, vv) || len(vv) > 0 && &vv[0] != &f.Values[0] {
			return fmt.Sprintf("%q listed with %q, the map has %q (or another array)", f.Name, f.Values, vv)
		}
	}
	return ""
}

// The common answer (known names, none repeated, none hop-by-hop) is
// listed; one with a hop-by-hop field, or a repeated or unknown name, is not.
func TestReadHeadListsTheCommonAnswer(t *testing.T) {
	for _, c := range []struct {
		head   string
		listed int
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\nok", 3},
		{"HTTP/1.1 201 Created\r\nDate: x\r\nLocation: /a\r\nContent-Length: 0\r\n\r\n", 3},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok", 0},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\nok", 0},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Own: 1\r\n\r\nok", 0},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nVary: a\r\nVary: b\r\n\r\nok", 0},
	} {
		c0 := feedEngineConn([]byte(c.head), len(c.head), 0)
		list := make(wire.Fields, 1, 4) // the last answer's, to be dropped
		res := readHead(c0.br, &http.Request{Method: "POST"}, http.Header{}, &list, true)
		if res == nil {
			t.Fatalf("%q: not read", c.head)
		}
		if len(list) != c.listed {
			t.Errorf("%q: %d fields listed, want %d", c.head, len(list), c.listed)
		}
		if diff := listDiff(list, res.Header, c.head); diff != "" {
			t.Errorf("%q: %s", c.head, diff)
		}
	}
}
