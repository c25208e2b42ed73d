//go:build fencegw_break_skip_route_check

package failpoint

const active = "skip_route_check"
