//go:build fencegw_break_no_replica_drain

package failpoint

// The broken build fencegw_break_no_replica_drain: failpoint.NoReplicaDrain is on.
const active = "no_replica_drain"
