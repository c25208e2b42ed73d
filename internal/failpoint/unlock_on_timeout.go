//go:build fencegw_break_unlock_on_timeout

package failpoint

// The broken build fencegw_break_unlock_on_timeout: failpoint.UnlockOnTimeout is on.
const active = "unlock_on_timeout"
