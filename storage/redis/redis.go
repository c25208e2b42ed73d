// Package redis implements tokens.Store for the "--postgres URL --redis URL"
// storage mode: leases are claimed, renewed and released in Redis (SET NX
// PX, compare-and-set scripts), while tokens, fences, the lease record, the
// history and the rejection log stay in a durable Ledger (PostgreSQL, see
// storage/postgres). Rejections fan out to every replica over Redis pub/sub.
//
// The safety argument of the split:
//
//  1. Redis decides only who may hold a resource and for how long. It never
//     issues a token: every grant takes the next token from the Ledger, in
//     the Ledger's transaction, after winning the Redis claim. A Redis
//     restart, failover or FLUSHALL can at worst let a second grant win a
//     claim early; that grant still gets a strictly larger, durable token
//     and supersedes the old lease in the Ledger.
//  2. The fence is the Ledger's: Resource reports the Ledger's current token
//     and current lease, and a write is judged (tokens.Judge) against them
//     under the PostgreSQL fence (postgres.Fence: advisory locks, not a
//     Redis lock). A lease whose Redis claim is gone or taken is reported expired,
//     never live; a lease that Redis still shows but the Ledger superseded
//     is stale by its token. Neither store alone can admit an old token.
//  3. Renew and release only ever touch a claim whose value is the caller's
//     lease id (a Lua compare-and-set; never a plain DEL), so a superseded
//     lease can never extend or delete its successor's claim.
//  4. A lease lasts until the expiry the Ledger gave its holder. The claim
//     is set before the Ledger records the lease, which counts the TTL from
//     its own later clock, so the claim is set for claimGrace longer than
//     the TTL: it outlives the Ledger's expiry rather than end before it.
//     A lease ends at the earlier of the two (the Ledger's expiry, or its
//     claim's end if Redis lost it); a grant that finds a claim whose lease
//     the Ledger reads as ended replaces it by compare-and-set, so the
//     grace does not delay the next holder, and renewals and releases are
//     refused by the Ledger once the lease expired there.
//
// Losing Redis data therefore costs efficiency only (a holder loses its
// lease early), which is what docs/design.md promises.
package redis

import (
	"context"
	"errors"
	"log/slog"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/tokens"
)

// Ledger is what this package needs from the durable token store; it is
// defined here, on the consumer side. *postgres.Store implements it.
//
// GrantClaimed is the Ledger's Grant minus the decision of who holds the
// resource, which Redis has already taken: it checks the drain period and
// the owner's cap (tokens.GrantRequest.MaxLeases; why the cap is counted
// there and not in Redis is argued at postgres.Store.checkOwnerCap), bumps
// the token, records the lease (superseding the previous one) and the
// history event in one transaction. Renew, Release and Revoke are the
// Ledger's own: they succeed only for the current, unreleased lease before
// the expiry the Ledger recorded, and record the event or the refusal.
type Ledger interface {
	GrantClaimed(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error)
	Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error)
	Release(ctx context.Context, leaseID string) (tokens.Lease, error)
	// Revoke is Release recorded as revoked by an administrator.
	Revoke(ctx context.Context, leaseID, by string) (tokens.Lease, error)
	// LeaseAt returns a lease and the Ledger's clock at the read.
	LeaseAt(ctx context.Context, leaseID string) (tokens.Lease, time.Time, error)
	// LeaseState returns a lease and its resource's state in one read.
	LeaseState(ctx context.Context, leaseID string) (tokens.Lease, tokens.Resource, error)
	// RecordEvent appends a lease history event (refusals Redis decided).
	RecordEvent(ctx context.Context, e tokens.Event) error

	Resource(ctx context.Context, name string) (tokens.Resource, error)
	CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error)
	Drain(ctx context.Context, resource string, d time.Duration) error
	RecordRejection(ctx context.Context, r tokens.Rejection) (tokens.Rejection, error)
	Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error)
	History(ctx context.Context, resource string, limit int) ([]tokens.Event, error)
	Ping(ctx context.Context) error
}

// DefaultPrefix starts every key and channel name when Options.Prefix is
// empty: the prefix of the default PostgreSQL schema (SchemaPrefix("")).
const DefaultPrefix = "fencegw:"

// SchemaPrefix is the key and channel prefix of the deployment whose
// PostgreSQL tables are in schema, so that two deployments that share a
// Redis database share nothing in it, as their schemas share nothing in
// PostgreSQL. The default schema ("") keeps DefaultPrefix, the prefix
// every release before this one used: replicas of an upgraded deployment
// and replicas not yet upgraded claim the same keys during a rolling
// upgrade (another prefix would let each side grant a resource the other
// holds; tokens stay safe, by the package's argument, but leases granted
// before the upgrade would read as expired on the upgraded replicas).
//
// Another schema's prefix is "fencegw:<schema>#": resource names cannot
// hold '#' (tokens.Limits.ValidateResource), so no key of one schema, the default's
// included, can be another's, whatever characters the schemas' names
// hold.
func SchemaPrefix(schema string) string {
	if schema == "" {
		return DefaultPrefix
	}
	return DefaultPrefix + schema + "#"
}

// Options configure a Store.
type Options struct {
	// Prefix starts every key and the pub/sub channel (empty:
	// DefaultPrefix; a deployment's is SchemaPrefix of its PostgreSQL
	// schema unless its operator names one); tests use one per test for
	// isolation.
	Prefix string
	// Logger receives errors that have no caller (nil: slog.Default()).
	Logger *slog.Logger
}

// Store is a tokens.Store with leases in Redis and everything durable in a
// Ledger. Use the Ledger's fence (postgres.Fence, reading through
// LeaseState) as its Fencer.
type Store struct {
	rdb    goredis.UniversalClient
	ledger Ledger
	prefix string
	log    *slog.Logger
}

var _ tokens.Store = (*Store)(nil)

// New returns a Store on client and ledger. It does not own either: close
// them after the Store is no longer used.
func New(client goredis.UniversalClient, ledger Ledger, opts Options) *Store {
	s := &Store{rdb: client, ledger: ledger, prefix: opts.Prefix, log: opts.Logger}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

func (s *Store) leaseKey(resource string) string { return s.prefix + "lease:" + resource }

// claimGrace is how much longer than its lease's TTL a claim is set (and
// extended) for: more than the Ledger takes to record a grant or a renewal
// on a busy database, so that the claim ends after the expiry the Ledger
// records (point 4 of the package's argument). A Ledger slower than that
// ends the lease early, at its claim's end, as before there was a grace.
// The grace delays no grant (Grant replaces the claim of an ended lease);
// only a claim whose lease the Ledger never recorded (its grant failed and
// the claim could not be given back) stands that much longer.
const claimGrace = time.Second

// claimTTL is the claim's time to live in milliseconds for a lease of ttl.
func claimTTL(ttl time.Duration) int64 { return (ttl + claimGrace).Milliseconds() }

// claimScript: SET NX PX, or, when ARGV[3] names the lease holding the
// claim (one the Ledger reads as ended), a compare-and-set from it; and
// when the claim is not taken, who holds it and for how long, in one
// atomic step.
var claimScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if (not cur) or (ARGV[3] ~= '' and cur == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, ARGV[1], tonumber(ARGV[2])}
end
return {0, cur, redis.call('PTTL', KEYS[1])}
`)

// renewScript extends the claim only if it is still the caller's.
var renewScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript deletes the claim only if it is still the caller's.
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

func unavailable(op string, err error) error { return tokens.Unavailable("redis "+op, err) }

// Grant claims the resource in Redis (SET NX PX), then takes the next token
// from the Ledger. A claim held by a lease the Ledger reads as ended
// (expired, released or superseded: its claim outlives it by up to
// claimGrace, or a release could not delete it) is replaced by
// compare-and-set. A failed Ledger grant (drain period, the owner's cap,
// database down) gives the claim back, by compare-and-set.
func (s *Store) Grant(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	key := s.leaseKey(req.Resource)
	replace := ""
	for attempt := 1; ; attempt++ {
		res, err := claimScript.Run(ctx, s.rdb, []string{key}, req.LeaseID, claimTTL(req.TTL), replace).Slice()
		if err != nil {
			return tokens.Lease{}, unavailable("claim", err)
		}
		if len(res) != 3 {
			return tokens.Lease{}, unavailable("claim", errors.New("unexpected script reply"))
		}
		if won, _ := res[0].(int64); won == 1 {
			break
		}
		holderID, _ := res[1].(string)
		pttl, _ := res[2].(int64)
		ended, held := s.claimedBy(ctx, req.Resource, holderID, pttl)
		if !ended || attempt == 3 {
			// A live holder, or a claim that kept changing hands: the
			// caller waits, or is told who holds it.
			return tokens.Lease{}, held
		}
		replace = holderID
	}
	lease, err := s.ledger.GrantClaimed(ctx, req)
	if err != nil {
		s.unclaim(ctx, key, req.LeaseID)
		return tokens.Lease{}, err
	}
	return lease, nil
}

// claimedBy looks up the lease holderID, whose claim on resource has pttl
// milliseconds left, in the Ledger: ended if the Ledger reads it as ended,
// and the ErrLeaseHeld a grant that found the claim answers, with the
// holder's facts while it has not (one to retry at once if it has).
func (s *Store) claimedBy(ctx context.Context, resource, holderID string, pttl int64) (ended bool, held error) {
	retry := time.Duration(pttl) * time.Millisecond
	if retry <= 0 {
		retry = time.Millisecond // expired between SET and PTTL: retry at once
	}
	holder := tokens.Lease{Resource: resource}
	if holderID != "" {
		// Facts only: the claim may belong to a grant still in progress,
		// which the Ledger does not know yet.
		if l, r, err := s.ledger.LeaseState(ctx, holderID); err == nil {
			if r.StateOf(l, r.Now) != tokens.StateCurrent {
				return true, tokens.LeaseHeld(holder, time.Millisecond)
			}
			holder.Holder, holder.Token, holder.ExpiresAt = l.Holder, l.Token, l.ExpiresAt
			// Free once the Ledger's expiry passes, not the claim's.
			retry = min(retry, max(l.ExpiresAt.Sub(r.Now), time.Millisecond))
		}
	}
	return false, tokens.LeaseHeld(holder, retry)
}

// unclaim gives a claim back, with a context that outlives the caller's
// (a cancelled request must not leave a claim behind for a whole TTL).
func (s *Store) unclaim(ctx context.Context, key, leaseID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := releaseScript.Run(ctx, s.rdb, []string{key}, leaseID).Err(); err != nil {
		s.log.Error("could not give a lease claim back; it expires with its TTL", "key", key, "err", err)
	}
}

// Renew extends the lease in Redis by compare-and-set, then records the new
// TTL and expiry in the Ledger, which refuses a lease it reads as ended.
// ttl 0 reuses the lease's TTL.
func (s *Store) Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error) {
	l, _, err := s.ledger.LeaseAt(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	if ttl == 0 {
		ttl = l.TTL
	}
	key := s.leaseKey(l.Resource)
	n, err := renewScript.Run(ctx, s.rdb, []string{key}, leaseID, claimTTL(ttl)).Int64()
	if err != nil {
		return tokens.Lease{}, unavailable("renew", err)
	}
	if n != 1 {
		return tokens.Lease{}, s.refuse(ctx, l, tokens.EventRenewRefused)
	}
	out, err := s.ledger.Renew(ctx, leaseID, ttl)
	if errors.Is(err, tokens.ErrLeaseLost) {
		// Redis still had the claim (in its grace after the Ledger's
		// expiry, or restored by a failover) but the Ledger reads the
		// lease as ended: the claim, just extended, is worthless.
		s.unclaim(ctx, key, leaseID)
	}
	return out, err
}

// Release ends the lease: it checks that Redis still holds the lease's
// claim, records the release in the Ledger (which refuses a superseded
// lease), and only then deletes the claim by compare-and-set. In that order
// no other grant can claim the resource between the check and the Ledger's
// record, so a live lease's release is never misread as superseded.
// Releasing again a lease its holder released succeeds.
func (s *Store) Release(ctx context.Context, leaseID string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, "")
}

// Revoke is Release on an administrator's order, recorded in the Ledger's
// history as revoked by by.
func (s *Store) Revoke(ctx context.Context, leaseID, by string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, by)
}

func (s *Store) release(ctx context.Context, leaseID, revokedBy string) (tokens.Lease, error) {
	l, _, err := s.ledger.LeaseAt(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	if l.Released() {
		return l, nil
	}
	holder, err := s.claimHolder(ctx, l.Resource)
	if err != nil {
		return tokens.Lease{}, err
	}
	if holder != leaseID {
		return tokens.Lease{}, s.refuse(ctx, l, tokens.EventReleaseRefused)
	}
	var out tokens.Lease
	if revokedBy != "" {
		out, err = s.ledger.Revoke(ctx, leaseID, revokedBy)
	} else {
		out, err = s.ledger.Release(ctx, leaseID)
	}
	if err != nil && !errors.Is(err, tokens.ErrLeaseLost) {
		return tokens.Lease{}, err
	}
	// Released, or ended in the Ledger while Redis still showed the claim
	// (expired in its grace, or superseded and restored by a failover):
	// either way the claim must go.
	s.unclaim(ctx, s.leaseKey(l.Resource), leaseID)
	return out, err
}

// refuse records a renewal or release that Redis refused (the claim expired
// or belongs to a newer lease) and returns ErrLeaseLost with the facts.
func (s *Store) refuse(ctx context.Context, l tokens.Lease, kind tokens.EventKind) error {
	e := &tokens.Error{Kind: tokens.ErrLeaseLost, Resource: l.Resource, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt, Detail: "expired"}
	if r, err := s.ledger.Resource(ctx, l.Resource); err == nil {
		e.CurrentToken = r.Token
		switch {
		case r.Token > l.Token:
			e.Detail = "superseded by a newer grant"
		case l.Released():
			e.Detail = "released"
		}
	}
	if err := s.ledger.RecordEvent(ctx, tokens.Event{Resource: l.Resource, Kind: kind, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}); err != nil {
		return err
	}
	return e
}

// claimHolder returns the lease id holding resource's claim ("" if none).
func (s *Store) claimHolder(ctx context.Context, resource string) (string, error) {
	id, err := s.rdb.Get(ctx, s.leaseKey(resource)).Result()
	if errors.Is(err, goredis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", unavailable("get claim", err)
	}
	return id, nil
}

// withClaim reports l as the Ledger recorded it if Redis still holds its
// claim; an unreleased lease without its claim has ended: its expiry is
// clipped to now (the Ledger's clock).
func withClaim(l tokens.Lease, holder string, now time.Time) tokens.Lease {
	if !l.Released() && holder != l.ID && l.ExpiresAt.After(now) {
		l.ExpiresAt = now
	}
	return l
}

// Lease returns a lease by id; a lease whose Redis claim is gone is
// reported expired.
func (s *Store) Lease(ctx context.Context, leaseID string) (tokens.Lease, error) {
	l, now, err := s.ledger.LeaseAt(ctx, leaseID)
	if err != nil || l.Released() {
		return l, err
	}
	holder, err := s.claimHolder(ctx, l.Resource)
	if err != nil {
		return tokens.Lease{}, err
	}
	return withClaim(l, holder, now), nil
}

// Resource returns the Ledger's fence state (its token, its current lease,
// its clock), with the current lease reported expired unless Redis still
// holds its claim. The Ledger is read first and Redis second, so a claim
// that expires in between counts as expired.
func (s *Store) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	r, err := s.ledger.Resource(ctx, name)
	if err != nil || r.Lease == nil || r.Lease.Released() {
		return r, err
	}
	holder, err := s.claimHolder(ctx, name)
	if err != nil {
		return tokens.Resource{}, err
	}
	l := withClaim(*r.Lease, holder, r.Now)
	r.Lease = &l
	return r, nil
}

// LeaseState returns a lease and its resource's fence state as the Ledger
// records them, with the current lease reported expired unless Redis still
// holds its claim (the Ledger first, Redis second, as in Resource). It is
// what the PostgreSQL fence reads under its lock in this mode.
func (s *Store) LeaseState(ctx context.Context, leaseID string) (tokens.Lease, tokens.Resource, error) {
	l, r, err := s.ledger.LeaseState(ctx, leaseID)
	if err != nil || r.Lease == nil || r.Lease.Released() {
		return l, r, err
	}
	holder, err := s.claimHolder(ctx, r.Name)
	if err != nil {
		return tokens.Lease{}, tokens.Resource{}, err
	}
	current := withClaim(*r.Lease, holder, r.Now)
	r.Lease = &current
	if l.ID == current.ID {
		l = current
	}
	return l, r, nil
}

// CurrentLeases returns the Ledger's live leases whose Redis claim is still
// theirs (up to limit; fewer if some claims were lost).
func (s *Store) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	leases, err := s.ledger.CurrentLeases(ctx, limit)
	if err != nil || len(leases) == 0 {
		return leases, err
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*goredis.StringCmd, len(leases))
	for i, l := range leases {
		cmds[i] = pipe.Get(ctx, s.leaseKey(l.Resource))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		return nil, unavailable("current leases", err)
	}
	out := leases[:0]
	for i, l := range leases {
		if id, err := cmds[i].Result(); err == nil && id == l.ID {
			out = append(out, l)
		}
	}
	return out, nil
}

// Drain delegates to the Ledger.
func (s *Store) Drain(ctx context.Context, resource string, d time.Duration) error {
	return s.ledger.Drain(ctx, resource, d)
}

// RecordRejection delegates to the Ledger.
func (s *Store) RecordRejection(ctx context.Context, r tokens.Rejection) (tokens.Rejection, error) {
	return s.ledger.RecordRejection(ctx, r)
}

// Rejections delegates to the Ledger.
func (s *Store) Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error) {
	return s.ledger.Rejections(ctx, q)
}

// History delegates to the Ledger.
func (s *Store) History(ctx context.Context, resource string, limit int) ([]tokens.Event, error) {
	return s.ledger.History(ctx, resource, limit)
}

// Ping reports whether both Redis and the Ledger answer.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return unavailable("ping", err)
	}
	return s.ledger.Ping(ctx)
}
