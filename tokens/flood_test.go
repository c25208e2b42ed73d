package tokens

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A flood of unauthenticated unknown leases is recorded
// at floodRate a second (after a burst of floodBurst), and what was not
// recorded is reported once per floodReport.
func TestFloodGate(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var g floodGate
	now := time.Unix(1000, 0)
	recorded := 0
	for range 1000 { // all at once
		if g.record(now, log) {
			recorded++
		}
	}
	if recorded != floodBurst {
		t.Fatalf("%d recorded at once, want %d", recorded, floodBurst)
	}
	recorded = 0
	for i := range 1000 { // 1000 more over the next 10 s
		if g.record(now.Add(time.Duration(i+1)*10*time.Millisecond), log) {
			recorded++
		}
	}
	if recorded < 10*floodRate-1 || recorded > 10*floodRate { // float refills may round one down
		t.Fatalf("%d recorded in 10 s, want %d", recorded, 10*floodRate)
	}
	if n := strings.Count(logs.String(), "not recorded"); n != 1 || !strings.Contains(logs.String(), "count=") {
		t.Fatalf("%d reports:\n%s", n, logs.String())
	}
}
