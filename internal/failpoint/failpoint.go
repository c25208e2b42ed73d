// Package failpoint holds the deliberately broken builds: each is a build
// tag (fencegw_break_<name>) that turns one constant below true, and the
// code it breaks tests that constant in one `if failpoint.X {` at the point
// where the safety rule is kept. In the normal build every constant is
// false and the compiler drops the branch, so the production binary holds
// none of the broken code.
//
// The torture (cmd/fencegw-torture, docs/reliability.md) must catch every
// broken build: scripts/torture-ci.sh builds each one listed in Breaks
// (cmd/failpoints list), runs it in the mode and with the faults given
// there, and fails if the run finds no violation of a rule in its CaughtBy
// (cmd/failpoints caught). A broken build that passes means the torture
// lost the ability to see that kind of bug.
//
// One break per build: the tags are mutually exclusive (two of them
// declare active twice and do not compile), so that a caught build names
// its cause.
package failpoint

// The failpoints. Each says what it breaks, where, and which torture rules
// (torture.Rule*) catch it.
const (
	// HighestSeen (tokens.Service.judge): writes are fenced on the highest
	// token seen in a write instead of the granted one, and expiry is
	// ignored, so a superseded holder still gets through until its
	// successor's first write. Caught by stale-applied and token-order.
	HighestSeen = active == "highest_seen"

	// NotDurable (storage/bolt Store.Grant): a grant is decided on the
	// cache, returned at once (so writes under it are forwarded) and
	// committed to the file a little later; a kill -9 in between loses a
	// token a worker already used. Caught by duplicate-token.
	NotDurable = active == "not_durable"

	// UnlockOnTimeout (gateway forwardFailed): a forward that timed out
	// releases the resource's lock at once, without the drain period,
	// although the write may still land. Caught by stale-applied (the
	// successor's writes land before the timed-out one; exactly-once and
	// idempotency-key-once usually fire too).
	UnlockOnTimeout = active == "unlock_on_timeout"

	// FloatTokens (storage/bolt decodeResource): tokens read back from the
	// file go through a float64, as a JSON decoder into any would do, and
	// lose precision above 2^53 (the torture's tokens start at 2^53+1).
	// Caught by duplicate-token.
	FloatTokens = active == "float_tokens"

	// NoOwner (tokens.ownedBy): no binding between a lease and the
	// principal that acquired it: a write, renewal or release with another
	// key's lease id is accepted. Caught by foreign-lease (the thieves).
	NoOwner = active == "no_owner"

	// SkipRouteCheck (gateway routeTable.check): route bindings are not
	// checked, so a live lease on one resource writes to another
	// resource's path. Caught by foreign-route (the route thieves).
	SkipRouteCheck = active == "skip_route_check"

	// ForgetIdempotency (tokens.Idempotency.Begin): a key's record is
	// forgotten, so every retry is forwarded again as if it were the first
	// attempt. Caught by idempotency-key-once (the keyed retries).
	ForgetIdempotency = active == "forget_idempotency"

	// NoReplicaDrain (storage/postgres exclusiveFence): an exclusive taker
	// ignores the presence rows of dead lock sessions, so after a replica
	// dies with a write in flight the next grant returns at once and the
	// old write can land after the new holder's. Only the PostgreSQL modes
	// share fences between replicas: run in postgres mode with the faults
	// kill-in-write,pause-worker. Caught by stale-applied.
	NoReplicaDrain = active == "no_replica_drain"

	// NoSendCheck (tokens.Permit.Check): the proof that a replica still
	// holds a write's fence is not taken before its bytes are sent, so a
	// replica whose lock sessions died goes on sending a slow body (or a
	// write admitted just before) after another replica drained the
	// orphan and granted a newer token. Run in postgres mode with the
	// faults kill-pg-sessions,slow-body. Caught by stale-applied.
	NoSendCheck = active == "no_send_check"

	// DropFailedDrain (tokens.Service.drain): a drain period the store
	// could not record is given up, and the write's fence released at
	// once, although the write may still land: once the store takes
	// writes again a grant goes through and the new holder writes before
	// the old write arrives. Run with the faults
	// store-refuses-drain,slow-upstream (embedded mode: the store's file
	// refuses writes around a timed-out forward; the PostgreSQL modes: a
	// session holds the resource's fences row). Caught by stale-applied.
	DropFailedDrain = active == "drop_failed_drain"
)

// Break describes one broken build for the torture's runner.
type Break struct {
	// Name is the failpoint's name: the build tag is "fencegw_break_"+Name.
	Name string
	// On is the failpoint's constant, true only in its own build.
	On bool
	// Mode is the torture mode whose path reaches the failpoint
	// (--mode), and Faults the faults to inject ("" for the default).
	Mode, Faults string
	// CaughtBy lists the torture rules that catch it.
	CaughtBy []string
}

// Tag is the build tag that turns the failpoint on.
func (b Break) Tag() string { return "fencegw_break_" + b.Name }

// Breaks lists every failpoint, in the order the torture runs them.
var Breaks = []Break{
	{Name: "highest_seen", On: HighestSeen, Mode: "embedded", CaughtBy: []string{"stale-applied", "token-order"}},
	{Name: "not_durable", On: NotDurable, Mode: "embedded", CaughtBy: []string{"duplicate-token"}},
	{Name: "unlock_on_timeout", On: UnlockOnTimeout, Mode: "embedded", CaughtBy: []string{"stale-applied"}},
	{Name: "float_tokens", On: FloatTokens, Mode: "embedded", CaughtBy: []string{"duplicate-token"}},
	{Name: "no_owner", On: NoOwner, Mode: "embedded", CaughtBy: []string{"foreign-lease"}},
	{Name: "skip_route_check", On: SkipRouteCheck, Mode: "embedded", CaughtBy: []string{"foreign-route"}},
	{Name: "forget_idempotency", On: ForgetIdempotency, Mode: "embedded", CaughtBy: []string{"idempotency-key-once"}},
	{Name: "no_replica_drain", On: NoReplicaDrain, Mode: "postgres", Faults: "kill-in-write,pause-worker", CaughtBy: []string{"stale-applied"}},
	{Name: "no_send_check", On: NoSendCheck, Mode: "postgres", Faults: "kill-pg-sessions,slow-body", CaughtBy: []string{"stale-applied"}},
	{Name: "drop_failed_drain", On: DropFailedDrain, Mode: "embedded", Faults: "store-refuses-drain,slow-upstream", CaughtBy: []string{"stale-applied"}},
}

// Active returns the name of the failpoint this binary was built with, or
// "" for the normal build.
func Active() string { return active }
