//go:build !fencegw_break_unlock_on_timeout

package gateway

// breakUnlockOnTimeout is true only in the deliberately broken build
// (go build -tags fencegw_break_unlock_on_timeout) that cmd/fencegw-torture
// must catch. In the normal build the branch compiles away.
const breakUnlockOnTimeout = false
