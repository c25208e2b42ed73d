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

// A request that is half-sent (its head has left, its body streams or
// waits for the upstream's leave) may have nothing to send for a long
// time: a client that goes quiet mid-body, up to the body timeout. No
// proof is taken then, as no byte is pending, yet the upstream holds a
// request cut short under the write's token, which it may act on (an
// upstream that acts when a request's connection breaks) after a newer
// holder's grant and write. So while such a request is being written its
// fence is watched (watchFence): once the fence is definitely lost
// (Write.Lost: dropped, its session destroyed; not merely unconfirmed
// lately, which a load spike causes and the proof waits on) the connection
// is reset at once, as a failed proof would reset it, and the write is
// halted (Write.Halt), so that a read of the client's body that waits fails
// and the exchange ends now, its client answered. A body in memory is
// not watched: it leaves with the head in one write, never half-sent, and
// its exchange pays nothing for the watch.

import (
	"errors"
	"net"
)

// resetNow resets nc (RST), which discards what the kernel still holds
// unsent. At once, on the write that failed its proof, not when the
// exchange fails: before Request.Write returns that failure it closes the
// request's body, and the Close of a body from net/http's server reads the
// rest of the client's body (up to 256 KiB) first, for as long as the
// client takes (up to the body timeout). A reset on the exchange's failure
// came that much later: the upstream held a cut request open, which it
// might still act on, past the next holder's grant and write. (The
// gateway's forward now hands the engine a body whose Close does nothing,
// so that its client hears the answer at once too; the engine does not
// count on its callers doing so.)
func resetNow(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

// fenceWatch resets a connection whose request is half-sent once the
// write's fence is lost. One goroutine, from the start of the request's
// write to its end (end), which waits for it: the watch never outlives
// the write, and so never touches a connection back in the pool.
type fenceWatch struct {
	stop  chan struct{}
	done  chan struct{}
	fired bool // set before done is closed: it reset the connection
}

// watchFence watches w's fence (w.Lost; nil: it cannot be lost, and
// nothing is watched) and, when it is lost before end, resets tcp and
// halts w (Write.Halt: a read of the client's body that waits fails, so
// the exchange ends now).
func watchFence(w Write, tcp net.Conn) *fenceWatch {
	lost := w.Lost()
	if lost == nil {
		return nil
	}
	fw := &fenceWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(fw.done)
		select {
		case <-lost:
			fw.fired = true
			resetNow(tcp)
			w.Halt()
		case <-fw.stop:
		}
	}()
	return fw
}

// end stops the watch and waits until it has stopped; it reports whether
// the watch reset the connection (the fence was lost). A nil watch: false.
func (fw *fenceWatch) end() bool {
	if fw == nil {
		return false
	}
	close(fw.stop)
	<-fw.done
	return fw.fired
}

// errLostWhileHalfSent is the exchange's error when the watch reset it
// and the write's own proof, asked again, did not say why (its contract
// is that it fails once Lost is closed).
var errLostWhileHalfSent = errors.New("the write's fence was lost while its request was half-sent")

// lostFence is the error of an exchange the watch reset: the write's own
// proof, which fails at once on a lost fence (and so the write learns of
// it, as from a failed proof before a send).
func lostFence(w Write) error {
	if err := w.CheckSend(); err != nil {
		return err
	}
	return errLostWhileHalfSent
}
