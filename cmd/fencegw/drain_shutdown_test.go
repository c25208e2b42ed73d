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
