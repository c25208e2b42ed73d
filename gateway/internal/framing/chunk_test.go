package framing

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// scanChunked feeds a Transfer-Encoding head and then body, piece bytes at a
// time, and returns what the scanner made of the body.
func scanChunked(body []byte, piece int) chunkScan {
	var s scanner
	s.init(64 << 10)
	s.feed([]byte("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"))
	for len(body) > 0 {
		n := min(piece, len(body))
		s.feed(body[:n])
		body = body[n:]
	}
	return s.chunk
}

// goReadsChunked reports whether Go's chunked reader (the one its server
// uses, behind the same 4 KiB buffer) reads body to its last chunk.
func goReadsChunked(body []byte) bool {
	_, err := io.Copy(io.Discard, httputil.NewChunkedReader(bufio.NewReaderSize(bytes.NewReader(body), 4096)))
	return err == nil
}

func TestChunkScanner(t *testing.T) {
	for _, tc := range []struct {
		body      string
		bad, done bool
	}{
		{"3\r\nabc\r\n0\r\n\r\n", false, true},
		{"3;x=y\r\nabc\r\n0;z\r\n\r\n", false, true},
		{"3 \t\r\nabc\r\n0\r\n\r\n", false, true},
		{"3\r\nabc\r\n0\r\nX: y\r\n\r\n", false, false}, // trailer: Go judges
		{"3\r\nab", false, false},                       // not all here yet
		{"3\nabc\r\n0\r\n\r\n", true, false},
		{"3\r\nabcX\r\n0\r\n\r\n", true, false},
		{"3\r\nabc\n0\r\n\r\n", true, false},
		{"3\rx\nabc\r\n0\r\n\r\n", true, false},
		{" 3\r\nabc\r\n0\r\n\r\n", true, false},
		{"3 ;x\r\nabc\r\n0\r\n\r\n", true, false},
		{"0x3\r\nabc\r\n0\r\n\r\n", true, false},
		{"\r\n", true, false},
		{"00000000000000003\r\nabc\r\n0\r\n\r\n", true, false},
		{"0\n\r\n", true, false},
	} {
		for _, piece := range []int{1, 3, 1 << 20} {
			c := scanChunked([]byte(tc.body), piece)
			if (c.bad != "") != tc.bad || c.done != tc.done {
				t.Errorf("%q in pieces of %d: bad %q done %v, want bad %v done %v", tc.body, piece, c.bad, c.done, tc.bad, tc.done)
			}
		}
	}
}

// The scanner refuses only bodies Go's reader refuses, and says a body is
// whole only if Go's reader reads it whole.
func FuzzChunkScanner(f *testing.F) {
	for _, s := range []string{"3\r\nabc\r\n0\r\n\r\n", "3;x\r\nabc\r\n0\r\n\r\n", "3\nabc\r\n0\r\n\r\n", "A \r\n0123456789\r\n0\r\n\r\n", "3 ;x\r\n"} {
		f.Add([]byte(s), 1)
		f.Add([]byte(s), 1000)
	}
	f.Fuzz(func(t *testing.T, body []byte, piece int) {
		if piece < 1 {
			piece = 1
		}
		c := scanChunked(body, piece)
		if c.bad != "" && goReadsChunked(body) {
			t.Fatalf("the scanner refuses %q (%s); Go's reader takes it", body, c.bad)
		}
		// Go also refuses more than 16 KiB of chunk lines beyond what their
		// data allows, which the scanner does not count.
		if c.done && len(body) <= 16<<10 && !goReadsChunked(body) {
			t.Fatalf("the scanner takes %q as whole; Go's reader does not", body)
		}
	})
}
