package engine

import (
	"syscall"
	"unsafe"
)

// peekIdle peeks one byte of fd without blocking (MSG_DONTWAIT), and
// reports whether there was nothing to read (EAGAIN): an open connection
// with nothing unsolicited on it. The peek cannot block, so it is a raw
// system call: the scheduler's entry and exit around a system call that
// may block (syscall.Recvfrom's) were half of the check's cost, paid on
// every reuse of an upstream connection.
func peekIdle(fd uintptr, buf *[1]byte) bool {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK
}
