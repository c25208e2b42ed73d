//go:build !(fencegw_break_highest_seen || fencegw_break_not_durable || fencegw_break_unlock_on_timeout || fencegw_break_float_tokens || fencegw_break_no_owner || fencegw_break_skip_route_check || fencegw_break_forget_idempotency || fencegw_break_no_replica_drain || fencegw_break_no_send_check || fencegw_break_drop_failed_drain)

package failpoint

// The normal build: no failpoint is on.
const active = ""
