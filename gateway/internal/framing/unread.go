//go:build unix

package framing

// Whether bytes wait unread on a connection (a non-blocking peek, Unix),
// for the lingering close.

import (
	"net"
	"syscall"
)

// unreadBytes reports whether bytes the peer sent wait unread in nc's
// socket (a close now would be a reset: conn.linger). One non-blocking
// peek, through Control, not Read: Read would wait for the read lock that
// a goroutine blocked in Read holds (Go's server, on a keep-alive
// connection that Server.Close closes). False if nc cannot be peeked at.
func unreadBytes(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return err == nil && n > 0
}

// peerGone reports whether the peer of nc has closed (or half-closed) or
// reset its connection, with no bytes of it left unread in the socket: a
// non-blocking peek that reads the end of the stream or an error other
// than "nothing yet". Through Control, as unreadBytes, so that a goroutine
// blocked in Read (the client watch's) does not hold it up. False if nc
// cannot be peeked at.
func peerGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	err = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == nil:
			gone = n == 0 // the end of the stream
		case rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK || rerr == syscall.EINTR:
		default:
			gone = true // reset, or worse
		}
	})
	return err == nil && gone
}
