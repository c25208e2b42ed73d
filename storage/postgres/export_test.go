package postgres

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ExclusiveFence takes resource's exclusive advisory lock as Fence.Exclusive
// does (the same call, with no orphan drain to start), returning the *Lock,
// whose Unlock reports a lock lost with its session.
func (s *Store) ExclusiveFence(ctx context.Context, resource string) (*Lock, error) {
	return s.exclusiveFence(ctx, resource, 0)
}

// LockPID is the backend pid of the session holding l.
func LockPID(l *Lock) uint32 { return l.conn.Conn().PgConn().PID() }

// Channel is the NOTIFY channel of s.
func (s *Store) Channel() string { return s.channel }

// Pool is s's query pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// LockKey is the advisory lock key of resource's lock in s's schema.
func (s *Store) LockKey(resource string) int64 { return s.lockKey("resource", resource) }
