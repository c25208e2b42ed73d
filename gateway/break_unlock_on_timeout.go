//go:build fencegw_break_unlock_on_timeout

package gateway

// Deliberately broken: a forward that timed out releases the resource's
// lock at once, without the drain period, although the write may still land.
const breakUnlockOnTimeout = true
