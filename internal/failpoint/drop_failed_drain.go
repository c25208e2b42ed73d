//go:build fencegw_break_drop_failed_drain

package failpoint

// The broken build fencegw_break_drop_failed_drain: failpoint.DropFailedDrain is on.
const active = "drop_failed_drain"
