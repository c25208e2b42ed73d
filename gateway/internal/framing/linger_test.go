//go:build unix

package framing

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
// lingers in a goroutine of its own). Checked by order, not by time: one
// sequence numbers Server.Close's return and each connection's final close
// underneath the gateway's listener, and Close must come first.
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
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var seq atomic.Int64
	var firstClosed atomic.Int64 // seq of the first connection closed underneath; 0: none yet
	ln := Listener(srv, closeSignalListener{inner.(*net.TCPListener), func() { firstClosed.CompareAndSwap(0, seq.Add(1)) }}, nil, nil, nil)
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
	_ = srv.Close()
	closedAt := seq.Add(1)
	if first := firstClosed.Load(); first != 0 && first < closedAt {
		t.Errorf("a lingering connection was closed (step %d) before Server.Close returned (step %d): Close waited for its linger", first, closedAt)
	}
	<-served
}

// closeSignalListener tells closed when an accepted connection is closed.
type closeSignalListener struct {
	*net.TCPListener
	closed func()
}

func (l closeSignalListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	return closeSignalConn{c, l.closed}, nil
}

// closeSignalConn is a TCP connection (CloseWrite, SyscallConn and all)
// that tells closed when it is closed.
type closeSignalConn struct {
	*net.TCPConn
	closed func()
}

func (c closeSignalConn) Close() error {
	c.closed()
	return c.TCPConn.Close()
}
