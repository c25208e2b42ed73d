package gateway

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSendWindow measures the window in which a stopped process sends
// bytes it proved it could send a moment before (storage/postgres fence.go,
// "The limit"): the Go code between the proof and the kernel's write(2).
// It times a write through the net.Conn the engine writes to and the same
// write made directly with syscall.Write on its file descriptor; the
// difference of their fastest runs (window-ns) is that code, to which the
// tail of the proof (a compare and a return after its clock read) adds a
// nanosecond or two. Run alone:
//
//	go test -run '^$' -bench SendWindow -benchtime 200000x ./gateway/
func BenchmarkSendWindow(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	p := make([]byte, 256)
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var werr error
	write := func(fd uintptr) bool {
		_, werr = syscall.Write(int(fd), p)
		return werr != syscall.EAGAIN
	}
	// Each op writes once each way; the fastest of each (the least
	// disturbed by the kernel and the machine's other load) are compared.
	minConn, minRaw := time.Hour, time.Hour
	for range b.N {
		t0 := time.Now()
		if _, err := nc.Write(p); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := raw.Write(write); err != nil || werr != nil {
			b.Fatal(err, werr)
		}
		t2 := time.Now()
		minConn, minRaw = min(minConn, t1.Sub(t0)), min(minRaw, t2.Sub(t1))
	}
	b.ReportMetric(float64(minConn.Nanoseconds()), "conn-min-ns")
	b.ReportMetric(float64(minRaw.Nanoseconds()), "syscall-min-ns")
	b.ReportMetric(float64((minConn - minRaw).Nanoseconds()), "window-ns")
}
