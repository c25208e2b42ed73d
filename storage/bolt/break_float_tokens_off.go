//go:build !fencegw_break_float_tokens

package bolt

// breakFloatTokens is true only in the deliberately broken build
// (go build -tags fencegw_break_float_tokens) that cmd/fencegw-torture must
// catch. In the normal build the branch compiles away.
const breakFloatTokens = false
