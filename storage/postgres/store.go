package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/tokens"
)

// Time in this file is the database's: each statement reads
// clock_timestamp() once (after any row lock it waits for) and passes that
// value on, so expiry is never judged by a gateway's or a worker's clock.

const leaseCols = `l.id, l.resource, l.holder, l.token, l.ttl_ms, l.granted_at, l.expires_at, l.released_at, l.owner`

type leaseRow struct {
	id, resource, holder string
	token, ttlMS         int64
	grantedAt, expiresAt time.Time
	releasedAt           *time.Time
	owner                string
}

func (r *leaseRow) dest() []any {
	return []any{&r.id, &r.resource, &r.holder, &r.token, &r.ttlMS, &r.grantedAt, &r.expiresAt, &r.releasedAt, &r.owner}
}

func (r *leaseRow) lease() tokens.Lease {
	l := tokens.Lease{
		ID:        r.id,
		Resource:  r.resource,
		Holder:    r.holder,
		Owner:     r.owner,
		Token:     r.token,
		TTL:       time.Duration(r.ttlMS) * time.Millisecond,
		GrantedAt: r.grantedAt,
		ExpiresAt: r.expiresAt,
	}
	if r.releasedAt != nil {
		l.ReleasedAt = *r.releasedAt
	}
	return l
}

// Grant makes a new lease current with the next token (tokens.Store).
//
// One transaction: the resource's fences row is created if missing and
// locked (INSERT ... ON CONFLICT DO UPDATE), the live-lease and drain checks
// run against that locked row with the clock read after the lock, and the
// token bump, the new lease, the superseding of the previous one and the
// history event are written before COMMIT. The decision is taken in Go, but
// under the row lock, so no other grant can interleave; and the token is
// durable (committed) before Grant returns.
func (s *Store) Grant(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	return s.grant(ctx, req, true)
}

// GrantClaimed is Grant without the live-lease check, for a caller that has
// already claimed the lease elsewhere (the Redis mode: SET NX decided that
// the resource is free). The drain check, the token bump and the history
// are as in Grant; a previous lease still recorded as current is superseded.
func (s *Store) GrantClaimed(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	return s.grant(ctx, req, false)
}

func (s *Store) grant(ctx context.Context, req tokens.GrantRequest, checkHeld bool) (tokens.Lease, error) {
	if req.LeaseID == "" {
		return tokens.Lease{}, tokens.Invalid("lease_id", "must not be empty")
	}
	var lease tokens.Lease
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			token       int64
			drainUntil  *time.Time
			now         time.Time
			prevID      *string
			prevHolder  *string
			prevToken   *int64
			prevExp     *time.Time
			prevRel     *time.Time
			serverStart time.Time
		)
		// Statement 1 locks the fence row (waiting for a concurrent grant to
		// commit) and returns its latest version. The lease is read by a
		// second statement on purpose: under READ COMMITTED a statement's
		// snapshot is taken before it waits, so a join in statement 1 would
		// not see the lease that the grant we waited for just inserted, and
		// would take a live lease for a free resource.
		err := tx.QueryRow(ctx, `
			INSERT INTO fences AS f (resource) VALUES ($1)
			ON CONFLICT (resource) DO UPDATE SET token = f.token
			RETURNING f.token, f.lease_id, f.drain_until, clock_timestamp(), pg_postmaster_start_time()`, req.Resource,
		).Scan(&token, &prevID, &drainUntil, &now, &serverStart)
		if err != nil {
			return err
		}
		if prevID != nil {
			err = tx.QueryRow(ctx, `SELECT holder, token, expires_at, released_at FROM leases WHERE id = $1`, *prevID).
				Scan(&prevHolder, &prevToken, &prevExp, &prevRel)
			if err != nil {
				return err
			}
		}
		if checkHeld && prevID != nil {
			prev := tokens.Lease{Resource: req.Resource, Holder: *prevHolder, Token: *prevToken, ExpiresAt: *prevExp}
			if prevRel != nil {
				prev.ReleasedAt = *prevRel
			}
			if h := (tokens.Resource{Token: token, Lease: &prev}).Holder(now); h != nil {
				return tokens.LeaseHeld(*h, h.Remaining(now))
			}
		}
		// A restart of PostgreSQL ends every session, and with them the
		// shared locks of writes still in flight on any replica, and it may
		// have kept their drain periods from being recorded: until the
		// restart drain has passed, a resource that had a lease is closed
		// to grants as if each such write had an unknown outcome.
		if restartEnd := serverStart.Add(s.opts.RestartDrain); prevID != nil && now.Before(restartEnd) &&
			(drainUntil == nil || drainUntil.Before(restartEnd)) {
			drainUntil = &restartEnd
		}
		if drainUntil != nil && now.Before(*drainUntil) {
			return &tokens.Error{Kind: tokens.ErrFenceBusy, Resource: req.Resource, CurrentToken: token,
				Detail: "a forward whose outcome is unknown may still land", RetryAfter: drainUntil.Sub(now)}
		}
		superseded := ""
		if prevID != nil {
			superseded = *prevID
		}
		if err := s.checkOwnerCap(ctx, tx, req, superseded); err != nil {
			return err
		}
		lease = tokens.Lease{
			ID:        req.LeaseID,
			Resource:  req.Resource,
			Holder:    req.Holder,
			Owner:     req.Owner,
			Token:     token + 1,
			TTL:       time.Duration(req.TTL.Milliseconds()) * time.Millisecond,
			GrantedAt: now,
		}
		lease.ExpiresAt = now.Add(lease.TTL)
		b := &pgx.Batch{}
		if prevID != nil {
			b.Queue(`UPDATE leases SET superseded_at = $2 WHERE id = $1 AND superseded_at IS NULL`, *prevID, now)
		}
		b.Queue(`UPDATE fences SET token = $2, lease_id = $3 WHERE resource = $1`, req.Resource, lease.Token, lease.ID)
		b.Queue(`INSERT INTO leases (id, resource, holder, token, ttl_ms, granted_at, expires_at, owner)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			lease.ID, lease.Resource, lease.Holder, lease.Token, lease.TTL.Milliseconds(), lease.GrantedAt, lease.ExpiresAt, lease.Owner)
		queueEvent(b, now, lease, tokens.EventGranted)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return tokens.Lease{}, s.interpret("grant", err)
	}
	return lease, nil
}

// ownerLockClass is the first key of the transaction advisory locks that
// serialize one owner's capped grants across replicas (the two-key form is
// a key space apart from locker.go's one-key locks; rejections.go's class
// is another).
const ownerLockClass = 0x6667776f // "fgwo"

// checkOwnerCap refuses the grant with ErrTooManyLeases if req.Owner holds
// req.MaxLeases live leases already. It takes the owner's transaction
// advisory lock first, so that the owner's capped grants, on every
// replica, count and insert one at a time: the lock is held to COMMIT, and
// the count, a statement of its own run after the lock was granted, sees
// every lease a grant before it committed. (Under READ COMMITTED a
// statement's snapshot is taken when it starts; were the count part of the
// statement that waits for the lock, it could miss the lease inserted by
// the grant it waited for.) Liveness is judged by the database clock read
// after the lock, as everywhere in this file: once, as a scalar subquery,
// so that it bounds the index scan (leases_current_by_owner, whose
// predicate the query repeats so that a generic plan may use it too)
// instead of filtering every current lease of the owner's.
//
// This is also the cap's atomic step in the Redis mode (GrantClaimed):
// there a lease's liveness is Redis's, but the Ledger records every grant,
// renewal and release, each after (a grant, a renewal) or before (a
// release) Redis's step, so a lease is live in the Ledger at least as long
// as in Redis and the count here errs only toward refusing. A per-owner set
// in the Redis claim script would have been lost with Redis's data (a
// restart, a failover, a FLUSHALL), letting the cap be overshot silently,
// where losing Redis data is meant to cost efficiency only; and it would
// put two keys of different hash slots in one script.
//
// The lease this grant supersedes is not counted: it ends in this
// transaction. (In the Redis mode its Redis claim may have expired a
// little before the expiry the Ledger recorded, or been lost with Redis's
// data; the owner's next grant of the same resource must not be refused
// for it.)
//
// The fence row is locked before the owner lock in every grant, and
// nothing else takes the owner lock, so the two never deadlock.
func (s *Store) checkOwnerCap(ctx context.Context, tx pgx.Tx, req tokens.GrantRequest, superseded string) error {
	if req.MaxLeases <= 0 || req.Owner == "" {
		return nil
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(ownerLockClass), s.keySalt+"/"+req.Owner)
	var n int
	b.Queue(`SELECT count(*) FROM (
			SELECT 1 FROM leases
			WHERE owner = $1 AND owner <> '' AND released_at IS NULL AND superseded_at IS NULL
				AND expires_at > (SELECT clock_timestamp()) AND id <> $3
			LIMIT $2) live`, req.Owner, req.MaxLeases, superseded).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if n >= req.MaxLeases {
		return tokens.TooManyLeases(req.Resource, req.Owner, n)
	}
	return nil
}

func queueEvent(b *pgx.Batch, at time.Time, l tokens.Lease, kind tokens.EventKind) {
	queueEventBy(b, at, l, kind, "")
}

// queueEventBy records an event that actor (an administrator) caused.
func queueEventBy(b *pgx.Batch, at time.Time, l tokens.Lease, kind tokens.EventKind, actor string) {
	b.Queue(`INSERT INTO lease_events (at, resource, kind, token, holder, expires_at, actor) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		at, l.Resource, string(kind), l.Token, l.Holder, l.ExpiresAt, actor)
}

// Renew extends the current live lease to now+ttl (ttl 0: its last TTL)
// with one conditional UPDATE; a refusal is told apart afterwards and
// recorded in the history in the same transaction (tokens.Store).
func (s *Store) Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error) {
	var ttlMS *int64
	if ttl != 0 {
		v := ttl.Milliseconds()
		ttlMS = &v
	}
	return s.inLeaseTx(ctx, "renew", func(tx pgx.Tx) (tokens.Lease, *tokens.Error, error) {
		l, err := updateHeld(ctx, tx, leaseID, tokens.EventRenewed, "", `
				ttl_ms = COALESCE($2, l.ttl_ms),
				expires_at = c.now + COALESCE($2, l.ttl_ms) * interval '1 millisecond'`, ttlMS)
		if !errors.Is(err, pgx.ErrNoRows) {
			return l, nil, err
		}
		refusal, err := s.refuse(ctx, tx, leaseID, tokens.EventRenewRefused)
		return tokens.Lease{}, refusal, err
	})
}

// inLeaseTx runs fn in a transaction and returns its lease or its refusal:
// a refusal is returned once the transaction, which records it in the
// history, has committed; fn's error aborts it.
func (s *Store) inLeaseTx(ctx context.Context, op string, fn func(tx pgx.Tx) (tokens.Lease, *tokens.Error, error)) (tokens.Lease, error) {
	var out tokens.Lease
	var refusal *tokens.Error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		out, refusal, err = fn(tx)
		return err
	})
	if err != nil {
		return tokens.Lease{}, s.interpret(op, err)
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	return out, nil
}

// updateHeld sets set (the SET list of an UPDATE of leases l: $1 is the
// lease id, args follow from $2, and c.now is the database clock) on lease
// leaseID where it is still held: neither released, superseded nor
// expired. The change is recorded in
// the history as kind, caused by actor if set. pgx.ErrNoRows where no row
// matched.
func updateHeld(ctx context.Context, tx pgx.Tx, leaseID string, kind tokens.EventKind, actor, set string, args ...any) (tokens.Lease, error) {
	var r leaseRow
	var now time.Time
	err := tx.QueryRow(ctx, `
		WITH c AS (SELECT clock_timestamp() AS now)
		UPDATE leases l SET `+set+`
		FROM c
		WHERE l.id = $1 AND l.released_at IS NULL AND l.superseded_at IS NULL
			AND l.expires_at > c.now
		RETURNING `+leaseCols+`, c.now`, append([]any{leaseID}, args...)...,
	).Scan(append(r.dest(), &now)...)
	if err != nil {
		return tokens.Lease{}, err
	}
	l := r.lease()
	b := &pgx.Batch{}
	queueEventBy(b, now, l, kind, actor)
	return l, tx.SendBatch(ctx, b).Close()
}

// refuse explains why a conditional update matched nothing: the refusal is
// ErrNotFound for an unknown id, else ErrLeaseLost, recorded in the history
// as kind. err is a database failure, which aborts the transaction; the
// refusal is the caller's answer once the transaction has committed.
func (s *Store) refuse(ctx context.Context, tx pgx.Tx, leaseID string, kind tokens.EventKind) (refusal *tokens.Error, err error) {
	var r leaseRow
	var current int64
	var now time.Time
	err = tx.QueryRow(ctx, `SELECT `+leaseCols+`, f.token, clock_timestamp()
		FROM leases l JOIN fences f ON f.resource = l.resource WHERE l.id = $1`, leaseID,
	).Scan(append(r.dest(), &current, &now)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return &tokens.Error{Kind: tokens.ErrNotFound, Detail: "lease"}, nil
	}
	if err != nil {
		return nil, err
	}
	l := r.lease()
	b := &pgx.Batch{}
	queueEvent(b, now, l, kind)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return lostError(l, current, now), nil
}

func lostError(l tokens.Lease, current int64, now time.Time) *tokens.Error {
	detail := "expired"
	switch {
	case current > l.Token:
		detail = "superseded by a newer grant"
	case l.Released():
		detail = "released"
	case now.Before(l.ExpiresAt):
		detail = "no longer current"
	}
	return &tokens.Error{Kind: tokens.ErrLeaseLost, Detail: detail, Resource: l.Resource, Token: l.Token,
		CurrentToken: current, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

// Release ends the current live lease (tokens.Store). Releasing again a
// lease its holder released succeeds and changes nothing.
func (s *Store) Release(ctx context.Context, leaseID string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, "")
}

// Revoke is Release on an administrator's order, recorded as revoked by by
// (tokens.Store).
func (s *Store) Revoke(ctx context.Context, leaseID, by string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, by)
}

// release ends the lease; revokedBy, if set, names the administrator who
// ordered it.
func (s *Store) release(ctx context.Context, leaseID, revokedBy string) (tokens.Lease, error) {
	kind := tokens.EventReleased
	if revokedBy != "" {
		kind = tokens.EventRevoked
	}
	return s.inLeaseTx(ctx, "release", func(tx pgx.Tx) (tokens.Lease, *tokens.Error, error) {
		l, err := updateHeld(ctx, tx, leaseID, kind, revokedBy, `released_at = c.now`)
		if !errors.Is(err, pgx.ErrNoRows) {
			return l, nil, err
		}
		// Already released by its holder: idempotent success, no event.
		var r leaseRow
		err = tx.QueryRow(ctx, `SELECT `+leaseCols+` FROM leases l WHERE l.id = $1 AND l.released_at IS NOT NULL`,
			leaseID).Scan(r.dest()...)
		if !errors.Is(err, pgx.ErrNoRows) {
			return r.lease(), nil, err
		}
		refusal, err := s.refuse(ctx, tx, leaseID, tokens.EventReleaseRefused)
		return tokens.Lease{}, refusal, err
	})
}

// Lease returns a lease by id, or ErrNotFound (tokens.Store).
func (s *Store) Lease(ctx context.Context, leaseID string) (tokens.Lease, error) {
	l, _, err := s.LeaseAt(ctx, leaseID)
	return l, err
}

// LeaseAt is Lease that also returns the database's clock at the read.
func (s *Store) LeaseAt(ctx context.Context, leaseID string) (tokens.Lease, time.Time, error) {
	var r leaseRow
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT `+leaseCols+`, clock_timestamp() FROM leases l WHERE l.id = $1`, leaseID).
		Scan(append(r.dest(), &now)...)
	if err != nil {
		return tokens.Lease{}, time.Time{}, s.interpret("lease", err)
	}
	return r.lease(), now, nil
}

// LeaseState returns a lease and its resource's fence state, read together
// in one statement with the database clock in Now (StateReader: the read
// the fence judges writes on, which lets it refuse a write under an ended
// lease without taking the resource's fence). ErrNotFound for an unknown
// lease id.
func (s *Store) LeaseState(ctx context.Context, leaseID string) (tokens.Lease, tokens.Resource, error) {
	var (
		r       leaseRow
		res     tokens.Resource
		token   *int64
		drain   *time.Time
		current bool
	)
	err := s.pool.QueryRow(ctx, `SELECT `+leaseCols+`, f.token, f.drain_until, clock_timestamp(), f.lease_id IS NOT DISTINCT FROM l.id
		FROM leases l LEFT JOIN fences f ON f.resource = l.resource WHERE l.id = $1`, leaseID).
		Scan(append(r.dest(), &token, &drain, &res.Now, &current)...)
	if err != nil {
		return tokens.Lease{}, tokens.Resource{}, s.interpret("lease state", err)
	}
	lease := r.lease()
	if token == nil {
		return lease, tokens.Resource{}, tokens.Unavailable("lease state", errors.New("lease "+tokens.LeaseHint(leaseID)+" has no fence row"))
	}
	res.Name, res.Token = lease.Resource, *token
	if drain != nil && drain.After(res.Now) {
		res.DrainUntil = *drain
	}
	if current {
		res.Lease = &lease
	}
	return lease, res, nil
}

// Resource returns the fence state with the database clock in Now, or
// ErrNotFound if the resource was never granted (tokens.Store).
func (s *Store) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	var (
		res   tokens.Resource
		drain *time.Time
		id    *string
		r     leaseRow
		// the lease columns are NULL when fences.lease_id is
		resource, holder, owner *string
		token, ttlMS            *int64
		grantedAt, exp          *time.Time
	)
	err := s.pool.QueryRow(ctx, `
		SELECT f.token, f.drain_until, clock_timestamp(),
			l.id, l.resource, l.holder, l.token, l.ttl_ms, l.granted_at, l.expires_at, l.released_at, l.owner
		FROM fences f LEFT JOIN leases l ON l.id = f.lease_id
		WHERE f.resource = $1 AND f.token > 0`, name,
	).Scan(&res.Token, &drain, &res.Now, &id, &resource, &holder, &token, &ttlMS, &grantedAt, &exp, &r.releasedAt, &owner)
	if err != nil {
		return tokens.Resource{}, s.interpret("resource", err)
	}
	res.Name = name
	if drain != nil && drain.After(res.Now) {
		res.DrainUntil = *drain
	}
	if id != nil {
		r.id, r.resource, r.holder, r.token, r.ttlMS, r.grantedAt, r.expiresAt, r.owner = *id, *resource, *holder, *token, *ttlMS, *grantedAt, *exp, *owner
		l := r.lease()
		res.Lease = &l
	}
	return res, nil
}

// CurrentLeases returns up to limit live leases, soonest expiry first.
func (s *Store) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT `+leaseCols+` FROM leases l
		WHERE l.released_at IS NULL AND l.superseded_at IS NULL AND l.expires_at > clock_timestamp()
		ORDER BY l.expires_at LIMIT $1`, limit)
	if err != nil {
		return nil, s.interpret("current leases", err)
	}
	var r leaseRow
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tokens.Lease, error) {
		err := row.Scan(r.dest()...)
		return r.lease(), err
	})
	if err != nil {
		return nil, s.interpret("current leases", err)
	}
	return out, nil
}

// Drain keeps the resource closed to grants until now+d (database clock),
// or longer if it already was.
func (s *Store) Drain(ctx context.Context, resource string, d time.Duration) error {
	_, err := s.pool.Exec(ctx, `UPDATE fences
		SET drain_until = GREATEST(drain_until, clock_timestamp() + $2 * interval '1 millisecond')
		WHERE resource = $1`, resource, d.Milliseconds())
	return s.interpret("drain", err)
}

// Rejection page sizes: RejectionQuery.Limit 0 means DefaultRejections, and
// it is capped at MaxRejections (docs/design.md: limit <= 1000).
const (
	DefaultRejections = 100
	MaxRejections     = 1000
)

// Rejections lists the log newest first.
func (s *Store) Rejections(ctx context.Context, q tokens.RejectionQuery) ([]tokens.Rejection, error) {
	var where []string
	var args []any
	arg := func(v any) string { args = append(args, v); return "$" + strconv.Itoa(len(args)) }
	if q.Resource != "" {
		where = append(where, "resource = "+arg(q.Resource))
	}
	if !q.Since.IsZero() {
		where = append(where, "at >= "+arg(q.Since))
	}
	if q.Before > 0 {
		where = append(where, "id < "+arg(q.Before))
	}
	limit := q.Limit
	switch {
	case limit <= 0:
		limit = DefaultRejections
	case limit > MaxRejections:
		limit = MaxRejections
	}
	sql := `SELECT id, at, resource, code, token, current_token, holder, lease_hint, method, upstream, path, lease_ended_at, principal,
		would_refuse, trace_id, repeats, COALESCE(first_at, at) FROM rejections`
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY id DESC LIMIT " + arg(limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, s.interpret("rejections", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tokens.Rejection, error) {
		var r tokens.Rejection
		var ended *time.Time
		err := row.Scan(&r.ID, &r.At, &r.Resource, &r.Code, &r.Token, &r.CurrentToken, &r.Holder, &r.LeaseHint,
			&r.Method, &r.Upstream, &r.Path, &ended, &r.Principal, &r.WouldRefuse, &r.TraceID, &r.Repeats, &r.FirstAt)
		if ended != nil {
			r.LeaseEndedAt = *ended
		}
		return r, err
	})
	if err != nil {
		return nil, s.interpret("rejections", err)
	}
	return out, nil
}

// History lists a resource's lease events, newest first.
func (s *Store) History(ctx context.Context, resource string, limit int) ([]tokens.Event, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.pool.Query(ctx, `SELECT at, resource, kind, token, holder, expires_at, actor, idempotency
		FROM lease_events WHERE resource = $1 ORDER BY id DESC LIMIT $2`, resource, limit)
	if err != nil {
		return nil, s.interpret("history", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tokens.Event, error) {
		var e tokens.Event
		var kind string
		var exp *time.Time
		err := row.Scan(&e.At, &e.Resource, &kind, &e.Token, &e.Holder, &exp, &e.Actor, &e.Key)
		e.Kind = tokens.EventKind(kind)
		if exp != nil {
			e.ExpiresAt = *exp
		}
		return e, err
	})
	if err != nil {
		return nil, s.interpret("history", err)
	}
	return out, nil
}

// RecordEvent appends an event to a resource's lease history (the Redis
// mode records the renewals and releases that Redis refused).
func (s *Store) RecordEvent(ctx context.Context, e tokens.Event) error {
	var exp *time.Time
	if !e.ExpiresAt.IsZero() {
		exp = &e.ExpiresAt
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO lease_events (at, resource, kind, token, holder, expires_at, actor)
		VALUES (clock_timestamp(), $1, $2, $3, $4, $5, $6)`, e.Resource, string(e.Kind), e.Token, e.Holder, exp, e.Actor)
	return s.interpret("record event", err)
}
