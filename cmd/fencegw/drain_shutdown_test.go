package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencegw/fencegw/internal/refusingdisk"
)

// A clean shutdown never gives an unrecorded drain's fence up early. A
// write times out while the embedded store's disk refuses every write, so
// its drain cannot be recorded; SIGTERM comes right after the 504. The
// process exits only once the drain period has passed from the timeout (a
// restart could otherwise grant at once: the drain is nowhere on disk),
// and it does exit then, though the disk still refuses.
func TestShutdownWaitsForUnrecordedDrain(t *testing.T) {
	dir := refusingdisk.Mount(t)
	data := filepath.Join(dir, "data")
	up := newUpstream(t)
	const forward, drain = 300 * time.Millisecond, 3 * time.Second
	p := startProc(t, "--data", data, "--upstream", "svc="+up.URL, "--forward-timeout", forward.String(),
		"--drain-period", drain.String(), "--log-level", "warn")
	l, a := grant(p.url(), "r", "A", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatalf("grant: %v", a)
	}
	sent := time.Now()
	answered := make(chan answer, 1)
	go func() { answered <- fencedWrite(p.url(), l.LeaseID, "/hold/a", "A") }()
	<-up.entered // the write reached the upstream, which holds it past the timeout
	heal, err := refusingdisk.Refuse(t, filepath.Join(data, "fencegw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer heal()
	if a := <-answered; a.err != nil || a.code != http.StatusGatewayTimeout {
		t.Fatalf("the held write: %v, want 504", a)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	exited := time.Now()
	if end := sent.Add(forward + drain); exited.Before(end) {
		t.Errorf("the process exited %v before the drain period of its timed-out write had passed, the drain unrecorded\n%s",
			end.Sub(exited), p.output())
	}
	if !strings.Contains(p.output(), "waiting for drain periods the store has not recorded yet") {
		t.Errorf("the shutdown did not say it waited for the drain\n%s", p.output())
	}
}

// A clean shutdown does not lose a keyed write's answer the store has not
// taken yet. The upstream answers while the embedded store's disk refuses
// every write: the client gets the answer at once, and its record is
// retried in the background. SIGTERM comes right after; the disk takes
// writes again a second later. The process exits only once the record is
// in, so that after a restart a retry with the key is replayed (had the
// process exited at once, the record would have been left in progress,
// and a restart turns that into an unknown outcome: a 409 for a write
// whose answer the client saw).
func TestShutdownWaitsForUnrecordedAnswer(t *testing.T) {
	dir := refusingdisk.Mount(t)
	data := filepath.Join(dir, "data")
	up := newUpstream(t)
	args := []string{"--data", data, "--upstream", "svc=" + up.URL, "--forward-timeout", "2s", "--log-level", "warn"}
	p := startProc(t, args...)
	l, a := grant(p.url(), "r", "A", time.Minute, 0)
	if a.code != http.StatusCreated {
		t.Fatalf("grant: %v", a)
	}
	charge := func(base string) answer {
		return call("POST", base+"/v1/proxy/svc/hold/charge", []byte("A"), "Fencing-Lease", l.LeaseID, "Idempotency-Key", `"charge-1"`)
	}
	answered := make(chan answer, 1)
	go func() { answered <- charge(p.url()) }()
	<-up.entered // the write reached the upstream, which holds it until the disk refuses
	heal, err := refusingdisk.Refuse(t, filepath.Join(data, "fencegw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer heal()
	up.Release()
	if a := <-answered; a.err != nil || a.code != http.StatusOK {
		t.Fatalf("the keyed write: %v, want 200", a)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the fault's length, not a wait for an event
	heal()
	<-p.exited
	if !strings.Contains(p.output(), "waiting for records the store has not taken yet") {
		t.Errorf("the shutdown did not say it waited for the record\n%s", p.output())
	}
	q := startProc(t, args...)
	again := charge(q.url())
	if again.err != nil || again.code != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry after a restart: %v replayed=%q, want the answer replayed\n%s", again, again.header.Get("Idempotent-Replayed"), p.output())
	}
	if n := up.count(); n != 1 {
		t.Fatalf("the upstream got %d writes, want 1", n)
	}
}
