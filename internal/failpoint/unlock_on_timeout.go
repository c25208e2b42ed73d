//go:build fencegw_break_unlock_on_timeout

package failpoint

const active = "unlock_on_timeout"
