//go:build fencegw_break_skip_route_check

package failpoint

// The broken build fencegw_break_skip_route_check: failpoint.SkipRouteCheck is on.
const active = "skip_route_check"
