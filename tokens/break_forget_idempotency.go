//go:build fencegw_break_forget_idempotency

package tokens

// Deliberately broken: a key's record is forgotten, so every retry is
// forwarded again as if it were the first attempt.
const breakForgetIdempotency = true
