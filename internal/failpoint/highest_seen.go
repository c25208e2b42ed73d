//go:build fencegw_break_highest_seen

package failpoint

const active = "highest_seen"
