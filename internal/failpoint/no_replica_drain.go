//go:build fencegw_break_no_replica_drain

package failpoint

const active = "no_replica_drain"
