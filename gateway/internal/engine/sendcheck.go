package engine

// The proof before every byte: an admitted write sends nothing to the
// upstream unless its fence can be proven held at that moment
// (Write.CheckSend, which the gateway answers with tokens.Permit.Check),
// and the proof is taken where the bytes leave, in the Write of the
// upstream connection (engineConn.Write), before each write to the
// connection: the head and a body in memory (one flush), each flush of a
// streamed body, its chunked framing, its trailer and the final empty
// chunk. Checking the body as it is read from the client would not be
// enough: the head and the chunked framing are bytes of the write too.
// On an https upstream the check is taken above TLS, before each write of
// the request's bytes to the TLS connection (one record, one write system
// call, for the engine's 4 KiB flushes); the handshake carries none of
// them.
//
// A failed proof aborts the exchange: the connection is reset at once
// (SO_LINGER 0, which also throws away what the kernel had not yet
// transmitted: resetNow) and
// never completes the body, so the upstream sees a request cut short, not
// a shorter one. The gateway then answers 503 fence_lost saying whether
// anything had been sent (Write.Sent); if it had, the outcome is unknown
// and the resource drains.

import "net"

// resetNow resets nc (RST), which discards what the kernel still holds
// unsent. At once, on the write that failed its proof, not when the
// exchange fails: before Request.Write returns that failure it closes the
// request's body, and the Close of a body from net/http's server reads the
// rest of the client's body (up to 256 KiB) first, for as long as the
// client takes (up to the body timeout). A reset on the exchange's failure
// came that much later: the upstream held a cut request open, which it
// might still act on, past the next holder's grant and write.
func resetNow(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}
