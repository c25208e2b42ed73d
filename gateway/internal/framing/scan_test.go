package framing

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// scanChunks feeds data to a fresh scanner chunk bytes at a time and returns
// the heads it queued.
func scanChunks(data []byte, chunk int) []head {
	var s scanner
	s.init(64 << 10)
	for len(data) > 0 {
		n := min(chunk, len(data))
		s.feed(data[:n])
		data = data[n:]
	}
	return s.queue
}

func lineHash(line string) (uint64, int) {
	h := uint64(fnvOffset)
	for i := 0; i < len(line); i++ {
		h = (h ^ uint64(line[i])) * fnvPrime
	}
	return h, len(line)
}

func TestFrameScanner(t *testing.T) {
	type wantHead struct {
		line   string
		flags  uint8
		length int64
		bad    bool
	}
	const get = "GET / HTTP/1.1"
	for _, tc := range []struct {
		name string
		in   string
		want []wantHead
	}{
		{"get", get + "\r\nHost: x\r\n\r\n", []wantHead{{line: get}}},
		{"bare LF", get + "\nHost: x\n\n", []wantHead{{line: get}}},
		{"CR CR LF ends the line with a CR", get + "\r\r\nHost: x\r\n\r\n", []wantHead{{line: get + "\r"}}},
		{"content-length body skipped", "POST /a HTTP/1.1\r\nContent-Length: 24\r\n\r\nGET /smuggled HTTP/1.1\r\n" + get + "\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasCL, length: 24}, {line: get}}},
		{"both", "POST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get + "\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasCL | hasTE, length: 5}}},
		{"any case", "POST /a HTTP/1.1\r\ntransfer-ENCODING: chunked\r\ncontent-length:5\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasCL | hasTE, length: 5}}},
		{"TE stops the scan", "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + get + "\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasTE}}},
		{"whitespace around the length", "PUT /a HTTP/1.1\r\nContent-Length: \t 3 \t\r\n\r\nabc" + get + "\r\n\r\n",
			[]wantHead{{line: "PUT /a HTTP/1.1", flags: hasCL, length: 3}, {line: get}}},
		{"leading zeros", "PUT /a HTTP/1.1\r\nContent-Length: 003\r\n\r\nabc" + get + "\r\n\r\n",
			[]wantHead{{line: "PUT /a HTTP/1.1", flags: hasCL, length: 3}, {line: get}}},
		{"CRLF after a POST body is skipped", "POST /a HTTP/1.1\r\nContent-Length: 1\r\n\r\nx\r\n\r\n" + get + "\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasCL, length: 1}, {line: get}}},
		{"at most 4", "POST /a HTTP/1.1\r\nContent-Length: 1\r\n\r\nx\r\n\r\n\n" + get + "\r\n\r\n",
			[]wantHead{{line: "POST /a HTTP/1.1", flags: hasCL, length: 1}, {line: "", bad: true}}},
		{"not after a GET", get + "\r\n\r\n\r\n" + get + "\r\n\r\n", []wantHead{{line: get}, {line: "", bad: true}}},
		{"content-length lookalike", "GET / HTTP/1.1\r\nContent-Lengthy: 5\r\nXContent-Length: 5\r\n\r\n", []wantHead{{line: get}}},
		{"obs-fold", get + "\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n", []wantHead{{line: get, bad: true}}},
		{"folded TE", get + "\r\nTransfer-Encoding:\r\n chunked\r\n\r\n", []wantHead{{line: get, flags: hasTE, bad: true}}},
		{"two lengths", "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, length: 3, bad: true}}},
		{"underscore", "POST / HTTP/1.1\r\nTransfer_Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", []wantHead{{line: "POST / HTTP/1.1", bad: true}}},
		{"space before colon", "POST / HTTP/1.1\r\nContent-Length : 3\r\n\r\nabc", []wantHead{{line: "POST / HTTP/1.1", bad: true}}},
		{"signed length", "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, bad: true}}},
		{"two numbers", "POST / HTTP/1.1\r\nContent-Length: 3 3\r\n\r\nabc", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, length: 3, bad: true}}},
		{"empty length", "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, bad: true}}},
		{"huge length", "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, length: 999999999999999999, bad: true}}},
		{"TE chunked, identity", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasTE, bad: true}}},
		{"TE xchunked", "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL | hasTE, length: 5, bad: true}}},
		{"two TE lines", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasTE, bad: true}}},
		{"TE chunked with whitespace", "POST / HTTP/1.1\r\nTransfer-Encoding: \tChunked \r\n\r\n0\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasTE}}},
		{"CR inside the length", "POST / HTTP/1.1\r\nContent-Length: 3\r4\r\n\r\n", []wantHead{{line: "POST / HTTP/1.1", flags: hasCL, length: 3, bad: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, chunk := range []int{1, 2, 7, 1 << 20} {
				got := scanChunks([]byte(tc.in), chunk)
				if len(got) != len(tc.want) {
					t.Fatalf("chunk %d: %d heads %+v, want %d", chunk, len(got), got, len(tc.want))
				}
				for i, w := range tc.want {
					g := got[i]
					wh, wl := lineHash(w.line)
					if !w.bad && (g.lineHash != wh || g.lineLen != wl) {
						t.Errorf("chunk %d head %d: request line hash differs from %q", chunk, i, w.line)
					}
					if g.flags != w.flags || g.length != w.length || (g.bad != "") != w.bad {
						t.Errorf("chunk %d head %d: %+v, want %+v", chunk, i, g, w)
					}
				}
			}
		})
	}
}

// The queue is bounded; past it the scanner stops (the later requests are
// then refused, never matched to the wrong head).
func TestFrameScannerQueueBound(t *testing.T) {
	got := scanChunks(bytes.Repeat([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), maxQueued+5), 1<<20)
	if len(got) != maxQueued {
		t.Fatalf("%d heads queued, want %d", len(got), maxQueued)
	}
	var s scanner
	s.init(100)
	s.feed([]byte("GET /" + strings.Repeat("a", 200)))
	if len(s.queue) != 1 || s.queue[0].bad == "" || s.state != scanStopped {
		t.Fatalf("an oversized head: %+v, state %d", s.queue, s.state)
	}
}

// The scanner agrees with net/http's parser on every request Go reads from
// the same bytes, fed in any chunks: same request line, same framing; or
// it has refused the head, or stopped.
func FuzzFrameScanner(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /a HTTP/1.1\nHost: x\nContent-Length: 1\n\nx\r\n\r\nPUT /b HTTP/1.0\r\ncontent-length:  2 \r\n\r\nxy",
		"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nxyGET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
		"GET /\r HTTP/1.1\r\r\nContent-Length: 01\r\n\r\nx",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"POST / HTTP/1.1\r\nContent_Length: 1\r\ncontent-lengthX: 2\r\nTransfer_Encoding: chunked\r\nContent-Len: 3\r\n\r\nx",
		"POST /p?q=1 HTTP/1.1\r\nCONTENT-LENGTH: 1\r\nTRANSFER-ENCODING : chunked\r\n\r\nx",
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		whole := scanChunks(data, len(data)+1)
		parts := scanChunks(data, int(chunk%16)+1)
		if len(whole) != len(parts) {
			t.Fatalf("%d heads whole, %d in chunks of %d", len(whole), len(parts), chunk%16+1)
		}
		for i := range whole {
			if !reflect.DeepEqual(whole[i], parts[i]) {
				t.Fatalf("head %d: %+v whole, %+v in chunks", i, whole[i], parts[i])
			}
		}
		br := bufio.NewReader(bytes.NewReader(data))
		post := false
		for k := 0; ; k++ {
			if post { // what net/http's server does before a request after a POST
				peek, _ := br.Peek(4)
				n := 0
				for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
					n++
				}
				_, _ = br.Discard(n)
			}
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if k >= len(whole) {
				if k >= maxQueued {
					return
				}
				t.Fatalf("Go read request %d (%q), the scanner has no head for it", k, req.RequestURI)
			}
			h := whole[k]
			if h.bad != "" {
				return // refused, and the scanner stopped
			}
			if lh, n := requestLineHash(req); lh != h.lineHash || n != h.lineLen {
				t.Fatalf("request %d: the scanner's request line differs from Go's %q %q %q", k, req.Method, req.RequestURI, req.Proto)
			}
			if req.Method == "PRI" && req.ProtoMajor == 2 {
				return // the HTTP/2 preface: net/http reads nothing after it
			}
			if h.flags&hasTE != 0 {
				if req.ProtoAtLeast(1, 1) && len(req.TransferEncoding) == 0 {
					t.Fatalf("request %d: the scanner saw Transfer-Encoding, Go did not frame by it", k)
				}
				return // the connection's last request
			}
			if len(req.TransferEncoding) > 0 || req.ContentLength != h.length {
				t.Fatalf("request %d: Go framed %v/%d, the scanner %+v", k, req.TransferEncoding, req.ContentLength, h)
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
			post = req.Method == "POST"
		}
	})
}

func BenchmarkFrameScanner(b *testing.B) {
	req := []byte("POST /v1/proxy/statements/accounts/88213/lines?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n" +
		"User-Agent: Go-http-client/1.1\r\nContent-Length: 256\r\nContent-Type: application/octet-stream\r\n" +
		"Fencing-Lease: fl_4w5sz2l6kq3d7yq2ywj6n2k4xq7r3m2a\r\nAccept-Encoding: gzip\r\n\r\n" + strings.Repeat("x", 256))
	var s scanner
	s.init(1 << 20)
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	for b.Loop() {
		s.feed(req)
		s.queue = s.queue[:0]
	}
}
