package framing

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/testcert"
)

// pipeConns returns a framing connection over a real TCP connection, and
// the client's end.
func pipeConns(t *testing.T) (*conn, net.Conn) {
	t.Helper()
	return pipeConnsTLS(t, nil)
}

// pipeConnsTLS is pipeConns with the listener terminating TLS by cfg (nil:
// plain); the client's end is then plain TCP, for the test to speak TLS
// over or not.
func pipeConnsTLS(t *testing.T, cfg *tls.Config) (*conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := &listener{Listener: ln, maxHead: 1 << 20, tls: cfg}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fc, err := l.acceptConn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = fc.Conn.Close() })
	return fc, client
}

// A deadline kept for the next read bounds it as one set at once would:
// the last one set before the read is the one that counts, one in the past
// fails the read at once, and one set while a read waits ends it.
func TestDeadlinesTakeEffectAtTheNextRead(t *testing.T) {
	fc, client := pipeConns(t)
	buf := make([]byte, 8)

	// Set, replaced, then read: the last one bounds the read.
	_ = fc.SetReadDeadline(time.Now().Add(time.Hour))
	_ = fc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := fc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read under a 50 ms deadline: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the read waited %v", d)
	}

	// Lifted: a read waits for the client's bytes.
	_ = fc.SetReadDeadline(time.Time{})
	go func() { time.Sleep(100 * time.Millisecond); _, _ = client.Write([]byte("x")) }()
	if n, err := fc.Read(buf); n != 1 || err != nil {
		t.Fatalf("read with no deadline: %d, %v", n, err)
	}

	// In the past: the next read fails at once, though bytes wait.
	_, _ = client.Write([]byte("y"))
	time.Sleep(20 * time.Millisecond)
	_ = fc.SetReadDeadline(time.Unix(1, 0))
	if _, err := fc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after a deadline in the past: %v", err)
	}

	// Set while a read waits: it ends that read.
	_ = fc.SetReadDeadline(time.Time{})
	if n, err := fc.Read(buf); n != 1 || err != nil { // the "y"
		t.Fatalf("read after lifting: %d, %v", n, err)
	}
	done := make(chan error, 1)
	go func() { _, err := fc.Read(buf); done <- err }()
	time.Sleep(50 * time.Millisecond)
	_ = fc.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a waiting read ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline set while a read waited did not end it")
	}
}

// The same for writes: a write deadline in the past, kept, fails the next
// write; lifted, the write goes out.
func TestWriteDeadlineTakesEffectAtTheNextWrite(t *testing.T) {
	fc, client := pipeConns(t)
	fc.serving.Store(true) // a handler's answer: written as it is
	_ = fc.SetWriteDeadline(time.Unix(1, 0))
	if _, err := fc.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write after a deadline in the past: %v", err)
	}
	_ = fc.SetWriteDeadline(time.Time{})
	if _, err := fc.Write([]byte("x")); err != nil {
		t.Fatalf("write with no deadline: %v", err)
	}
	buf := make([]byte, 1)
	if _, err := client.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("client read %q, %v", buf, err)
	}
}

// Under TLS the deadline kept for the next read bounds that read's
// handshake too: a client that connects and says nothing is cut at it.
func TestDeadlineBoundsTheTLSHandshake(t *testing.T) {
	cert := testcert.New(t)
	fc, _ := pipeConnsTLS(t, &tls.Config{Certificates: []tls.Certificate{cert.TLS}})
	_ = fc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	done := make(chan error, 1)
	go func() { _, err := fc.Read(make([]byte, 8)); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a silent TLS client's first read ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the deadline set before the first read did not bound its handshake")
	}
}

// countingConn counts the deadlines set on it.
type countingConn struct {
	net.Conn
	reads, writes int
}

func (c *countingConn) SetReadDeadline(t time.Time) error {
	c.reads++
	return c.Conn.SetReadDeadline(t)
}

func (c *countingConn) SetWriteDeadline(t time.Time) error {
	c.writes++
	return c.Conn.SetWriteDeadline(t)
}

// A deadline moved on by a few milliseconds per request, a minute ahead,
// mostly rounds to the one on the socket, which is then not set again; a
// deadline that changes the rounded one, one in the past and none are set.
func TestDeadlinesOnTheSocketOnlyWhenTheyChange(t *testing.T) {
	fc, client := pipeConns(t)
	cc := &countingConn{Conn: fc.Conn}
	fc.Conn = cc
	for i := range 100 {
		_ = fc.SetReadDeadline(time.Now().Add(time.Minute))
		_ = fc.SetWriteDeadline(time.Now().Add(time.Minute))
		fc.settle()
		if i%10 == 9 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if cc.reads > 20 || cc.writes > 20 {
		t.Fatalf("100 deadlines a minute ahead, close together, set %d read and %d write deadlines on the socket; want a few", cc.reads, cc.writes)
	}
	reads := cc.reads
	_ = fc.SetReadDeadline(time.Now().Add(2 * time.Minute))
	fc.settle()
	if cc.reads != reads+1 {
		t.Fatal("a deadline a minute later was not set on the socket")
	}
	_ = fc.SetReadDeadline(time.Unix(1, 0))
	fc.settle()
	if cc.reads != reads+2 {
		t.Fatal("a deadline in the past was not set on the socket")
	}
	if _, err := fc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after a deadline in the past: %v", err)
	}
	_ = fc.SetReadDeadline(time.Time{})
	fc.settle()
	if cc.reads != reads+3 {
		t.Fatal("lifting the deadline was not set on the socket")
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if n, err := fc.Read(make([]byte, 1)); n != 1 || err != nil {
		t.Fatalf("read with no deadline: %d, %v", n, err)
	}
}
