//go:build fencegw_break_float_tokens

package failpoint

// The broken build fencegw_break_float_tokens: failpoint.FloatTokens is on.
const active = "float_tokens"
