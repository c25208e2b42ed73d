package bolt

import (
	"cmp"
	"context"
	"slices"

	"github.com/fencegw/fencegw/tokens"
)

// Lease implements tokens.Store from the cache, without touching the file.
func (s *Store) Lease(ctx context.Context, leaseID string) (tokens.Lease, error) {
	if s.closed.Load() {
		return tokens.Lease{}, tokens.Unavailable("bolt", errClosed)
	}
	s.mu.RLock()
	l, ok := s.leases[leaseID]
	var out tokens.Lease
	if ok {
		out = *l
	}
	s.mu.RUnlock()
	if !ok {
		return tokens.Lease{}, notFound()
	}
	return out, nil
}

// Resource implements tokens.Store from the cache, without touching the
// file. A resource that was only ever drained, never granted, is not found.
func (s *Store) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	if s.closed.Load() {
		return tokens.Resource{}, tokens.Unavailable("bolt", errClosed)
	}
	r := tokens.Resource{Name: name}
	s.mu.RLock()
	st, ok := s.resources[name]
	if ok && st.token > 0 {
		r.Token, r.DrainUntil = st.token, st.drainUntil
		if l, ok := s.leases[st.current]; ok {
			c := *l
			r.Lease = &c
		}
	}
	s.mu.RUnlock()
	if r.Token == 0 {
		return tokens.Resource{}, &tokens.Error{Kind: tokens.ErrNotFound, Resource: name, Detail: "never granted"}
	}
	r.Now = s.now()
	return r, nil
}

// CurrentLeases implements tokens.Store from the cache. limit <= 0 means
// 100; it is capped at 1000.
func (s *Store) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	if s.closed.Load() {
		return nil, tokens.Unavailable("bolt", errClosed)
	}
	limit = clampLimit(limit)
	now := s.now()
	var out []tokens.Lease
	s.mu.RLock()
	for _, st := range s.resources {
		if l, ok := s.leases[st.current]; ok && l.Token == st.token && l.Live(now) {
			out = append(out, *l)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b tokens.Lease) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Resource, b.Resource))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
