//go:build fencegw_break_float_tokens

package failpoint

const active = "float_tokens"
