//go:build !fencegw_break_skip_route_check

package gateway

// breakSkipRouteCheck is true only in the deliberately broken build
// (go build -tags fencegw_break_skip_route_check) that cmd/fencegw-torture
// must catch. In the normal build the branch compiles away.
const breakSkipRouteCheck = false
