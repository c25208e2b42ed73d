//go:build fencegw_break_forget_idempotency

package failpoint

const active = "forget_idempotency"
