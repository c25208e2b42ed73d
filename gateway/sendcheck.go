package gateway

// The proof before every byte, the gateway's side: a forward is the
// engine's Write (package engine, whose sendcheck.go tells where the proof
// is taken: in the Write of every upstream connection, before each write
// system call). The proof is the lease's tokens.Permit.Check; what it
// found is kept on the forward, so that the failure is answered as
// fence_lost, saying whether anything was sent (forwardFailed,
// refuseLostFence).

import "github.com/fencegw/fencegw/gateway/internal/engine"

var _ engine.Write = (*forward)(nil)

// Body is the whole body of a small write, read before the forward
// (smallbody.go), or of a keyed one (idempotency.go); nil if the body
// streams.
func (f *forward) Body() []byte { return f.buffered }

// CheckSend is taken before each write system call that carries bytes of
// f's request: nil if the fence is still provably held. The proof may wait
// for a slow session check, up to the forward's deadline and no longer
// (tokens.Held.Check). On a lost fence it marks f.
func (f *forward) CheckSend() error {
	if err := f.permit.Check(f.deadline); err != nil {
		f.fenceLost.Store(true)
		return err
	}
	return nil
}

// Lost is closed once f's fence is definitely lost (tokens.Permit.Lost;
// nil if it cannot be): the engine watches it while a streamed body is
// half-sent, and resets the exchange on it even when the client sends
// nothing (its next CheckSend then marks f).
func (f *forward) Lost() <-chan struct{} { return f.permit.Lost() }

// Halt fails a read of the client's body that waits, now and from then on:
// the engine reset f's half-sent exchange on its lost fence, and the client
// is to hear 503 fence_lost at once, not when it next sends (a client that
// paces its body, or went quiet). Without a body timeout (no guard) the
// read waits for the client as before.
func (f *forward) Halt() { f.body.halt() }

// Sent records that n bytes of f's request went to the kernel.
func (f *forward) Sent(n int) {
	if n > 0 && !f.sent.Load() {
		f.sent.Store(true)
	}
}
