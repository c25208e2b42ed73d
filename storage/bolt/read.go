package bolt

// The reads of leases and resources (Lease, Resource, CurrentLeases), from
// the cache where it holds them.

import (
	"bytes"
	"context"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// Lease implements tokens.Store, from the cache when it holds the lease.
func (s *Store) Lease(ctx context.Context, leaseID string) (tokens.Lease, error) {
	if s.closed.Load() {
		return tokens.Lease{}, tokens.Unavailable("bolt", errClosed)
	}
	l, err := s.leaseByID(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	return *l, nil
}

// Resource implements tokens.Store, from the cache when it holds the
// resource. A resource that was only ever drained, never granted, is not
// found.
func (s *Store) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	if s.closed.Load() {
		return tokens.Resource{}, tokens.Unavailable("bolt", errClosed)
	}
	e, err := s.resourceEntry(ctx, name)
	if err != nil {
		return tokens.Resource{}, err
	}
	if e.st.token == 0 {
		return tokens.Resource{}, &tokens.Error{Kind: tokens.ErrNotFound, Resource: name, Detail: "never granted"}
	}
	r := tokens.Resource{Name: name, Token: e.st.token, DrainUntil: e.st.drainUntil, Now: s.now()}
	if e.lease != nil {
		c := *e.lease
		r.Lease = &c
	}
	return r, nil
}

// CurrentLeases implements tokens.Store from the live-lease index
// (bucketLive), soonest expiry first. limit <= 0 means 100; it is capped at
// 1000.
func (s *Store) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	limit = clampLimit(limit)
	now := s.now()
	var out []tokens.Lease
	err := s.db.View(func(tx *bbolt.Tx) error {
		// Past the entries that expired at or before now.
		c := tx.Bucket(bucketLive).Cursor()
		for k, v := c.Seek(liveTime(now.Add(1))); k != nil && len(out) < limit; k, v = c.Next() {
			id := string(v) // entries written before the index held no ids
			if id == "" && len(k) >= 8 {
				st, err := getResource(tx, string(k[8:]))
				if err != nil {
					return err
				}
				id = st.current
			}
			l, err := getLease(tx, id)
			if err != nil {
				return err
			}
			if l != nil && !bytes.Equal(liveKey(l), k) {
				l = nil // not this entry's lease (cannot happen, as below)
			}
			if l == nil {
				// Cannot happen (an entry goes with its lease's supersession
				// or release); were it to, listing is no fence decision, and
				// an entry pruned at its expiry is better than a 503 on
				// every acquire that counts leases.
				continue
			}
			st, err := getResource(tx, l.Resource)
			if err != nil {
				return err
			}
			if st.current == l.ID && st.token == l.Token && l.Live(now) {
				out = append(out, *l)
			}
		}
		return nil
	})
	if err != nil {
		return nil, tokens.Unavailable("current leases", err)
	}
	return out, nil
}
