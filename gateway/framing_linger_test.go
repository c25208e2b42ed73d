//go:build unix

package gateway

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// unreadBytes sees bytes nobody read, and answers at once while another
// goroutine is blocked reading the connection (as Go's server is on a
// keep-alive connection when Server.Close closes it): a peek that waited
// for the read lock held Server.Close until the client went away.
func TestUnreadBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	read := make(chan struct{})
	go func() {
		var b [1]byte
		_, _ = server.Read(b[:])
		close(read)
	}()
	time.Sleep(10 * time.Millisecond) // let the reader block (not needed for the test to be right)
	peeked := make(chan bool)
	go func() { peeked <- unreadBytes(server) }()
	select {
	case got := <-peeked:
		if got {
			t.Fatal("unreadBytes: true with nothing sent")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unreadBytes waited for the goroutine blocked in Read")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	<-read // the reader took it

	if _, err := client.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	for !unreadBytes(server) {
		// The bytes are on the loopback; wait for them to land.
		time.Sleep(time.Millisecond)
	}
}

// Server.Close closes the active connections one after another; a
// lingering close must not make it wait lingerTime for each of them (it
// lingers in a goroutine of its own).
func TestServerCloseDoesNotWaitForEachLinger(t *testing.T) {
	var active atomic.Int32
	// The handler reads a body that never comes to its end.
	srv := &http.Server{Handler: http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }),
		ReadHeaderTimeout: time.Minute,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateActive {
				active.Add(1)
			}
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = Listener(srv, ln, nil)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	const conns = 6
	for range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Half a body: the server is in the middle of a request, and the
		// client neither sends the rest nor leaves.
		if _, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\nhalf"); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the server has read from every connection (each one is
	// then active, mid-request).
	for deadline := time.Now().Add(10 * time.Second); active.Load() < conns; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections active", active.Load(), conns)
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	_ = srv.Close()
	// A bound of five lingers for six connections: closing them in turn
	// would take at least six.
	if took := time.Since(start); took >= (conns-1)*lingerTime {
		t.Errorf("Server.Close took %v for %d lingering connections: it waited for each", took, conns)
	}
	<-served
}
