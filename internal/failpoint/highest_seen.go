//go:build fencegw_break_highest_seen

package failpoint

// The broken build fencegw_break_highest_seen: failpoint.HighestSeen is on.
const active = "highest_seen"
