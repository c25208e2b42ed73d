//go:build fencegw_break_no_send_check

package failpoint

// The broken build fencegw_break_no_send_check: failpoint.NoSendCheck is on.
const active = "no_send_check"
