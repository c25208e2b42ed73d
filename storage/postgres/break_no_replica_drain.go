//go:build fencegw_break_no_replica_drain

package postgres

// Deliberately broken: an exclusive taker ignores the presence rows of dead
// lock sessions, so after a replica dies with a write in flight the next
// grant returns at once and the old write can land after the new holder's.
const breakNoReplicaDrain = true
