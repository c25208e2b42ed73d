//go:build unix

package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// awaitPair is an engine connection over a real socket to a peer the test
// plays (the upstream), whose request is fenced by w.
func awaitPair(t *testing.T) (*engineConn, net.Conn, *testWrite) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tcp.Close(); _ = peer.Close() })
	c := &engineConn{nc: tcp, tcp: tcp, key: upstreamKey{host: ln.Addr().String()}, limit: -1}
	c.br = bufio.NewReaderSize(c, 4<<10)
	c.bw = bufio.NewWriterSize(c, 4<<10)
	w := &testWrite{}
	c.fw = w
	return c, peer, w
}

// The request leaves whole, and the flush returns only once the answer can
// be read, which the read that follows then finds.
func TestFlushAwaitsTheAnswer(t *testing.T) {
	c, peer, w := awaitPair(t)
	req := "POST /x HTTP/1.1\r\nHost: up\r\nContent-Length: 2\r\n\r\nhi"
	_, _ = c.bw.WriteString(req)
	flushed := make(chan error, 1)
	go func() { flushed <- c.flushAwaitingAnswer() }()

	got := make([]byte, len(req))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != req {
		t.Fatalf("the upstream read %q (%v), want %q", got, err, req)
	}
	select {
	case err := <-flushed:
		t.Fatalf("the flush returned (%v) before the upstream answered", err)
	case <-time.After(50 * time.Millisecond):
	}
	answer := "HTTP/1.1 204 No Content\r\n\r\n"
	if _, err := peer.Write([]byte(answer)); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	if n := w.sent.Load(); n != int64(len(req)) {
		t.Errorf("Sent heard %d bytes, want %d", n, len(req))
	}
	if c.await {
		t.Error("the await outlived its flush")
	}
	line, err := c.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 204 No Content\r\n" {
		t.Fatalf("read %q, %v", line, err)
	}
}

// The upstream's close ends the wait too (the read then meets the end).
func TestFlushAwaitEndsOnTheUpstreamsClose(t *testing.T) {
	c, peer, _ := awaitPair(t)
	_, _ = c.bw.WriteString("GET / HTTP/1.1\r\nHost: up\r\n\r\n")
	flushed := make(chan error, 1)
	go func() { flushed <- c.flushAwaitingAnswer() }()
	_ = peer.Close()
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatalf("flush: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flush still waits after the upstream closed")
	}
	if _, err := c.br.ReadByte(); err == nil {
		t.Fatal("read a byte from a closed upstream")
	}
}

// A request larger than the socket takes at once leaves in part from the
// wait's send, the rest through the connection's Write, in order.
func TestFlushAwaitSendsWhatTheSocketDidNotTake(t *testing.T) {
	c, peer, w := awaitPair(t)
	c.bw = bufio.NewWriterSize(c, 16<<20)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB: more than a socket's buffers
	_, _ = c.bw.Write(big)
	flushed := make(chan error, 1)
	go func() { flushed <- c.flushAwaitingAnswer() }()
	_ = peer.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(io.LimitReader(peer, int64(len(big))))
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the upstream read %d bytes (%v), want the %d sent, in order", len(got), err, len(big))
	}
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	if n := w.sent.Load(); n != int64(len(big)) {
		t.Errorf("Sent heard %d bytes, want %d", n, len(big))
	}
}

// A deadline already past fails the send as the connection's Write fails
// it: nothing leaves.
func TestFlushAwaitMeetsAPastDeadline(t *testing.T) {
	c, peer, w := awaitPair(t)
	_ = c.nc.SetDeadline(aLongTimeAgo)
	_, _ = c.bw.WriteString("GET / HTTP/1.1\r\nHost: up\r\n\r\n")
	err := c.flushAwaitingAnswer()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("flush: %v, want the deadline's error", err)
	}
	if w.sent.Load() != 0 {
		t.Error("bytes were sent past the deadline")
	}
	_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := peer.Read(make([]byte, 1)); n != 0 {
		t.Error("the upstream read bytes sent past the deadline")
	}
}

// A send the upstream refuses (reset) fails as the connection's Write
// fails, and marks the write failed.
func TestFlushAwaitReportsAFailedSend(t *testing.T) {
	c, peer, _ := awaitPair(t)
	_ = peer.(*net.TCPConn).SetLinger(0)
	_ = peer.Close() // a reset
	time.Sleep(20 * time.Millisecond)
	var err error
	for range 10 { // the first send may be taken before the reset is heard
		_, _ = c.bw.WriteString("GET / HTTP/1.1\r\nHost: up\r\n\r\n")
		if err = c.flushAwaitingAnswer(); err != nil {
			break
		}
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "write" || !(errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("flush: %v, want the write's OpError (EPIPE or ECONNRESET)", err)
	}
	if !c.writeFailed {
		t.Error("the failed send did not mark the write failed")
	}
}

// The fence is proven before the send, as before any write: a lost one
// sends nothing.
func TestFlushAwaitChecksTheFenceFirst(t *testing.T) {
	c, peer, w := awaitPair(t)
	w.lost.Store(true)
	_, _ = c.bw.WriteString("GET / HTTP/1.1\r\nHost: up\r\n\r\n")
	if err := c.flushAwaitingAnswer(); err == nil {
		t.Fatal("a write whose fence is lost was flushed")
	}
	_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := peer.Read(make([]byte, 1)); n != 0 {
		t.Error("the upstream read bytes of a write whose fence was lost")
	}
}

// A connection taken unchecked (get, for a request held whole) is checked
// inside the wait, before the send: one the upstream half-closed sends
// nothing (errUnsent), whether the request goes in the wait's send or in
// a write of its own.
func TestUncheckedConnectionIsCheckedBeforeTheSend(t *testing.T) {
	for _, via := range []string{"the awaited flush", "a write"} {
		t.Run(via, func(t *testing.T) {
			c, peer, w := awaitPair(t)
			c.unchecked = true
			_ = peer.(*net.TCPConn).CloseWrite() // its FIN: the upstream is done with it
			for deadline := time.Now().Add(5 * time.Second); c.alive(); {
				if time.Now().After(deadline) {
					t.Fatal("the half-closed connection still looks alive after 5 s")
				}
				time.Sleep(time.Millisecond)
			}
			var err error
			if via == "a write" {
				_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: up\r\n\r\n"))
			} else {
				_, _ = c.bw.WriteString("GET / HTTP/1.1\r\nHost: up\r\n\r\n")
				err = c.flushAwaitingAnswer()
			}
			if !errors.Is(err, errUnsent) {
				t.Fatalf("send on a half-closed connection: %v, want errUnsent", err)
			}
			if w.sent.Load() != 0 {
				t.Errorf("Sent heard %d bytes", w.sent.Load())
			}
			_ = c.nc.Close()
			if got, _ := io.ReadAll(peer); len(got) > 0 {
				t.Errorf("the upstream read %q from a connection it had ended", got)
			}
		})
	}
}

// rawUpstream accepts connections and hands each to serve, with its
// number (from 1); it returns its URL.
func rawUpstream(t *testing.T, serve func(n int, c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for n := 1; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			go serve(n, c)
		}
	}()
	return "http://" + ln.Addr().String()
}

// answerOne reads one request with a Content-Length body from br and
// answers it with 200 and body.
func answerOne(c net.Conn, br *bufio.Reader, body string) error {
	req, err := http.ReadRequest(br)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return err
	}
	_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	return err
}

// An idle connection the upstream half-closed (its FIN, its socket still
// reading) is found so as the next request is about to be sent on it: the
// request goes out on a new connection instead, and the ended one gets
// none of it.
func TestExchangeLeavesAHalfClosedIdleConnection(t *testing.T) {
	after := make(chan []byte, 1) // what the first connection read after its FIN
	url := rawUpstream(t, func(n int, c net.Conn) {
		br := bufio.NewReader(c)
		if n == 1 {
			if err := answerOne(c, br, "first"); err != nil {
				return
			}
			_ = c.(*net.TCPConn).CloseWrite()
			got, _ := io.ReadAll(br)
			after <- got
			return
		}
		for answerOne(c, br, "later") == nil {
		}
	})
	e, dials := newTestTransport(t)
	hooks := &hooksSeen{}
	postWhole := func(path string) string {
		t.Helper()
		w := &testWrite{body: []byte("x")}
		req, _ := http.NewRequest("POST", url+path, bytes.NewReader(w.body))
		req.Host = "" // as the gateway's: a request held whole (writeHead)
		return readAll(t)(e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Now().Add(10*time.Second), hooks))
	}
	if got := postWhole("/a"); got != "first" {
		t.Fatalf("first answer %q", got)
	}
	// Let the FIN arrive (a get that checked would see it as well).
	time.Sleep(50 * time.Millisecond)
	if got := postWhole("/b"); got != "later" {
		t.Fatalf("second answer %q", got)
	}
	if !hooks.wrote {
		t.Error("the head was never heard leaving")
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2", n)
	}
	select {
	case got := <-after:
		if len(got) > 0 {
			t.Errorf("the half-closed connection read %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the half-closed connection was never closed")
	}
}

// A new connection the upstream ends at once fails the exchange with
// nothing sent: no head heard leaving (the outcome is known), no byte
// read by the upstream.
func TestExchangeOnANewConnectionEndedAtOnceSendsNothing(t *testing.T) {
	read := make(chan []byte, 1)
	url := rawUpstream(t, func(_ int, c net.Conn) {
		_ = c.(*net.TCPConn).CloseWrite()
		got, _ := io.ReadAll(c)
		read <- got
	})
	e, _ := newTestTransport(t)
	// Let the FIN arrive before the send (the dial returns first).
	e.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err == nil {
			time.Sleep(50 * time.Millisecond)
		}
		return c, err
	}
	w := &testWrite{body: []byte("x")}
	req, _ := http.NewRequest("POST", url+"/a", bytes.NewReader(w.body))
	req.Host = "" // as the gateway's: the URL's host, written by writeHead
	hooks := &hooksSeen{}
	_, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, time.Now().Add(10*time.Second), hooks)
	if !errors.Is(err, errUnsent) {
		t.Fatalf("exchange: %v, want errUnsent", err)
	}
	if hooks.wrote || w.sent.Load() != 0 {
		t.Errorf("head heard leaving %v, %d bytes sent: want neither", hooks.wrote, w.sent.Load())
	}
	select {
	case got := <-read:
		if len(got) > 0 {
			t.Errorf("the upstream read %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ended connection was never closed")
	}
}

// An exchange whose deadline has already passed fails on the connection
// it takes, and on no other: a check that cannot be made is no sign that
// a connection ended, so the idle ones stay in the pool.
func TestPastDeadlineGivesUpOnlyItsConnection(t *testing.T) {
	url := rawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		for {
			if _, err := br.Peek(1); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond) // so that three at once take three connections
			if answerOne(c, br, "ok") != nil {
				return
			}
		}
	})
	e, dials := newTestTransport(t)
	exchange := func(deadline time.Time) (string, error) {
		w := &testWrite{body: []byte("x")}
		req, _ := http.NewRequest("POST", url+"/a", bytes.NewReader(w.body))
		req.Host = "" // a request held whole (writeHead)
		resp, err := e.Exchange(context.Background(), req, wire.FieldsOf(req.Header), w, deadline, &hooksSeen{})
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			got, err := exchange(time.Now().Add(10 * time.Second))
			if err == nil && got != "ok" {
				err = errors.New("answer " + got)
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	idle := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		n := 0
		for _, list := range e.idle {
			n += len(list.conns)
		}
		return n
	}
	if n := idle(); n != 3 || dials.Load() != 3 {
		t.Fatalf("after three exchanges at once: %d idle, %d dials; want 3 and 3", n, dials.Load())
	}
	if _, err := exchange(time.Now().Add(-time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("exchange past its deadline: %v", err)
	}
	if n := idle(); n != 2 || dials.Load() != 3 {
		t.Errorf("after an exchange past its deadline: %d idle, %d dials; want 2 and 3", n, dials.Load())
	}
}

// An exchange held whole on a reused connection allocates only its
// answer's head (one string, one Response with its values): the send in
// the wait, the check and the callback are the connection's, made once.
func TestAwaitedExchangeAllocatesOnlyTheAnswer(t *testing.T) {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	url := rawUpstream(t, func(_ int, c net.Conn) {
		// Allocates nothing per request (AllocsPerRun counts every
		// goroutine's): the head's lines, then the 1-byte body.
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) > 2 {
				continue
			}
			if _, err := br.Discard(1); err != nil {
				return
			}
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	})
	e, dials := newTestTransport(t)
	w := &testWrite{body: []byte("x")}
	body := bytes.NewReader(w.body)
	req, _ := http.NewRequest("POST", url+"/a", body)
	req.Host = "" // a request held whole (writeHead)
	fields := wire.FieldsOf(req.Header)
	hooks := &hooksSeen{}
	var buf [16]byte
	exchange := func() {
		body.Reset(w.body)
		resp, err := e.Exchange(context.Background(), req, fields, w, time.Time{}, hooks)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := io.ReadFull(resp.Body, buf[:2]); string(buf[:n]) != "ok" {
			t.Fatalf("answer %q", buf[:n])
		}
		_ = resp.Body.Close()
	}
	exchange() // the connection, dialled once
	if n := testing.AllocsPerRun(100, exchange); n > 2 {
		t.Errorf("%v allocations per exchange, want at most 2 (the answer's head)", n)
	}
	if dials.Load() != 1 {
		t.Errorf("%d dials, want 1", dials.Load())
	}
}
