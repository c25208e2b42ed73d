package bolt

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
	defer unlock()
	var (
		lease   tokens.Lease
		st      resState
		refusal error
	)
	err = s.update("grant", func(tx *bbolt.Tx) error {
		refusal = nil
		now := s.now()
		cur, err := getResource(tx, req.Resource)
		if err != nil {
			return err
		}
		holder, err := getLease(tx, cur.current)
		if err != nil {
			return err
		}
		if holder != nil && holder.Token == cur.token && holder.Live(now) {
			refusal = &tokens.Error{Kind: tokens.ErrLeaseHeld, Resource: req.Resource, Holder: holder.Holder,
				CurrentToken: cur.token, ExpiresAt: holder.ExpiresAt, RetryAfter: holder.Remaining(now)}
			return nil
		}
		if now.Before(cur.drainUntil) {
			refusal = &tokens.Error{Kind: tokens.ErrFenceBusy, Resource: req.Resource, CurrentToken: cur.token,
				Detail: "draining: a write whose outcome is unknown may still land", RetryAfter: cur.drainUntil.Sub(now)}
			return nil
		}
		if tx.Bucket(bucketLeases).Get(leaseKey(req.LeaseID)) != nil {
			refusal = tokens.Invalid("lease_id", "already used")
			return nil
		}
		lease = tokens.Lease{ID: req.LeaseID, Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, Token: cur.token + 1,
			TTL: req.TTL, GrantedAt: now, ExpiresAt: now.Add(req.TTL)}
		st = resState{token: lease.Token, current: lease.ID, drainUntil: cur.drainUntil}
		if err := putLease(tx, &lease); err != nil {
			return err
		}
		if err := s.putResource(tx, req.Resource, &st); err != nil {
			return err
		}
		if err := unindexLive(tx, holder); err != nil {
			return err
		}
		if err := indexLive(tx, &lease); err != nil {
			return err
		}
		if err := pruneLive(tx, now); err != nil {
			return err
		}
		return s.addEvent(tx, event(tokens.EventGranted, now, &lease))
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	l := lease
	s.cache.set(req.Resource, st, &l)
	return lease, nil
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

// lockLeaseResource takes the per-resource mutation lock of the lease's
// resource: ErrNotFound for an unknown lease, ErrUnavailable once closed.
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
	defer unlock()
	var (
		lease   tokens.Lease
		st      resState
		refusal error
	)
	err = s.update("renew", func(tx *bbolt.Tx) error {
		refusal = nil
		now := s.now()
		l, err := getLease(tx, leaseID)
		if err != nil {
			return err
		}
		if l == nil {
			refusal = notFound()
			return nil
		}
		if st, err = getResource(tx, l.Resource); err != nil {
			return err
		}
		if st.current != l.ID || st.token != l.Token || !l.Live(now) {
			refusal = lost(l, st)
			return s.addEvent(tx, event(tokens.EventRenewRefused, now, l))
		}
		if err := unindexLive(tx, l); err != nil {
			return err
		}
		if ttl != 0 {
			l.TTL = ttl
		}
		l.ExpiresAt = now.Add(l.TTL)
		lease = *l
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
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	l := lease
	s.cache.set(l.Resource, st, &l)
	return lease, nil
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
	defer unlock()
	var (
		lease   tokens.Lease
		st      resState
		changed bool
		refusal error
	)
	err = s.update("release", func(tx *bbolt.Tx) error {
		refusal, changed = nil, false
		now := s.now()
		l, err := getLease(tx, leaseID)
		if err != nil {
			return err
		}
		if l == nil {
			refusal = notFound()
			return nil
		}
		lease = *l
		if l.Released() {
			return nil // idempotent: its holder already released it
		}
		if st, err = getResource(tx, l.Resource); err != nil {
			return err
		}
		if st.current != l.ID || st.token != l.Token || !l.Live(now) {
			refusal = lost(l, st)
			return s.addEvent(tx, event(tokens.EventReleaseRefused, now, l))
		}
		if err := unindexLive(tx, l); err != nil {
			return err
		}
		l.ReleasedAt = now
		lease, changed = *l, true
		if err := putLease(tx, l); err != nil {
			return err
		}
		ev := event(tokens.EventReleased, now, l)
		if revokedBy != "" {
			ev.Kind, ev.Actor = tokens.EventRevoked, revokedBy
		}
		return s.addEvent(tx, ev)
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	if changed {
		l := lease
		s.cache.set(l.Resource, st, &l)
	}
	return lease, nil
}

// Drain implements tokens.Store.
func (s *Store) Drain(ctx context.Context, resource string, d time.Duration) error {
	unlock, err := s.lockResource(ctx, resource)
	if err != nil {
		return err
	}
	defer unlock()
	var (
		st  resState
		cur *tokens.Lease
	)
	err = s.update("drain", func(tx *bbolt.Tx) error {
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
	})
	if err != nil {
		return err
	}
	s.cache.set(resource, st, cur)
	return nil
}
