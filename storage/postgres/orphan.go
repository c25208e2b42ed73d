package postgres

// The drain after an orphaned fence, from the drain period and the
// session check.

import "time"

// OrphanDrain is the FenceOptions.OrphanDrain a gateway with this drain
// period and session check needs: a replica that dies with a fence held
// may have admitted writes until its session was found dead (at most one
// SessionCheck after its fence could have lapsed), and each of those may
// be on its way for the drain period (guarantee 7; fence.go, points 3-4).
// Every caller takes the sum from here.
func OrphanDrain(drainPeriod, sessionCheck time.Duration) time.Duration {
	return drainPeriod + sessionCheck
}
