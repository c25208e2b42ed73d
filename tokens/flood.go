package tokens

// The flood gate for writes under lease ids that were never granted.

import (
	"log/slog"
	"sync"
	"time"
)

// Writes under lease ids that were never granted cost nothing to send:
// without authentication anyone who reaches the gateway can send thousands
// a second. Were each refusal a synchronous store write and an entry of
// the bounded rejection log, a flood would push real incidents out of it
// and load the store. Refusals of unauthenticated writes with
// unknown leases are therefore recorded at most floodRate a second (bursts
// of floodBurst); the rest are answered the same (403 unknown_lease) and
// counted by the gateway's metrics, and one warning a floodReport says how
// many were not recorded. Authenticated callers are metered by their key
// and their refusals name them: those are all recorded.
const (
	floodRate   = 10
	floodBurst  = 100
	floodReport = 10 * time.Second
)

// floodGate is a token bucket for those refusals. Its zero value is ready.
type floodGate struct {
	mu         sync.Mutex
	started    bool
	tokens     float64
	last       time.Time
	suppressed int64
	since      time.Time // first suppression not yet reported
}

// record reports whether a refusal at now may be recorded, and logs what
// was suppressed once per floodReport.
func (g *floodGate) record(now time.Time, log *slog.Logger) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		g.started, g.tokens, g.last = true, floodBurst, now
	}
	if d := now.Sub(g.last); d > 0 {
		g.tokens = min(floodBurst, g.tokens+d.Seconds()*floodRate)
		g.last = now
	}
	if g.suppressed > 0 && now.Sub(g.since) >= floodReport {
		log.Warn("writes with unknown leases not recorded in the rejection log (unauthenticated flood)",
			"count", g.suppressed, "since", g.since, "recorded_per_second", floodRate)
		g.suppressed = 0
	}
	if g.tokens >= 1 {
		g.tokens--
		return true
	}
	if g.suppressed == 0 {
		g.since = now
	}
	g.suppressed++
	return false
}
