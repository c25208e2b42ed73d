package bolt

// The grant of the broken build failpoint.NotDurable.

import (
	"context"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// grantBeforeDurable is Grant as failpoint.NotDurable breaks it: the grant
// is decided on the cache, made visible and returned at once (so writes
// under it are forwarded), and committed to the file only a little later.
// A crash in between loses a token that a worker already holds and used.
func (s *Store) grantBeforeDurable(req tokens.GrantRequest) (tokens.Lease, error) {
	now := s.now()
	e, err := s.resourceEntry(context.Background(), req.Resource)
	if err != nil {
		return tokens.Lease{}, err
	}
	cur := e.st
	if h := (tokens.Resource{Token: cur.token, Lease: e.lease}).Holder(now); h != nil {
		return tokens.Lease{}, tokens.LeaseHeld(*h, h.Remaining(now))
	}
	if now.Before(cur.drainUntil) {
		return tokens.Lease{}, &tokens.Error{Kind: tokens.ErrFenceBusy, Resource: req.Resource, CurrentToken: cur.token,
			RetryAfter: cur.drainUntil.Sub(now)}
	}
	lease := tokens.Lease{ID: req.LeaseID, Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, Token: cur.token + 1,
		TTL: req.TTL, GrantedAt: now, ExpiresAt: now.Add(req.TTL)}
	st := resState{token: lease.Token, current: lease.ID, drainUntil: cur.drainUntil}
	s.cache.set(req.Resource, st, &lease)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = s.update(context.Background(), "grant", &call{fn: func(tx *bbolt.Tx) error {
			if err := putLease(tx, &lease); err != nil {
				return err
			}
			return s.putResource(tx, req.Resource, &st)
		}}, nil)
	}()
	return lease, nil
}
