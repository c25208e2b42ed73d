package postgres

import (
	"github.com/jackc/pgx/v5/pgxpool"
)

// LockPID is the backend pid of the session holding l.
func LockPID(l *Lock) uint32 { return l.conn.Conn().PgConn().PID() }

// Channel is the NOTIFY channel of s.
func (s *Store) Channel() string { return s.channel }

// Pool is s's query pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// LockKey is the advisory lock key of resource's lock in s's schema.
func (s *Store) LockKey(resource string) int64 { return s.lockKey("resource", resource) }
