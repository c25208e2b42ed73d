//go:build unix

package gateway

import (
	"net"
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
