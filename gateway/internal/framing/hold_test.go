package framing

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// FuzzTakenHeadScansAsFed: a head the loop parses itself (parseLean) is
// noted by the scanner from that parse (takeHead) as the scanner would
// have noted it from its bytes, and the scanner is left where following
// the bytes leaves it: the same refusal (a look-alike of a framing
// field), the same framing, the same state for the body and the requests
// after, after a POST or not, with the CR and LF the loop drops before it,
// with a head larger than the scanner takes.
func FuzzTakenHeadScansAsFed(f *testing.F) {
	for _, s := range leanSeeds {
		f.Add([]byte(s+"abcPOST /b HTTP/1.1\r\nHost: gw\r\n\r\n"), uint8(0), false, uint16(0))
	}
	f.Add([]byte("POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent_Length: 3\r\n\r\nabc"), uint8(0), false, uint16(0))
	f.Add([]byte("POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\ntransfer_encoding: chunked\r\n\r\n0\r\n\r\n"), uint8(2), true, uint16(0))
	f.Add([]byte("POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nxy\r\nGET /c HTTP/1.1\r\n"), uint8(4), true, uint16(0))
	f.Add([]byte("POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nxy"), uint8(3), false, uint16(40))
	f.Fuzz(func(t *testing.T, data []byte, lead uint8, afterPost bool, maxHead uint16) {
		end := wire.HeadEnd(data)
		if end <= 0 {
			return // the loop takes a whole head of CRLF lines
		}
		lr := new(leanRequest)
		if _, ok := parseLean(data[:end], leanTemplate(), lr); !ok {
			return
		}
		dropped := []byte("\r\n\n\r")[:lead%5]
		limit := 64 << 10
		if maxHead > 0 {
			limit = 32 + int(maxHead%512) // past the POST before, maybe not past the head
		}
		var fed, taken scanner
		for _, s := range []*scanner{&fed, &taken} {
			s.init(limit)
			if afterPost {
				s.feed([]byte("POST / HTTP/1.1\r\nHost: x\r\n\r\n"))
				s.queue = s.queue[:0] // taken by its handler
			}
		}
		fed.feed(dropped)
		fed.feed(data)
		if !taken.hold() {
			t.Fatalf("no hold between two requests (state %d)", taken.state)
		}
		taken.feed(dropped)
		for rest := data; len(rest) > 0; rest = rest[min(7, len(rest)):] {
			taken.feed(rest[:min(7, len(rest))]) // counted as read, in reads of any size
		}
		taken.takeHead(dropped, data, end, lr.scanned(), lr.req.Method == "POST")

		// The scan the parse gave is the lean one: no line hash, and the
		// parse's fields, which a scan does not list.
		for _, h := range []*head{&taken.cur, firstOf(taken.queue)} {
			if h != nil && h.lean {
				if h.lineHash != 0 {
					t.Fatalf("a lean head with a line hash: %+v", h)
				}
				h.lean, h.lineHash, h.fields = false, fed.queue[0].lineHash, nil
			}
		}
		if a, b := followed(&taken), followed(&fed); !reflect.DeepEqual(a, b) {
			t.Fatalf("the head taken from the parse:\n%+v\nfollowed from its bytes:\n%+v\nhead %q", a, b, data[:end])
		}
	})
}

// scanView is what of a scanner decides what it does next: its state
// and queue, and what it notes of the line it is in (a field's name or
// value, the request line's method), which it sets afresh at each line's
// start.
type scanView struct {
	state                   uint8
	cr                      bool
	skipCRLF, held, headLen int
	bodyLeft                int64
	cur                     head
	isPost                  bool
	chunk                   chunkScan
	queue                   []head
	line                    [4]any
}

func followed(s *scanner) scanView {
	v := scanView{state: s.state, cr: s.cr, skipCRLF: s.skipCRLF, held: s.held, headLen: s.headLen, bodyLeft: s.bodyLeft,
		cur: s.cur, isPost: s.isPost, chunk: s.chunk, queue: s.queue}
	switch s.state {
	case scanLine:
		v.line[0] = s.method
	case scanName:
		v.line = [4]any{s.nameLen, s.notCL, s.notTE, s.underscore}
	case scanLength:
		v.line = [4]any{s.digits, s.trailing}
	case scanTE:
		v.line = [4]any{s.teMatched, s.teState}
	}
	return v
}

func firstOf(q []head) *head {
	if len(q) == 0 {
		return nil
	}
	return &q[0]
}

// TestHoldCountsWhatWasRead: the bytes the loop hands back must be those
// read while held; any others stop the scanner, which then verifies no
// request of the connection (every one is refused), rather than follow
// bytes it cannot place.
func TestHoldCountsWhatWasRead(t *testing.T) {
	const req = "POST /v1/proxy/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 1\r\n\r\nx"
	var s scanner
	s.init(64 << 10)
	if !s.hold() {
		t.Fatal("no hold at the start")
	}
	s.feed([]byte(req))
	s.release(nil, []byte(req[1:]))
	if s.state != scanStopped || len(s.queue) != 0 {
		t.Fatalf("bytes other than those read were followed: state %d, %+v", s.state, s.queue)
	}

	s = scanner{}
	s.init(64 << 10)
	s.feed([]byte("POST /a HTTP/1.1\r\nHost: gw\r\n\r\n"))
	if s.hold() {
		t.Fatal("held with a head queued that no handler took")
	}
	s.queue = s.queue[:0]
	s.feed([]byte("POST /a HTTP/1.1\r\n"))
	if s.hold() {
		t.Fatal("held in the middle of a head")
	}
}

// TestHeldConnectionClosesAtOnce: a connection the loop waits on, held
// with nothing read, is between two requests: its close does not linger
// (which would keep its socket half a second); with bytes read, it is in
// the middle of one.
func TestHeldConnectionClosesAtOnce(t *testing.T) {
	var c conn
	c.scan.init(64 << 10)
	if !c.holdHead() {
		t.Fatal("no hold")
	}
	if c.midRequest() {
		t.Fatal("a held connection with nothing read is taken for one in the middle of a request")
	}
	c.scan.feed([]byte(strings.Repeat("P", 3)))
	if !c.midRequest() {
		t.Fatal("a held connection with a request's first bytes read is taken for one between requests")
	}
}
