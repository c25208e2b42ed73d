//go:build unix

package framing

// What waits unread on a connection's socket (a non-blocking peek, Unix):
// bytes, for the lingering close; the end of the stream, for a client gone.

import (
	"net"
	"syscall"
)

// unreadBytes reports whether bytes the peer sent wait unread in nc's
// socket (a close now would be a reset: conn.linger). False if nc cannot
// be peeked at.
func unreadBytes(nc net.Conn) bool {
	n, ok, err := peekSocket(nc)
	return ok && err == nil && n > 0
}

// peerGone reports whether the peer of nc has closed (or half-closed) or
// reset its connection, with no bytes of it left unread in the socket: the
// peek reads the end of the stream, or an error other than "nothing yet".
// False if nc cannot be peeked at.
func peerGone(nc net.Conn) bool {
	n, ok, err := peekSocket(nc)
	switch {
	case !ok:
		return false
	case err == nil:
		return n == 0 // the end of the stream
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		return false
	}
	return true // reset, or worse
}

// peekSocket peeks, without waiting, at one byte of nc's socket: what
// recvfrom returned, with ok false if nc cannot be peeked at. Through
// Control, not Read: Read would wait for the read lock that a goroutine
// blocked in Read holds (Go's server's on a keep-alive connection that
// Server.Close closes, the client watch's).
func peekSocket(nc net.Conn) (n int, ok bool, err error) {
	sc, isSys := nc.(syscall.Conn)
	if !isSys {
		return 0, false, nil
	}
	rc, cerr := sc.SyscallConn()
	if cerr != nil {
		return 0, false, nil
	}
	cerr = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n, cerr == nil, err
}
