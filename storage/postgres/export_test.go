package postgres

import (
	"context"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegw/fencegw/tokens"
)

// LockPID is the backend pid of the session holding l.
func LockPID(l *Lock) uint32 { return l.conn.Conn().PgConn().PID() }

// ListenReady is ListenRejections calling ready whenever LISTEN is in effect.
func (s *Store) ListenReady(ctx context.Context, fn func(tokens.Rejection), ready func()) error {
	return s.listen(ctx, fn, ready)
}

// Channel is the NOTIFY channel of s.
func (s *Store) Channel() string { return s.channel }

// Pool is s's query pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }
