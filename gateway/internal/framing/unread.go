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
