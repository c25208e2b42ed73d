package framing

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// takesOwn is the Own of these tests: POST and PUT under /own/.
func takesOwn(line []byte) bool {
	return bytes.HasPrefix(line, []byte("POST /own/")) || bytes.HasPrefix(line, []byte("PUT /own/"))
}

// serveBoth serves h through Listener with own (nil: Go's server alone).
func serveBoth(t testing.TB, h http.Handler, own Own, setup func(*http.Server)) (addr string, srv *http.Server, ln ServingListener) {
	t.Helper()
	srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, Handler: h}
	if setup != nil {
		setup(srv)
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = Listener(srv, inner, nil, nil, own)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return inner.Addr().String(), srv, ln
}

// servedBy answers which server served the request, and what Check said.
func servedBy(w http.ResponseWriter, r *http.Request) {
	v, scanned := Check(r)
	body, err := io.ReadAll(r.Body)
	server := "go"
	if _, ok := w.(*response); ok {
		server = "own"
	}
	if v.TransferEncoding || v.Field != "" {
		w.Header().Set("Connection", "close")
	}
	fmt.Fprintf(w, "%s %s %s scanned=%v field=%q body=%q err=%v", server, r.Method, r.URL.Path, scanned, v.Field, body, err)
}

// dialLoop opens a connection to addr for a test's requests, with a
// deadline for the whole test, and its reader.
func dialLoop(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// readAnswers reads n answers from br.
func readAnswers(t *testing.T, br *bufio.Reader, n int) []string {
	t.Helper()
	var got []string
	for range n {
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode == http.StatusContinue {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil {
			t.Fatalf("after %d answers %q: %v", len(got), got, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strconv.Itoa(resp.StatusCode)+" "+string(b))
	}
	return got
}

// One keep-alive connection carries requests for both servers, one at a
// time and pipelined: the loop serves the requests Own takes and lends the
// rest to Go's server, which gives the connection back when the next
// request is the loop's; every request is checked against its scanned head
// on either road, in order.
func TestOwnLoopSharesAConnectionWithGoServer(t *testing.T) {
	addr, _, _ := serveBoth(t, http.HandlerFunc(servedBy), takesOwn, nil)
	c, br := dialLoop(t, addr)
	steps := []struct {
		raw  string
		want []string
	}{
		{"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
			[]string{`200 own POST /own/a scanned=true field="" body="hi" err=<nil>`}},
		{"GET /ctl HTTP/1.1\r\nHost: x\r\n\r\n",
			[]string{`200 go GET /ctl scanned=true field="" body="" err=<nil>`}},
		{"POST /own/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb",
			[]string{`200 own POST /own/b scanned=true field="" body="b" err=<nil>`}},
		// Pipelined: the loop's, then Go's, which serves what it was lent
		// with it.
		{"PUT /own/c HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\ncGET /ctl2 HTTP/1.1\r\nHost: x\r\n\r\nPOST /own/d HTTP/1.1\r\nHost: x\r\n\r\n",
			[]string{`200 own PUT /own/c scanned=true field="" body="c" err=<nil>`, `200 go GET /ctl2 scanned=true field="" body="" err=<nil>`, `200 go POST /own/d scanned=true field="" body="" err=<nil>`}},
		{"POST /own/d2 HTTP/1.1\r\nHost: x\r\n\r\n",
			[]string{`200 own POST /own/d2 scanned=true field="" body="" err=<nil>`}},
		// Requests the loop never takes whatever Own says: Expect, HTTP/1.0,
		// a bare LF, no Host.
		{"POST /own/e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\ne",
			[]string{`200 go POST /own/e scanned=true field="" body="e" err=<nil>`}},
		{"POST /own/f HTTP/1.1\nHost: x\nContent-Length: 1\n\nf",
			[]string{`200 go POST /own/f scanned=true field="" body="f" err=<nil>`}},
		{"POST /own/g HTTP/1.1\r\nHost: x\r\n\r\n",
			[]string{`200 own POST /own/g scanned=true field="" body="" err=<nil>`}},
		// A POST's trailing CRLF is dropped as Go's server drops it.
		{"POST /own/h HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nh\r\nPOST /own/i HTTP/1.1\r\nHost: x\r\n\r\n",
			[]string{`200 own POST /own/h scanned=true field="" body="h" err=<nil>`, `200 own POST /own/i scanned=true field="" body="" err=<nil>`}},
		// Chunked: Go's server, and the connection ends after it.
		{"POST /own/j HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nj\r\n0\r\n\r\n",
			[]string{`200 go POST /own/j scanned=true field="" body="j" err=<nil>`}},
	}
	for i, s := range steps {
		// Go's server takes the first byte of a request that comes before
		// it has ended its background read (just after the answer left),
		// and then keeps the connection: give it time to end it, so that
		// the connection comes back to the loop.
		time.Sleep(20 * time.Millisecond)
		if _, err := io.WriteString(c, s.raw); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got := readAnswers(t, br, len(s.want))
		if strings.Join(got, "\n") != strings.Join(s.want, "\n") {
			t.Errorf("step %d: got\n%s\nwant\n%s", i, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the chunked request the connection stays open: %v", err)
	}
}

// Check hands a handler the fields of a head the loop parsed itself, in
// the order sent, each name once with the header map's values, the next
// request's own on a kept connection; and none for a request Go's server
// parsed.
func TestCheckListsTheFieldsOfTheLoopsHeads(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	addr, _, _ := serveBoth(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := Check(r)
		_, _ = io.Copy(io.Discard, r.Body)
		var b strings.Builder
		_, own := w.(*response)
		fmt.Fprintf(&b, "own=%v", own)
		for _, f := range v.Fields {
			vv := r.Header[f.Name]
			same := len(vv) == len(f.Values) && (len(vv) == 0 || &vv[0] == &f.Values[0])
			fmt.Fprintf(&b, " %s=%q(%v)", f.Name, f.Values, same)
		}
		if v.Fields != nil && len(v.Fields) != len(r.Header) {
			fmt.Fprintf(&b, " listed %d of %d", len(v.Fields), len(r.Header))
		}
		mu.Lock()
		seen = append(seen, b.String())
		mu.Unlock()
	}), takesOwn, nil)
	c, br := dialLoop(t, addr)
	for _, raw := range []string{
		"POST /own/a HTTP/1.1\r\nHost: x\r\nUser-Agent: u\r\nContent-Length: 2\r\nX-B: 1\r\nx-b: 2\r\nAccept: a\r\n\r\nhi",
		"POST /own/b HTTP/1.1\r\nZ: z\r\nHost: x\r\nA: a\r\n\r\n",
	} {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		readAnswers(t, br, 1)
	}
	exchangeAll(t, addr, []byte("POST /own/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-C: c\r\n\r\n0\r\n\r\n"))
	want := []string{
		`own=true User-Agent=["u"](true) Content-Length=["2"](true) X-B=["1" "2"](true) Accept=["a"](true)`,
		`own=true Z=["z"](true) A=["a"](true)`,
		`own=false`,
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the handler saw\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// Check says a lean head's request is never cancelled only when its
// context has no Done: not on a server whose base context can end, nor
// for a request Go's server serves.
func TestCheckNeverDoneOnlyWithoutDone(t *testing.T) {
	for _, cancellable := range []bool{false, true} {
		var mu sync.Mutex
		var seen []string
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v, _ := Check(r)
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s never=%v done=%v", r.URL.Path, v.NeverDone, r.Context().Done() == nil))
			mu.Unlock()
		})
		base, cancel := context.WithCancel(context.Background())
		defer cancel()
		addr, _, _ := serveBoth(t, handler, takesOwn, func(srv *http.Server) {
			if cancellable {
				srv.BaseContext = func(net.Listener) context.Context { return base }
			}
		})
		exchangeAll(t, addr, []byte("POST /own/a HTTP/1.1\r\nHost: x\r\n\r\n"))
		exchangeAll(t, addr, []byte("GET /go HTTP/1.1\r\nHost: x\r\n\r\n"))
		want := "/own/a never=true done=true\n/go never=false done=false"
		if cancellable {
			want = "/own/a never=false done=false\n/go never=false done=false"
		}
		mu.Lock()
		got := strings.Join(seen, "\n")
		mu.Unlock()
		if got != want {
			t.Errorf("base context cancellable %v: the handler saw\n%s\nwant\n%s", cancellable, got, want)
		}
	}
}

// A request the loop refuses before any handler (a header Go's server
// refuses) gets Go's answer, as the gateway's refusal replaces it.
func TestOwnLoopRefusesWhatGoRefuses(t *testing.T) {
	for _, own := range []Own{takesOwn, nil} {
		addr, _, _ := serveBoth(t, http.HandlerFunc(servedBy), own, nil)
		for _, raw := range []string{
			"POST /own/a HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
			"POST /own/a HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
			"POST /own/a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
			"POST /own/a HTTP/1.1\r\nHost: x y\r\n\r\n",
			"POST /own/a HTTP/1.1\r\n\r\n",
			"POST /own/a%zz HTTP/1.1\r\nHost: x\r\n\r\n",
			"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
			"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, raw)
			all, _ := io.ReadAll(c)
			c.Close()
			if !bytes.HasPrefix(all, []byte("HTTP/1.1 400 ")) || !bytes.Contains(all, []byte("application/problem+json")) {
				t.Errorf("own=%v: %q got %q, want a 400 problem", own != nil, raw, all)
			}
		}
	}
}

var (
	dateField = regexp.MustCompile(`(?m)^Date: .*\r\n`)
	zs        = regexp.MustCompile(`z{10,}`)
)

// The loop's answers are Go's server's, byte for byte (but for Date), and
// so is whether the connection carries the next request: for every kind of
// answer a handler can write.
func TestOwnLoopAnswersAsGoServer(t *testing.T) {
	big := strings.Repeat("z", 5000)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := Check(r)
		h := w.Header()
		// list lists h's fields named in the answer's list, as the
		// engine lists an answer it reads into h (Go's server has none).
		list := func(names ...string) {
			if v.Answer != nil {
				for _, k := range names {
					*v.Answer = append(*v.Answer, wire.Field{Name: k, Values: h[k]})
				}
			}
		}
		switch r.URL.Path {
		case "/own/listed":
			h.Set("Content-Type", "text/plain")
			h.Set("X-B", "b")
			h.Set("Content-Length", "2")
			list("X-B", "Content-Type", "Content-Length")
			_, _ = io.WriteString(w, "ok")
		case "/own/listed-then-added": // the list no longer the header's: not taken
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", "2")
			list("Content-Type", "Content-Length")
			h.Set("X-Added", "1")
			_, _ = io.WriteString(w, "ok")
		case "/own/short": // a length and a sniffed type added
			_, _ = io.WriteString(w, "<html>hi")
		case "/own/typed":
			h.Set("Content-Type", "application/json")
			h.Set("Content-Length", "2")
			_, _ = io.WriteString(w, "{}")
		case "/own/long": // chunked
			_, _ = io.WriteString(w, big)
		case "/own/flushed":
			_, _ = io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "b")
		case "/own/empty":
		case "/own/204":
			h.Set("Content-Length", "5")
			h.Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusNoContent)
			_, err := io.WriteString(w, "x")
			h.Set("X-Err", fmt.Sprint(err))
		case "/own/304":
			h.Set("Content-Type", "text/plain")
			h.Set("Etag", `"1"`)
			w.WriteHeader(http.StatusNotModified)
		case "/own/1xx":
			h.Set("Link", "</a>")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("Link")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "made")
		case "/own/trailers":
			h.Set("Trailer", "X-Sum, Host, X-Unsent")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "body")
			h.Set("X-Sum", "42")
			h.Set(http.TrailerPrefix+"X-Late", "1")
		case "/own/prefix-trailer":
			_, _ = io.WriteString(w, "body")
			h.Set(http.TrailerPrefix+"X-Late", "1")
		case "/own/prefix-trailer-first": // set before the head: chunked, no length
			h.Set(http.TrailerPrefix+"X-Early", "1")
			_, _ = io.WriteString(w, "body")
		case "/own/short-length": // declared 10, wrote 3: the connection ends
			h.Set("Content-Length", "10")
			_, _ = io.WriteString(w, "abc")
		case "/own/over-length":
			h.Set("Content-Length", "2")
			_, err := io.WriteString(w, "abc")
			_, _ = io.WriteString(w, fmt.Sprint(err))
		case "/own/bad-length":
			h.Set("Content-Length", "x")
			_, _ = io.WriteString(w, "ok")
		case "/own/bad-length-typed": // typed: the head goes out at once, without the length
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", "x")
			_, _ = io.WriteString(w, "ok")
		case "/own/close":
			h.Set("Connection", "close")
			_, _ = io.WriteString(w, "bye")
		case "/own/identity":
			h.Set("Transfer-Encoding", "identity")
			_, _ = io.WriteString(w, "raw")
		case "/own/chunked-set":
			h.Set("Transfer-Encoding", "chunked")
			h.Set("Content-Length", "3")
			_, _ = io.WriteString(w, "abc")
		case "/own/after-header":
			w.WriteHeader(http.StatusAccepted)
			h.Set("X-After", "not sent")
			_, _ = io.WriteString(w, "x")
		case "/own/encoded":
			h.Set("Content-Encoding", "gzip")
			_, _ = io.WriteString(w, "\x1f\x8b")
		case "/own/odd-status":
			w.WriteHeader(299)
		case "/own/headers":
			h["X-Multi"] = []string{"1", "2"}
			h.Set("X-Newline", "a\nb")
			h["Bad Name"] = []string{"dropped"}
			h.Set("Date", "Mon, 01 Jan 2024 00:00:00 GMT")
			_, _ = io.WriteString(w, "h")
		case "/own/read-half": // reads part of the body: the rest is read and dropped
			var b [2]byte
			_, _ = io.ReadFull(r.Body, b[:])
			_, _ = w.Write(b[:])
		case "/own/close-body":
			_ = r.Body.Close()
			_, _ = io.WriteString(w, "closed")
		case "/own/request-close": // Go's server reads the request's header again
			r.Header.Set("Connection", "close")
			_, _ = io.WriteString(w, "asked")
		case "/own/204-te":
			h.Set("Transfer-Encoding", "chunked")
			w.WriteHeader(http.StatusNoContent)
		case "/own/length-te-empty": // a Transfer-Encoding field with no value
			h["Transfer-Encoding"] = []string{}
			h.Set("Content-Length", "2")
			_, _ = io.WriteString(w, "ok")
		}
	})
	ownAddr, _, _ := serveBoth(t, handler, takesOwn, nil)
	goAddr, _, _ := serveBoth(t, handler, nil, nil)
	exchange := func(addr, raw string) string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, raw+"POST /own/short HTTP/1.1\r\nHost: x\r\n\r\n")
		var rec bytes.Buffer
		br := bufio.NewReader(io.TeeReader(c, &rec))
		var out []string
		for finals := 0; finals < 2; {
			resp, err := http.ReadResponse(br, nil)
			if err == nil && resp.StatusCode < 200 {
				continue
			}
			finals++
			if err != nil {
				out = append(out, "read: "+err.Error())
				break
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil {
				out = append(out, "body: "+err.Error())
				break
			}
		}
		got := dateField.ReplaceAllString(rec.String(), "Date: -\r\n") + "\n" + strings.Join(out, "\n")
		return zs.ReplaceAllStringFunc(got, func(z string) string { return "z*" + strconv.Itoa(len(z)) })
	}
	for _, path := range []string{"listed", "listed-then-added", "short", "typed", "long", "flushed", "empty", "204", "304", "1xx", "trailers",
		"prefix-trailer", "prefix-trailer-first", "short-length", "over-length", "bad-length", "bad-length-typed", "close", "identity", "chunked-set",
		"after-header", "encoded", "odd-status", "headers", "read-half", "close-body", "request-close", "204-te", "length-te-empty"} {
		for _, req := range []string{
			"POST /own/" + path + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"PUT /own/" + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabcdef",
			"POST /own/" + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1\r\n\r\na",
			// Not a close to the request's parse (r.Close), a close to
			// the server's look at the field's words.
			"POST /own/" + path + " HTTP/1.1\r\nHost: x\r\nConnection: keep-alive close\r\n\r\n",
		} {
			if got, want := exchange(ownAddr, req), exchange(goAddr, req); got != want {
				t.Errorf("%q:\nthe loop:\n%s\nGo's server:\n%s", req, got, want)
			}
		}
	}
}

// A body larger than 256 KiB that the handler leaves unread closes the
// connection, as with Go's server; a smaller one is read and dropped.
func TestOwnLoopUnreadBody(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Check(r)
		_, _ = io.WriteString(w, "ok")
	})
	for _, size := range []int{10, 300 << 10} {
		for _, own := range []Own{takesOwn, nil} {
			addr, _, _ := serveBoth(t, handler, own, nil)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			go func() {
				_, _ = io.WriteString(c, "POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n"+strings.Repeat("b", size)+
					"POST /own/b HTTP/1.1\r\nHost: x\r\n\r\n")
			}()
			br := bufio.NewReader(c)
			n := 0
			for n < 2 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					break
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				n++
			}
			c.Close()
			want := 2
			if size > maxPostHandlerReadBytes {
				want = 1
			}
			if n != want {
				t.Errorf("own=%v, an unread body of %d bytes: %d answers, want %d", own != nil, size, n, want)
			}
		}
	}
}

// The listener's Shutdown waits for the requests the loop serves; its
// close ends the loop's idle connections at once and the busy ones after
// their answer, which says Connection: close.
func TestOwnLoopShutdown(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Check(r)
		if r.URL.Path == "/own/slow" {
			once.Do(func() { close(entered) })
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	addr, srv, ln := serveBoth(t, handler, takesOwn, nil)
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(idle, "POST /own/a HTTP/1.1\r\nHost: x\r\n\r\n")
	ib := bufio.NewReader(idle)
	readAnswers(t, ib, 1)

	busy, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_ = busy.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(busy, "POST /own/slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := ib.ReadByte(); err != io.EOF {
		t.Errorf("an idle connection of the loop after the listener closed: %v, want EOF", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if err := ln.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Errorf("Shutdown with a request in the loop: %v, want it to wait", err)
	}
	cancel()
	close(release)
	if err := ln.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Close {
		t.Errorf("the answer of a request served during shutdown keeps the connection: %v", resp.Header)
	}
}

// Abort closes the loop's busy connections too: a request whose body
// trickles in sees its read fail, its handler returns, and Shutdown, which
// waited for it, returns.
func TestOwnLoopAbortCutsBusyConnections(t *testing.T) {
	entered := make(chan struct{})
	read := make(chan error, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Check(r)
		var b [1]byte
		_, _ = io.ReadFull(r.Body, b[:])
		close(entered)
		_, err := io.ReadAll(r.Body)
		read <- err
	})
	addr, srv, ln := serveBoth(t, handler, takesOwn, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST /own/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx")
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err) // Go's server serves nothing here
	}
	if err := ln.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Fatalf("Shutdown with a body still coming: %v, want it to wait", err)
	}
	cancel()
	_ = srv.Close()
	ln.Abort()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown after Abort: %v, want the cut request's handler to return", err)
	}
	if err := <-read; err == nil {
		t.Error("the body's read after Abort: nil, want it to fail")
	}
}

// http.Server.Close returns while Serve waits in the listener's Accept:
// closing the listener ends that wait, even when the real listener's
// Accept fails only after the close (slowClose).
func TestOwnLoopServerCloseReturns(t *testing.T) {
	for range 5 {
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(servedBy)}
		ln := Listener(srv, slowClose{inner}, nil, nil, takesOwn)
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		time.Sleep(10 * time.Millisecond) // Serve is in Accept
		done := make(chan error, 1)
		go func() { done <- srv.Close() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("http.Server.Close did not return: Serve is stuck in the listener's Accept")
		}
		<-served
	}
}

// slowClose is a listener whose Accept fails a while after Close.
type slowClose struct{ net.Listener }

func (l slowClose) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		time.Sleep(50 * time.Millisecond)
	}
	return c, err
}

// echoRequest answers what the handler saw of a request, whichever server
// served it.
func echoRequest(w http.ResponseWriter, r *http.Request) {
	v, scanned := Check(r)
	body, err := io.ReadAll(r.Body)
	if v.TransferEncoding || v.Field != "" {
		w.Header().Set("Connection", "close")
	}
	fmt.Fprintf(w, "%s %s %q host=%q len=%d scanned=%v field=%q reason=%q body=%q err=%v header=%v",
		r.Method, r.RequestURI, r.URL.Path, r.Host, r.ContentLength, scanned, v.Field, v.Reason, body, err, r.Header)
}

// exchangeAll writes raw on a connection to addr, says it is done writing,
// and reads what comes back until the server closes: Date lines dropped.
func exchangeAll(t *testing.T, addr string, raw []byte) string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write(raw)
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		return dateField.ReplaceAllString(string(got), "Date: -\r\n") + "\nerror: " + err.Error()
	}
	return dateField.ReplaceAllString(string(got), "Date: -\r\n")
}

// Any bytes a client sends get the same answers, in the same order, from
// the listener with its own loop and from Go's server alone behind the same
// listener: the loop takes only what it serves as Go's server would, and
// lends the rest.
func FuzzOwnLoopMatchesGoServer(f *testing.F) {
	for _, seed := range []string{
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /ctl HTTP/1.1\r\nHost: x\r\n\r\nPUT /own/b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx\r\nPOST /own/b HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"POST /own/a HTTP/1.1\nHost: x\nContent-Length: 1\n\nx",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\n Folded: 1\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
		"POST /own/a HTTP/1.0\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
		"PUT /own/%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /own/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab",
	} {
		f.Add([]byte(seed))
	}
	ownAddr, _, _ := serveBoth(f, http.HandlerFunc(echoRequest), takesOwn, nil)
	goAddr, _, _ := serveBoth(f, http.HandlerFunc(echoRequest), nil, nil)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if own, goServer := exchangeAll(t, ownAddr, raw), exchangeAll(t, goAddr, raw); own != goServer {
			t.Errorf("%q:\nthe loop:\n%s\nGo's server:\n%s", raw, own, goServer)
		}
	})
}

// A first head that trickles in is cut off by the header timeout from the
// connection's start, as by Go's server, not from its first byte.
func TestOwnLoopFirstHeadTimeout(t *testing.T) {
	// The first byte comes 900 ms in: cut off from it, the head would
	// last until 1.9 s; 600 ms of slack is left for a loaded machine.
	const timeout = time.Second
	for _, own := range []Own{takesOwn, nil} {
		addr, _, _ := serveBoth(t, http.HandlerFunc(servedBy), own, func(srv *http.Server) { srv.ReadHeaderTimeout = timeout })
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		closed := make(chan time.Duration, 1)
		go func() {
			_, _ = io.Copy(io.Discard, c)
			closed <- time.Since(start)
		}()
		time.Sleep(timeout - 100*time.Millisecond)
		head := "POST /own/a HTTP/1.1\r\nHost: x\r\n"
		var took time.Duration
	trickle:
		for i := 0; ; i++ {
			select {
			case took = <-closed:
				break trickle
			case <-time.After(50 * time.Millisecond):
				_, _ = c.Write([]byte{head[i%len(head)]})
			}
		}
		c.Close()
		// Go's server closes at the timeout; measured from the first byte
		// it would be 900 ms later.
		if took > timeout+600*time.Millisecond {
			t.Errorf("own=%v: a trickling first head was cut off after %v, want about %v", own != nil, took, timeout)
		}
	}
}

// ownConns is how many connections the loop holds, its own and lent.
func ownConns(ln ServingListener) int {
	o := ln.(*listener).own
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.conns)
}

// A client that goes quiet and then goes away while Go's server has its
// connection (after a request lent to it, or in the middle of a head the
// loop was still reading) leaves nothing behind: the loop lets the
// connection go once Go's server closes it.
func TestOwnLoopLetsGoOfAClientGoneWhileLent(t *testing.T) {
	for _, tc := range []struct{ name, raw string }{
		{"idle after a lent request", "GET /ctl HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"in the middle of a head", "GET /ctl HTTP/1.1\r\nHost:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _, ln := serveBoth(t, http.HandlerFunc(servedBy), takesOwn, nil)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, tc.raw); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(tc.raw, "\r\n\r\n") {
				if got := readAnswers(t, bufio.NewReader(c), 1); !strings.HasPrefix(got[0], "200 go GET /ctl") {
					t.Fatalf("answer %q", got[0])
				}
			}
			time.Sleep(100 * time.Millisecond) // quiet
			if n := ownConns(ln); n != 1 {
				t.Fatalf("the loop holds %d connections before the client goes, want 1", n)
			}
			_ = c.Close()
			deadline := time.Now().Add(10 * time.Second)
			for ownConns(ln) != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the loop still holds a connection its client closed 10 s ago")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// Shutdown racing requests that begin: clients keep sending on keep-alive
// connections while the listener shuts down. Every request the loop began
// is answered whole before Shutdown returns, and none begins after it:
// a request read as the listener closed is either served (and waited for)
// or its connection closed without a byte of answer (begin, under the
// lock close takes). Run under -race, many times over.
func TestOwnLoopShutdownRacesBeginningRequests(t *testing.T) {
	for round := range 30 {
		var inflight, late atomic.Int64
		var returned atomic.Bool
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			Check(r)
			inflight.Add(1)
			defer inflight.Add(-1)
			if returned.Load() {
				late.Add(1)
			}
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, "ok")
		})
		addr, srv, ln := serveBoth(t, handler, takesOwn, nil)
		var clients sync.WaitGroup
		var answered atomic.Int64
		partial := make(chan string, 16)
		for range 6 {
			clients.Go(func() {
				for !returned.Load() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						return // the listener is closed
					}
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					br := bufio.NewReader(c)
					for {
						if _, err := io.WriteString(c, "POST /own/w HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"); err != nil {
							break
						}
						if _, err := br.Peek(1); err != nil {
							break // closed without a byte of answer
						}
						resp, err := http.ReadResponse(br, nil)
						if err != nil {
							select {
							case partial <- fmt.Sprintf("an answer cut short: %v", err):
							default:
							}
							break
						}
						b, err := io.ReadAll(resp.Body)
						resp.Body.Close()
						if err != nil || string(b) != "ok" {
							select {
							case partial <- fmt.Sprintf("a body cut short: %q, %v", b, err):
							default:
							}
							break
						}
						answered.Add(1)
						if resp.Close {
							break
						}
					}
					c.Close()
				}
			})
		}
		for answered.Load() < 50 {
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ln.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if n := inflight.Load(); n != 0 {
			t.Fatalf("round %d: Shutdown returned with %d requests still in their handler", round, n)
		}
		returned.Store(true)
		cancel()
		clients.Wait()
		if n := late.Load(); n != 0 {
			t.Fatalf("round %d: %d requests began after Shutdown returned", round, n)
		}
		close(partial)
		for p := range partial {
			t.Errorf("round %d: %s", round, p)
		}
	}
}

// TestHTTPDate: the Date value, formatted once a second, is the second's
// as net/http formats it, and changes with the second.
func TestHTTPDate(t *testing.T) {
	paris := time.FixedZone("CET", 3600)
	at := time.Date(2026, 12, 6, 12, 0, 0, 999_000_000, paris)
	for _, now := range []time.Time{at, at.Add(time.Millisecond), at.Add(2 * time.Millisecond), at.Add(time.Hour)} {
		if got, want := string(httpDate(now)), now.UTC().Format(http.TimeFormat); got != want {
			t.Errorf("httpDate(%v) = %q; want %q", now, got, want)
		}
	}
}

// TestWriteStatusLine: every status line is net/http's (its
// writeStatusLine), the common ones written whole included.
func TestWriteStatusLine(t *testing.T) {
	var b bytes.Buffer
	bw := bufio.NewWriter(&b)
	for code := 100; code <= 999; code++ {
		b.Reset()
		writeStatusLine(bw, code)
		_ = bw.Flush()
		want := fmt.Sprintf("HTTP/1.1 %03d %s\r\n", code, http.StatusText(code))
		if http.StatusText(code) == "" {
			want = fmt.Sprintf("HTTP/1.1 %03d status code %d\r\n", code, code)
		}
		if b.String() != want {
			t.Fatalf("status %d: %q, want %q", code, b.String(), want)
		}
	}
}
