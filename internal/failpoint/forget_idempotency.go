//go:build fencegw_break_forget_idempotency

package failpoint

// The broken build fencegw_break_forget_idempotency: failpoint.ForgetIdempotency is on.
const active = "forget_idempotency"
