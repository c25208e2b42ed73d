//go:build fencegw_break_drop_failed_drain

package failpoint

const active = "drop_failed_drain"
