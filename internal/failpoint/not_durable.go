//go:build fencegw_break_not_durable

package failpoint

// The broken build fencegw_break_not_durable: failpoint.NotDurable is on.
const active = "not_durable"
