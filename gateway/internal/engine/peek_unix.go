//go:build unix && !linux

package engine

import "syscall"

// peekIdle peeks one byte of fd without blocking (MSG_DONTWAIT), and
// reports whether there was nothing to read (EAGAIN): an open connection
// with nothing unsolicited on it.
func peekIdle(fd uintptr, buf *[1]byte) bool {
	_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
}
