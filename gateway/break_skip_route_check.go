//go:build fencegw_break_skip_route_check

package gateway

// Deliberately broken: route bindings are not checked, so a live lease on
// one resource writes to another resource's route.
const breakSkipRouteCheck = true
