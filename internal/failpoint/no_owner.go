//go:build fencegw_break_no_owner

package failpoint

const active = "no_owner"
