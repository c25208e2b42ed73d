//go:build !fencegw_break_no_replica_drain

package postgres

// breakNoReplicaDrain is true only in the deliberately broken build
// fencegw_break_no_replica_drain (see break_no_replica_drain.go), which the
// torture must catch.
const breakNoReplicaDrain = false
