package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// hooksSeen records what an exchange's Hooks heard.
type hooksSeen struct {
	wrote bool
	info  []int
}

func (h *hooksSeen) WroteHeaders() { h.wrote = true }

func (*hooksSeen) AnswerHeader() http.Header { return nil }

func (*hooksSeen) AnswerFields() *wire.Fields { return nil }
func (h *hooksSeen) Got1xx(code int, _ textproto.MIMEHeader) error {
	h.info = append(h.info, code)
	return nil
}

// A write with Expect: 100-continue sends its body once the upstream
// says 100 Continue, or after ExpectContinueTimeout of silence; a final
// answer instead is the answer, and the body is not sent if the
// connection closes after it (it is, if the connection stays), as the
// Transport does it.
func TestExpectContinue(t *testing.T) {
	cases := []struct {
		name    string
		answer  func(w *bufio.Writer, readBody func() string) // the upstream, after the head
		wait    time.Duration                                 // ExpectContinueTimeout
		code    int
		body    string // what the upstream got of the body
		info    []int  // the 1xx answers heard
		dropped bool   // the connection is not kept
	}{
		{name: "continue", wait: time.Hour, code: 200, body: "body", info: []int{100}, answer: func(w *bufio.Writer, readBody func() string) {
			_, _ = w.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			_ = w.Flush()
			readBody()
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
		{name: "hints first", wait: time.Hour, code: 200, body: "body", info: []int{103, 100}, answer: func(w *bufio.Writer, readBody func() string) {
			_, _ = w.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n")
			_ = w.Flush()
			readBody()
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
		{name: "final, closing", wait: time.Hour, code: 417, body: "", dropped: true, answer: func(w *bufio.Writer, _ func() string) {
			_, _ = w.WriteString("HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		}},
		{name: "final, kept", wait: time.Hour, code: 401, body: "body", answer: func(w *bufio.Writer, readBody func() string) {
			_, _ = w.WriteString("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
			_ = w.Flush()
			readBody()
		}},
		{name: "silent", wait: time.Millisecond, code: 200, body: "body", answer: func(w *bufio.Writer, readBody func() string) {
			readBody()
			_, _ = w.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = ln.Close() })
			got := make(chan string, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- "accept: " + err.Error()
					return
				}
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				length := 0
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						got <- "head: " + err.Error()
						return
					}
					if v, ok := strings.CutPrefix(line, "Content-Length: "); ok {
						length, _ = strconv.Atoi(strings.TrimSpace(v))
					}
					if line == "\r\n" {
						break
					}
				}
				read := ""
				tc.answer(bw, func() string {
					b := make([]byte, length)
					n, _ := io.ReadFull(br, b)
					read = string(b[:n])
					return read
				})
				_ = bw.Flush()
				if tc.dropped {
					// Whatever else comes before the gateway closes.
					rest, _ := io.ReadAll(br)
					read += string(rest)
				}
				got <- read
			}()
			e := New(&http.Transport{ExpectContinueTimeout: tc.wait, MaxIdleConnsPerHost: 1})
			t.Cleanup(e.CloseIdleConnections)
			w := &testWrite{}
			req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+"/x", io.NopCloser(strings.NewReader("body")))
			req.ContentLength = 4
			req.Header.Set("Expect", "100-continue")
			var hooks hooksSeen
			resp, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Now().Add(time.Minute), &hooks)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != tc.code {
				t.Errorf("answer %d, want %d", resp.StatusCode, tc.code)
			}
			if body := <-got; body != tc.body {
				t.Errorf("the upstream got the body %q, want %q", body, tc.body)
			}
			if !hooks.wrote || w.checks.Load() == 0 || w.sent.Load() == 0 {
				t.Errorf("head reported %v, %d checks, %d bytes sent: want the head reported, checked and counted", hooks.wrote, w.checks.Load(), w.sent.Load())
			}
			if fmt.Sprint(hooks.info) != fmt.Sprint(tc.info) {
				t.Errorf("1xx heard %v, want %v", hooks.info, tc.info)
			}
			e.mu.Lock()
			kept := len(idleOf(e, upstreamKey{host: ln.Addr().String()}))
			e.mu.Unlock()
			if kept == 0 != tc.dropped {
				t.Errorf("%d connections kept, want the connection dropped: %v", kept, tc.dropped)
			}
		})
	}
}

// An upstream that answers before it has read the body, and stops taking
// it (a 413 for a body too large), is heard: its answer is the exchange's,
// not a broken connection, as the Transport's read goroutine hears it,
// also after a 1xx (103), which is heard too. The connection is not kept.
func TestEarlyAnswerDuringBody(t *testing.T) {
	for _, hints := range []bool{false, true} {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadFull(r.Body, make([]byte, 10))
			if hints {
				w.Header().Set("Link", "</a.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Del("Link")
			}
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
		}))
		t.Cleanup(up.Close)
		e, _ := newTestTransport(t)
		w := &testWrite{}
		const size = 64 << 20 // more than any socket buffer holds
		req, _ := http.NewRequest("POST", up.URL+"/big", io.LimitReader(zeros{}, size))
		req.ContentLength = size
		heard := &hooksSeen{}
		resp, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Time{}, heard)
		if err != nil {
			t.Fatalf("hints %v: the upstream's early answer was not heard: %v", hints, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || w.sent.Load() == 0 || w.sent.Load() >= size {
			t.Fatalf("hints %v: answer %d after %d bytes sent; want 413 after some of the body", hints, resp.StatusCode, w.sent.Load())
		}
		if want := map[bool]string{false: "[]", true: "[103]"}[hints]; fmt.Sprint(heard.info) != want {
			t.Errorf("hints %v: 1xx heard %v, want %s", hints, heard.info, want)
		}
		e.mu.Lock()
		for _, list := range e.idle {
			if len(list.conns) > 0 {
				t.Errorf("hints %v: a connection whose request was cut short was kept", hints)
			}
		}
		e.mu.Unlock()
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
