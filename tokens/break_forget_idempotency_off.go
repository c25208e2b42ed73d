//go:build !fencegw_break_forget_idempotency

package tokens

// breakForgetIdempotency is true only in the deliberately broken build
// (go build -tags fencegw_break_forget_idempotency) that cmd/fencegw-torture
// must catch (rule idempotency-key-once). In the normal build the branch
// compiles away.
const breakForgetIdempotency = false
