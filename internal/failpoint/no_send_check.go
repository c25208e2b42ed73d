//go:build fencegw_break_no_send_check

package failpoint

const active = "no_send_check"
