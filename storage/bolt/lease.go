package bolt

// The changes of a lease: Grant, Renew, Release, Revoke and Drain, each one
// batched transaction (mutate) under the resource's lock.

import (
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/internal/failpoint"
	"github.com/fencegw/fencegw/tokens"
)

// Grant implements tokens.Store.
func (s *Store) Grant(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	if failpoint.NotDurable {
		return s.grantBeforeDurable(req)
	}
	unlock, err := s.lockResource(ctx, req.Resource)
	if err != nil {
		return tokens.Lease{}, err
	}
	// A grant whose caller is gone before it runs is not made: nobody
	// would hear of its lease, which would hold the resource for its TTL.
	return s.mutate(ctx, "grant", true, unlock, func(tx *bbolt.Tx, now time.Time, m *mutation) error {
		cur, known, err := findResource(tx, req.Resource)
		if err != nil {
			return err
		}
		holder, err := getLease(tx, cur.current)
		if err != nil {
			return err
		}
		if h := (tokens.Resource{Token: cur.token, Lease: holder}).Holder(now); h != nil {
			m.refusal = tokens.LeaseHeld(*h, h.Remaining(now))
			return nil
		}
		if now.Before(cur.drainUntil) {
			m.refusal = &tokens.Error{Kind: tokens.ErrFenceBusy, Resource: req.Resource, CurrentToken: cur.token,
				Detail: "draining: a write whose outcome is unknown may still land", RetryAfter: cur.drainUntil.Sub(now)}
			return nil
		}
		key := leaseKey(req.LeaseID) // packed once: for this check and the record
		if tx.Bucket(bucketLeases).Get(key) != nil {
			m.refusal = tokens.Invalid("lease_id", "already used")
			return nil
		}
		if err := pruneOwner(tx, req.Owner, now); err != nil {
			return err
		}
		if req.MaxLeases > 0 && req.Owner != "" {
			if n := countOwner(tx, req.Owner, now, req.MaxLeases); n >= req.MaxLeases {
				m.refusal = tokens.TooManyLeases(req.Resource, req.Owner, n)
				return nil
			}
		}
		m.lease = tokens.Lease{ID: req.LeaseID, Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, Token: cur.token + 1,
			TTL: req.TTL, GrantedAt: now, ExpiresAt: now.Add(req.TTL)}
		m.st = resState{token: m.lease.Token, current: m.lease.ID, drainUntil: cur.drainUntil}
		m.cached = true
		if err := putLeaseAt(tx, key, &m.lease); err != nil {
			return err
		}
		put := s.putResource
		if !known {
			put = s.putNewResource
		}
		if err := put(tx, req.Resource, &m.st); err != nil {
			return err
		}
		if err := unindexLive(tx, holder); err != nil {
			return err
		}
		if err := indexLive(tx, &m.lease); err != nil {
			return err
		}
		if err := pruneLive(tx, now); err != nil {
			return err
		}
		return s.addEvent(tx, event(tokens.EventGranted, now, &m.lease))
	})
}

// mutation is what one lease mutation's transaction decided: the lease it
// returns, or its refusal; and, if cached, the lease and its resource's
// state for the cache.
type mutation struct {
	lease   tokens.Lease
	st      resState
	cached  bool
	refusal error
}

// mutate runs fn in a batched update (update) under ctx and returns what
// it decided; unlock (the resource's lock, taken by lockResource) is given
// back once the transaction has ended, also when the caller gave up before
// (skipIfGone: then it is dropped if it has not run yet). bbolt may run fn
// more than once: each run starts from an empty mutation and its own now.
// The cache takes the lease only once the transaction has committed, under
// the lock, whether or not the caller still waits.
func (s *Store) mutate(ctx context.Context, op string, skipIfGone bool, unlock func(), fn func(tx *bbolt.Tx, now time.Time, m *mutation) error) (tokens.Lease, error) {
	var m mutation
	c := &call{fn: func(tx *bbolt.Tx) error {
		m = mutation{}
		return fn(tx, s.now(), &m)
	}}
	if skipIfGone {
		c.gone = ctx
	}
	err := s.update(ctx, op, c, func(err error) {
		if err == nil && m.refusal == nil && m.cached {
			l := m.lease
			s.cache.set(l.Resource, m.st, &l)
		}
		unlock()
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if m.refusal != nil {
		return tokens.Lease{}, m.refusal
	}
	return m.lease, nil
}

// lost is the ErrLeaseLost for l, given its resource's state.
func lost(l *tokens.Lease, st resState) error {
	why := "expired"
	switch {
	case st.current != l.ID || st.token != l.Token:
		why = "superseded by a newer grant"
	case l.Released():
		why = "released"
	}
	return &tokens.Error{Kind: tokens.ErrLeaseLost, Resource: l.Resource, Detail: why, Token: l.Token,
		CurrentToken: st.token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

func notFound() error {
	return &tokens.Error{Kind: tokens.ErrNotFound, Detail: "no such lease"}
}

// knownLease is lease leaseID; nil, with m.refusal set, if there is none.
func knownLease(tx *bbolt.Tx, leaseID string, m *mutation) (*tokens.Lease, error) {
	l, err := getLease(tx, leaseID)
	if err == nil && l == nil {
		m.refusal = notFound()
	}
	return l, err
}

// stillHeld reads the state of l's resource into m.st and tells whether l
// is still that resource's current live lease. If it is not, m.refusal is
// the ErrLeaseLost and the refused event is recorded.
func (s *Store) stillHeld(tx *bbolt.Tx, l *tokens.Lease, now time.Time, refused tokens.EventKind, m *mutation) (bool, error) {
	var err error
	if m.st, err = getResource(tx, l.Resource); err != nil {
		return false, err
	}
	if m.st.current == l.ID && m.st.token == l.Token && l.Live(now) {
		return true, nil
	}
	m.refusal = lost(l, m.st)
	return false, s.addEvent(tx, event(refused, now, l))
}

// lockLeaseResource takes the per-resource mutation lock of the lease's
// resource: ErrNotFound for an unknown lease, ErrStoreUnavailable once closed.
func (s *Store) lockLeaseResource(ctx context.Context, leaseID string) (func(), error) {
	l, err := s.leaseByID(ctx, leaseID)
	if err != nil {
		return nil, err
	}
	return s.lockResource(ctx, l.Resource)
}

// Renew implements tokens.Store.
func (s *Store) Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error) {
	unlock, err := s.lockLeaseResource(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	// A renewal whose caller is gone before it runs is not made: its
	// holder was told it failed.
	return s.mutate(ctx, "renew", true, unlock, func(tx *bbolt.Tx, now time.Time, m *mutation) error {
		l, err := knownLease(tx, leaseID, m)
		if l == nil {
			return err
		}
		if held, err := s.stillHeld(tx, l, now, tokens.EventRenewRefused, m); !held {
			return err
		}
		if err := unindexLive(tx, l); err != nil {
			return err
		}
		if ttl != 0 {
			l.TTL = ttl
		}
		l.ExpiresAt = now.Add(l.TTL)
		m.lease, m.cached = *l, true
		if err := putLease(tx, l); err != nil {
			return err
		}
		if err := indexLive(tx, l); err != nil {
			return err
		}
		if err := pruneLive(tx, now); err != nil {
			return err
		}
		return s.addEvent(tx, event(tokens.EventRenewed, now, l))
	})
}

// Release implements tokens.Store.
func (s *Store) Release(ctx context.Context, leaseID string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, "")
}

// Revoke implements tokens.Store: Release, recorded as revoked by by.
func (s *Store) Revoke(ctx context.Context, leaseID, by string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, by)
}

// release ends the lease; revokedBy, if set, names the administrator who
// ordered it.
func (s *Store) release(ctx context.Context, leaseID, revokedBy string) (tokens.Lease, error) {
	unlock, err := s.lockLeaseResource(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	// A release whose caller gave up still runs (it only ends a lease
	// early), but is reported as failed: its holder may release again.
	return s.mutate(ctx, "release", false, unlock, func(tx *bbolt.Tx, now time.Time, m *mutation) error {
		l, err := knownLease(tx, leaseID, m)
		if l == nil {
			return err
		}
		m.lease = *l
		if l.Released() {
			return nil // idempotent: its holder already released it
		}
		if held, err := s.stillHeld(tx, l, now, tokens.EventReleaseRefused, m); !held {
			return err
		}
		if err := unindexLive(tx, l); err != nil {
			return err
		}
		l.ReleasedAt = now
		m.lease, m.cached = *l, true
		if err := putLease(tx, l); err != nil {
			return err
		}
		ev := event(tokens.EventReleased, now, l)
		if revokedBy != "" {
			ev.Kind, ev.Actor = tokens.EventRevoked, revokedBy
		}
		return s.addEvent(tx, ev)
	})
}

// Drain implements tokens.Store. A drain whose caller gave up still runs
// (a drain recorded late only fences longer) but is reported as failed,
// with the error update gives; the resource's lock is held until it has
// committed, so no grant of the resource can be decided before it.
func (s *Store) Drain(ctx context.Context, resource string, d time.Duration) error {
	unlock, err := s.lockResource(ctx, resource)
	if err != nil {
		return err
	}
	var (
		st  resState
		cur *tokens.Lease
	)
	c := &call{fn: func(tx *bbolt.Tx) error {
		var err error
		if st, err = getResource(tx, resource); err != nil {
			return err
		}
		if cur, err = getLease(tx, st.current); err != nil {
			return err
		}
		until := s.now().Add(d)
		if !until.After(st.drainUntil) {
			return nil
		}
		st.drainUntil = until
		return s.putResource(tx, resource, &st)
	}}
	return s.update(ctx, "drain", c, func(err error) {
		if err == nil {
			s.cache.set(resource, st, cur)
		}
		unlock()
	})
}
