package main

// The fence holds until the bytes leave (guarantee 1) for a body that
// streams: part of it has already reached the upstream when the replica
// forwarding it loses its PostgreSQL sessions. faults_send_test.go holds
// the same fault for a small body, which is read whole before the forward,
// so nothing of it had left when the fence was lost.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A write on replica 1 streams a long chunked body to the upstream, slowly;
// after its first chunk reached the upstream, replica 1's fence sessions
// are terminated in PostgreSQL (with replica 1 running, or frozen by
// SIGSTOP across the fault and B's grant), and the client keeps sending
// chunks, then ends the body. Replica 1 must stop sending at its next
// proof of the fence: the upstream never gets the body's end (the exchange
// is reset, its handler reads an error), A hears 503 fence_lost with
// "sent": true (part of it left: the outcome is unknown), and no byte of A's
// body reaches the upstream after B's grant of the resource on replica 2
// returned, which comes no earlier than the orphan drain (drain period +
// session check) after the sessions died. Afterwards replica 1 serves
// again. In both PostgreSQL modes.
func TestFaultStreamedBodyAfterSessionsKilled(t *testing.T) {
	eachFenceMode(t, func(t *testing.T, pg *pgCluster, frozen bool, args []string) {
		testStreamedBody(t, pg, frozen, false, args...)
	})
}

// The same, but A's client goes quiet once the sessions are killed: it
// sends nothing more until B has been granted R and has written, then
// tries to finish its body. No byte is pending at replica 1, so no proof
// fails there; replica 1 must reset the upstream's exchange of A's
// half-sent request anyway, as soon as it knows its fence is lost (its
// sessions' death drops the fence): before B's grant returned, not when
// A's client speaks again or its body times out; and answer A then, while
// its client is still quiet (503 fence_lost). An upstream that acts
// when a request's connection breaks would otherwise act on A's request
// after B's write. (Frozen, replica 1 can reset nothing until it runs
// again, after B's grant: that variant checks the rest.)
func TestFaultQuietStreamedBodyAfterSessionsKilled(t *testing.T) {
	eachFenceMode(t, func(t *testing.T, pg *pgCluster, frozen bool, args []string) {
		testStreamedBody(t, pg, frozen, true, args...)
	})
}

const (
	// The drain period is short to keep the test short; the forward
	// timeout is longer than the orphan drain on purpose, so that the only
	// thing that can stop A's body before B's grant is the proof of the
	// fence (a 504 would hide a missing proof). A drain period below the
	// forward timeout only shortens the margin of a forward that timed out
	// (docs/design.md), which this test does not have.
	streamDrain        = 2 * time.Second
	streamSessionCheck = time.Second
	streamForward      = 10 * time.Second
	// streamChunk is the size of each chunk A sends after the first; the
	// first is larger than the small-body limit (gateway/smallbody.go),
	// though a chunked body streams whatever its length.
	streamChunk      = 1 << 10
	streamFirstChunk = 6 << 10
	streamEvery      = 100 * time.Millisecond
)

// testStreamedBody is both tests; quiet: A's client sends nothing after the
// fault until it is told to finish.
func testStreamedBody(t *testing.T, pg *pgCluster, frozen, quiet bool, args ...string) {
	up := newStreamUpstream(t)
	ps := startReplicas(t, 2, append(args, "--upstream", "svc="+up.URL,
		"--forward-timeout", streamForward.String(), "--drain-period", streamDrain.String(),
		"--pg-session-check", streamSessionCheck.String(), "--grant-wait", "8s")...)
	bases := []string{ps[0].url(), ps[1].url()}

	// A holds R through replica 1 and starts a write whose body streams.
	a, ans := grant(bases[0], "R", "A", time.Second, 0)
	if ans.code != http.StatusCreated {
		t.Fatalf("A's grant on replica 1: %v", ans)
	}
	c, err := net.Dial("tcp", ps[0].addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	head := fmt.Sprintf("POST /v1/proxy/svc/stream/A HTTP/1.1\r\nHost: %s\r\nFencing-Lease: %s\r\n"+
		"Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n", ps[0].addr, a.LeaseID)
	if _, err := io.WriteString(c, head+chunk(0, streamFirstChunk)); err != nil {
		t.Fatal(err)
	}
	// A's answer, read as soon as it comes (while A is still sending).
	var aAns streamAnswer
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		aAns = readStreamAnswer(c)
		up.note(streamEvent{what: "A answered"})
	}()
	select {
	case <-up.firstA:
	case <-answered:
		t.Fatalf("A's write was answered before any of its body reached the upstream: %v", aAns)
	case <-time.After(15 * time.Second):
		t.Fatal("the first chunk of A's body never reached the upstream")
	}

	// The fault: replica 1's fence sessions are terminated (replica 1
	// frozen meanwhile, if asked).
	if frozen {
		if err := ps[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ps[0].cmd.Process.Signal(syscall.SIGCONT) })
	}
	killed := time.Now()
	t.Logf("terminated replica 1's %d fence sessions", killFenceSessions(t, pg, ps[0].cmd.Process.Pid))
	up.note(streamEvent{what: "sessions killed"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("what the upstream saw (and the test did), from the kill:\n%s", up.timeline(killed))
		}
	})

	// A keeps sending: a chunk every streamEvery until it is answered, or
	// until it is told to finish (after B's grant and write), and then
	// three more; then the body's end. A running replica answers A while
	// it still sends, or while it is quiet; a frozen one once it runs
	// again. Quiet, A sends nothing until it is answered or told to
	// finish.
	finish := make(chan struct{})
	written := make(chan streamWriter, 1)
	go func() {
		if quiet {
			select {
			case <-finish:
			case <-answered:
			}
		}
		written <- writeStream(c, answered, finish)
	}()

	// B asks for R on replica 2 once A's lease has expired: 503 fence_busy
	// with Retry-After while the orphan drain lasts (or a wait within its
	// wait_ms), then a larger token.
	waitExpired(t, bases[1], a.LeaseID)
	var b lease
	busy := 0
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, ans = grant(bases[1], "R", "B", time.Minute, time.Second)
		if ans.code == http.StatusCreated {
			break
		}
		want503(t, "B's grant of R while replica 1's orphaned fence drains", ans, "fence_busy")
		if t.Failed() || time.Now().After(deadline) {
			t.Fatalf("B's grant of R on replica 2: %v (%d refusals, %v after replica 1's sessions were killed)",
				ans, busy+1, time.Since(killed).Round(time.Millisecond))
		}
		busy++
		time.Sleep(100 * time.Millisecond)
	}
	grantedAfter := time.Since(killed)
	up.note(streamEvent{what: "B granted", token: b.Token})
	t.Logf("B granted token %d %v after the sessions were killed, after %d fence_busy answers", b.Token, grantedAfter.Round(time.Millisecond), busy)
	if orphanDrain := streamDrain + streamSessionCheck; grantedAfter < orphanDrain {
		t.Errorf("B was granted R %v after replica 1's fence sessions were killed, before the orphan drain (drain period %v + session check %v) could have run out",
			grantedAfter.Round(time.Millisecond), streamDrain, streamSessionCheck)
	}
	if b.Token <= a.Token {
		t.Errorf("B got token %d after A's %d", b.Token, a.Token)
	}
	if w := fencedWrite(bases[1], b.LeaseID, "/stream/B", "B"); w.code != http.StatusOK {
		t.Fatalf("B's write on replica 2: %v", w)
	}
	if frozen {
		if err := ps[0].cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}

	// The rest of A's body, then its end.
	up.note(streamEvent{what: "A told to finish"})
	close(finish)
	var wr streamWriter
	select {
	case wr = <-written:
	case <-time.After(30 * time.Second):
		t.Fatal("A's client never finished sending")
	}
	t.Logf("A's client: %s", wr)
	select {
	case <-answered:
	case <-time.After(30 * time.Second):
		t.Fatal("A's write was never answered")
	}
	t.Logf("A's answer: %v", aAns)
	var end streamEnd
	select {
	case end = <-up.endA:
	case <-time.After(15 * time.Second):
		t.Fatal("the upstream's exchange of A's write neither completed nor broke")
	}

	// What the upstream saw of A: never the body's end, and nothing after
	// B's grant returned.
	if end.complete {
		t.Errorf("the upstream received A's whole body (%d bytes, the final chunk included) although replica 1 lost its fence while it streamed", end.bytes)
	} else {
		t.Logf("the upstream got %d bytes of A's body, then: %v", end.bytes, end.err)
	}
	var late int
	grantSeen, cutSeen := false, false // cutSeen: before B's grant
	answeredEarly := false             // A answered while its client still sent
	for _, e := range up.log() {
		switch {
		case e.what == "A answered":
			answeredEarly = !grantSeen
		case e.what == "B granted":
			grantSeen = true
		case e.what == "A end":
			cutSeen = !grantSeen
		case grantSeen && e.what == "A bytes":
			late += e.n
		case e.what == "A bytes" && e.token != a.Token:
			t.Errorf("A's body reached the upstream with token %d, not A's %d", e.token, a.Token)
		}
	}
	if late > 0 {
		t.Errorf("%d bytes of A's body (token %d) reached the upstream after B's grant (token %d) returned", late, a.Token, b.Token)
	}
	// A running replica that failed the proof resets the upstream's
	// exchange then (docs/design.md: the fence holds until the bytes
	// leave), not when its client ends the body: its client sends a chunk
	// every streamEvery, so the proof fails within a session check of the
	// sessions' death, a drain period before B can be granted. A client
	// gone quiet sends nothing to prove: the replica resets the exchange
	// when its sessions' death drops the fence (its health check, every
	// session check / 10), as long before B's grant. (A frozen replica
	// can reset nothing until it runs again.)
	if !frozen && !cutSeen {
		how := "its client kept sending"
		if quiet {
			how = "its client had gone quiet, with nothing pending to prove"
		}
		t.Errorf("A's exchange with the upstream was still open when B's grant returned (%s): replica 1 lost its fence at the kill, but reset the exchange only %v after it",
			how, end.at.Sub(killed).Round(time.Millisecond))
	}
	// A running replica answers A once its proof failed, while A's
	// client still sends: the failed send does not wait for the rest of
	// the client's body (gateway/direct.go openBody). A quiet client is
	// answered as soon as the fence is dropped: the watch that resets the
	// upstream's exchange halts the forward's read of the client's body
	// (engine Write.Halt). A frozen replica answers when it runs again.
	if !frozen && !answeredEarly {
		how := "when replica 1's proof of the fence failed"
		if quiet {
			how = "when replica 1's fence was dropped"
		}
		t.Errorf("A's write was answered only after its client was told to finish its body (%v), not %s", aAns, how)
	}
	up.checkOrder(t)

	// What A heard: 503 fence_lost, sent: true (its head and first chunk
	// had reached the upstream, so its outcome is unknown).
	if aAns.err != nil || aAns.status != http.StatusServiceUnavailable || aAns.problem.Code != "fence_lost" ||
		aAns.problem.Sent == nil || !*aAns.problem.Sent {
		t.Errorf("A's streamed write: %v; want 503 fence_lost with \"sent\": true (part of its body had reached the upstream)", aAns)
	}

	// Liveness: replica 1 grants and writes again within seconds.
	deadline := time.Now().Add(15 * time.Second)
	var l lease
	for {
		if l, ans = grant(bases[0], "R2", "C", 10*time.Second, 0); ans.code == http.StatusCreated {
			break
		}
		if ans.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("replica 1 does not grant again after its sessions were killed: %v", ans)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A store call that times out on a loaded machine answers 503 (fail
	// closed), which a worker retries; liveness asks for a 200 in time.
	for {
		w := fencedWrite(bases[0], l.LeaseID, "/after", "C")
		if w.code == http.StatusOK {
			break
		}
		if w.code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("replica 1 does not write again after its sessions were killed: %v", w)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// chunk is chunk i of A's body in chunked framing, n bytes of data.
func chunk(i, n int) string {
	data := fmt.Sprintf("A%05d", i)
	data += strings.Repeat("a", n-len(data))
	return fmt.Sprintf("%x\r\n%s\r\n", len(data), data)
}

// streamWriter is what A's client sent after the fault.
type streamWriter struct {
	chunks   int
	stopped  string // why it stopped sending chunks
	finalErr error  // of the body's end
}

func (w streamWriter) String() string {
	return fmt.Sprintf("sent %d more chunks, stopped: %s; the body's end: %v", w.chunks, w.stopped, w.finalErr)
}

// writeStream sends a chunk every streamEvery until answered is closed, a
// write fails, or three chunks after finish is closed; then the body's end
// (which may fail: the gateway may have closed the connection).
func writeStream(c net.Conn, answered, finish <-chan struct{}) (w streamWriter) {
	tick := time.NewTicker(streamEvery)
	defer tick.Stop()
	left := -1 // chunks still to send once finish is closed
	for i := 1; w.stopped == ""; i++ {
		select {
		case <-answered:
			w.stopped = "the gateway answered"
			continue
		case <-tick.C:
		}
		select {
		case <-finish:
			if left < 0 {
				left = 3
			}
		default:
		}
		if left == 0 {
			w.stopped = "told to finish"
			continue
		}
		if i > 300 {
			w.stopped = "300 chunks sent (a bound)"
			continue
		}
		if _, err := io.WriteString(c, chunk(i, streamChunk)); err != nil {
			w.stopped = "write failed: " + err.Error()
			continue
		}
		w.chunks++
		if left > 0 {
			left--
		}
	}
	_, w.finalErr = io.WriteString(c, "0\r\n\r\n")
	return w
}

// streamAnswer is the gateway's answer to A's write.
type streamAnswer struct {
	status  int
	problem struct {
		Code string `json:"code"`
		Sent *bool  `json:"sent"`
	}
	body string
	err  error
}

func (a streamAnswer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(a.body))
}

func readStreamAnswer(c net.Conn) (a streamAnswer) {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a.status, a.body, a.err = resp.StatusCode, string(b), err
	_ = json.Unmarshal(b, &a.problem)
	return a
}

// --- an upstream that takes A's body as it streams in ---

// streamEvent is one thing the upstream saw, or the test noted, in the
// order it happened (one log, one lock).
type streamEvent struct {
	what  string // "A bytes", "A end", "write", or the test's notes
	path  string
	token int64
	n     int
	at    time.Time
}

// streamEnd is how A's body ended at the upstream.
type streamEnd struct {
	bytes    int
	complete bool  // its final chunk came (the handler read io.EOF)
	err      error // else what the handler's read returned
	at       time.Time
}

// streamUpstream reads the body of a write to /stream/A as it arrives,
// logging each read, and other writes whole.
type streamUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	events []streamEvent
	once   sync.Once
	firstA chan struct{}  // closed when the first bytes of A's body arrived
	endA   chan streamEnd // how A's body ended
}

func newStreamUpstream(t *testing.T) *streamUpstream {
	u := &streamUpstream{firstA: make(chan struct{}), endA: make(chan streamEnd, 1)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *streamUpstream) note(e streamEvent) {
	e.at = time.Now()
	u.mu.Lock()
	u.events = append(u.events, e)
	u.mu.Unlock()
}

func (u *streamUpstream) log() []streamEvent {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]streamEvent(nil), u.events...)
}

func (u *streamUpstream) serve(w http.ResponseWriter, r *http.Request) {
	tok, _ := strconv.ParseInt(r.Header.Get("Fencing-Token"), 10, 64)
	if r.URL.Path != "/stream/A" {
		b, err := io.ReadAll(r.Body)
		u.note(streamEvent{what: "write", path: r.URL.Path, token: tok, n: len(b)})
		if err == nil {
			_, _ = io.WriteString(w, "ok")
		}
		return
	}
	buf := make([]byte, 4<<10)
	total := 0
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			total += n
			u.note(streamEvent{what: "A bytes", path: r.URL.Path, token: tok, n: n})
			u.once.Do(func() { close(u.firstA) })
		}
		if err != nil {
			end := streamEnd{bytes: total, complete: err == io.EOF, err: err, at: time.Now()}
			u.note(streamEvent{what: "A end", path: r.URL.Path, token: tok, n: total})
			select {
			case u.endA <- end:
			default:
			}
			if end.complete {
				_, _ = io.WriteString(w, "ok")
			}
			return
		}
	}
}

// timeline is the log from since on, one event a line.
func (u *streamUpstream) timeline(since time.Time) string {
	var b strings.Builder
	for _, e := range u.log() {
		if !e.at.Before(since) {
			fmt.Fprintf(&b, "\t+%v %s %s token %d, %d bytes\n", e.at.Sub(since).Round(time.Millisecond), e.what, e.path, e.token, e.n)
		}
	}
	return b.String()
}

// checkOrder asserts guarantee 1 as the upstream sees it, for R (every
// write but /after, which is R2's): the tokens of what it received never
// go down.
func (u *streamUpstream) checkOrder(t *testing.T) {
	t.Helper()
	var last int64
	stale := map[string]int{} // bytes per path
	for _, e := range u.log() {
		if e.what != "A bytes" && e.what != "write" || e.path == "/after" {
			continue
		}
		if e.token < last {
			stale[fmt.Sprintf("%s (token %d after token %d)", e.path, e.token, last)] += e.n
		}
		last = max(last, e.token)
	}
	for what, n := range stale {
		t.Errorf("stale write reached the upstream: %d bytes of %s", n, what)
	}
}
