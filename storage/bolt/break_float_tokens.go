//go:build fencegw_break_float_tokens

package bolt

// Deliberately broken: tokens read back from the file go through a float64,
// as a JSON decoder into interface{} would do, and lose precision above 2^53.
const breakFloatTokens = true
