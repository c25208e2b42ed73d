package gateway

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/fencegw/fencegw/gateway/internal/framing"
)

// What one small fenced POST costs the gateway, one at a time through a
// real listener (Listener, as fencegw serves), to a real upstream on a
// kept-alive connection. Client and upstream speak HTTP/1.1 by hand over
// their sockets and allocate nothing per request, so allocs/op is the
// gateway's (its server, its checks, Admit on the embedded store, the
// road):
//
//	go test -run '^$' -bench FencedWriteListener -benchmem -count 5 ./gateway/
func BenchmarkFencedWriteListener(b *testing.B) { benchFencedWrite(b, "") }

// BenchmarkFencedWriteListenerGoClient is the same write with the fields
// Go's client adds to every request (the Go SDK's, fencegw-load's).
func BenchmarkFencedWriteListenerGoClient(b *testing.B) {
	benchFencedWrite(b, "User-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n")
}

// benchFencedWrite measures fenced writes whose heads carry extra (whole
// field lines) besides the lease and the body's fields.
func benchFencedWrite(b *testing.B, extra string) {
	conn, br, req := fencedWriter(b, extra)
	b.ReportAllocs()
	for b.Loop() {
		writeOnce(b, conn, br, req)
	}
}

// fencedWriter serves a gateway (Listener, the embedded store) before
// rawUpstream and returns a connection to it, the connection's reader and a
// plain fenced write of a 200-byte body whose head carries extra (whole
// field lines) besides the lease and the body's fields.
func fencedWriter(tb testing.TB, extra string) (net.Conn, *bufio.Reader, []byte) {
	up := rawUpstream(tb)
	tg := startFraming(tb, "http://"+up, Config{}, false)
	lease := tg.leaseTTL(tb, "bench", time.Hour)
	conn, err := net.Dial("tcp", tg.addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	body := strings.Repeat("x", 200)
	req := []byte("POST /v1/proxy/svc/lines HTTP/1.1\r\nHost: gw\r\n" + extra + "Fencing-Lease: " + lease +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	return conn, bufio.NewReader(conn), req
}

// writeOnce sends req on conn and reads its answer, which must be a 200.
func writeOnce(tb testing.TB, conn net.Conn, br *bufio.Reader, req []byte) {
	if _, err := conn.Write(req); err != nil {
		tb.Fatal(err)
	}
	status, n, err := readHead(br)
	if err != nil || status != 200 {
		tb.Fatalf("answer %d: %v", status, err)
	}
	if _, err := br.Discard(n); err != nil {
		tb.Fatal(err)
	}
}

// rawUpstream answers every request on its connections with a fixed 200,
// after reading its head and Content-Length body; it returns its address.
func rawUpstream(b testing.TB) string {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	return rawServer(b, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			_, n, err := readHead(br)
			if err != nil {
				return
			}
			if _, err := br.Discard(n); err != nil {
				return
			}
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	})
}

// readHead reads an HTTP/1.1 message head from br: the status code of a
// response (0 for a request) and the Content-Length (0 if none).
func readHead(br *bufio.Reader) (status, length int, err error) {
	first := true
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return status, length, nil
		}
		if first {
			first = false
			if rest, ok := bytes.CutPrefix(line, []byte("HTTP/1.1 ")); ok && len(rest) >= 3 {
				status = int(rest[0]-'0')*100 + int(rest[1]-'0')*10 + int(rest[2]-'0')
			}
			continue
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("Content-Length")) {
			for _, c := range bytes.TrimSpace(value) {
				if c < '0' || c > '9' {
					return 0, 0, io.ErrUnexpectedEOF
				}
				length = length*10 + int(c-'0')
			}
		}
	}
}

// A request's state is one allocation (requestState, framing.go): past
// 1,024 bytes it takes the next size class, 128 bytes more for every
// write, which BenchmarkFencedWriteListener's B/op shows only when run.
func TestRequestStateFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(requestState{}); n > 1024 {
		t.Fatalf("requestState is %d bytes, past the 1,024-byte size class", n)
	}
}

// A plain fenced write (Go's client's head, an answer of known names) takes
// the road's two lists for their header maps: the request's fields as the
// own loop listed them, the answer's as the engine did (framing.Taken,
// counted as the tests verify them). A change that left the road walking
// the maps again would pass every other test.
func TestAPlainWriteTakesBothLists(t *testing.T) {
	conn, br, req := fencedWriter(t, "User-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n")
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	requests, answers := framing.Taken.Request.Load(), framing.Taken.Answer.Load()
	for range 3 {
		writeOnce(t, conn, br, req)
	}
	if got := framing.Taken.Request.Load() - requests; got < 3 {
		t.Errorf("3 writes took %d request lists, want 3", got)
	}
	if got := framing.Taken.Answer.Load() - answers; got < 3 {
		t.Errorf("3 writes took %d answer lists, want 3", got)
	}
}
