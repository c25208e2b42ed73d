package redis

import (
	"context"

	"github.com/fencegw/fencegw/tokens"
)

// ListenReady is ListenRejections calling ready whenever subscribed.
func (s *Store) ListenReady(ctx context.Context, fn func(tokens.Rejection), ready func()) error {
	return s.listen(ctx, fn, ready)
}

// LeaseKey is the Redis key of resource's claim.
func (s *Store) LeaseKey(resource string) string { return s.leaseKey(resource) }
