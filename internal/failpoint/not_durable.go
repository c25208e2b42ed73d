//go:build fencegw_break_not_durable

package failpoint

const active = "not_durable"
