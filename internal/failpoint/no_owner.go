//go:build fencegw_break_no_owner

package failpoint

// The broken build fencegw_break_no_owner: failpoint.NoOwner is on.
const active = "no_owner"
