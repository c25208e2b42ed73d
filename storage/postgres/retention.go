package postgres

// Retention: the bounds of the rejection log, the history and ended leases,
// and the pruning pass that keeps them.

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention defaults, the same bounds as the embedded store's.
const (
	DefaultMaxRejectionLog       = 1_000_000
	DefaultMaxHistoryPerResource = 1000
	DefaultLeaseRetention        = 24 * time.Hour
	DefaultPruneInterval         = time.Minute
)

// pruneChunk bounds the rows one DELETE takes, so that pruning a large
// backlog never holds locks or bloats one transaction for long.
const pruneChunk = 10_000

// Pruned counts what one Prune deleted.
type Pruned struct {
	Rejections int64
	Events     int64
	Leases     int64
	Keys       int64 // idempotency records
	// WriteCounts: per-token write counts whose lease was deleted.
	WriteCounts int64
}

// pruneLoop runs Prune every PruneInterval until Close.
func (s *Store) pruneLoop() {
	defer close(s.pruneDone)
	t := time.NewTicker(s.opts.PruneInterval)
	defer t.Stop()
	for {
		select {
		case <-s.pruneStop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.PruneInterval)
		p, err := s.Prune(ctx)
		cancel()
		switch {
		case err != nil:
			s.log.Error("postgres retention", "err", err)
		case p != Pruned{}:
			s.log.Info("postgres retention", "rejections", p.Rejections, "events", p.Events, "leases", p.Leases, "idempotency_keys", p.Keys)
		}
	}
}

// Prune applies the retention bounds: the rejection log keeps its newest
// MaxRejectionLog entries, each resource's lease history its newest
// MaxHistoryPerResource events, and a lease that is not its resource's
// current one is deleted once its expiry is LeaseRetention past (its id is
// unknown from then on, as in the embedded store), and with it its
// token's write count. Fences are never
// touched: tokens stay monotonic whatever is pruned. Replicas take turns:
// while one prunes, Prune on another returns at once.
func (s *Store) Prune(ctx context.Context) (Pruned, error) {
	var p Pruned
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return p, s.interpret("prune", err)
	}
	defer conn.Release()
	key := s.lockKey("retention", "")
	var mine bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&mine); err != nil {
		return p, s.interpret("prune", err)
	}
	if !mine {
		return p, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
			// A pooled session must not keep the lock: drop the connection.
			_ = conn.Conn().Close(uctx)
		}
	}()

	var cut int64
	if err := conn.QueryRow(ctx, `SELECT COALESCE(max(id), 0) - $1 FROM rejections`, s.opts.MaxRejectionLog).Scan(&cut); err != nil {
		return p, s.interpret("prune rejections", err)
	}
	if cut > 0 {
		n, err := deleteChunks(ctx, conn, `DELETE FROM rejections WHERE id IN
			(SELECT id FROM rejections WHERE id <= $1 ORDER BY id LIMIT $2)`, cut)
		p.Rejections = n
		if err != nil {
			return p, s.interpret("prune rejections", err)
		}
	}

	// Only resources with events since the last pass can have grown past
	// the cap.
	s.pruneMu.Lock()
	after := s.prunedEvents
	s.pruneMu.Unlock()
	var touched []string
	var last int64
	if err := conn.QueryRow(ctx, `SELECT COALESCE(array_agg(DISTINCT resource), '{}'), COALESCE(max(id), $1)
		FROM lease_events WHERE id > $1`, after).Scan(&touched, &last); err != nil {
		return p, s.interpret("prune history", err)
	}
	for len(touched) > 0 {
		chunk := touched[:min(len(touched), 500)]
		touched = touched[len(chunk):]
		tag, err := conn.Exec(ctx, `DELETE FROM lease_events e USING (
				SELECT r.resource, (SELECT id FROM lease_events
					WHERE resource = r.resource ORDER BY id DESC OFFSET $2 - 1 LIMIT 1) AS oldest_kept
				FROM unnest($1::text[]) AS r(resource)) k
			WHERE e.resource = k.resource AND e.id < k.oldest_kept`, chunk, s.opts.MaxHistoryPerResource)
		if err != nil {
			return p, s.interpret("prune history", err)
		}
		p.Events += tag.RowsAffected()
	}
	s.pruneMu.Lock()
	s.prunedEvents = last
	s.pruneMu.Unlock()

	n, err := deleteChunks(ctx, conn, `DELETE FROM leases WHERE id IN
		(SELECT l.id FROM leases l
		 WHERE l.expires_at < clock_timestamp() - $1 * interval '1 millisecond'
		   AND NOT EXISTS (SELECT 1 FROM fences f WHERE f.resource = l.resource AND f.lease_id = l.id)
		 LIMIT $2)`, s.opts.LeaseRetention.Milliseconds())
	p.Leases = n
	if err != nil {
		return p, s.interpret("prune leases", err)
	}
	// A token's write count goes with its lease (leases' UNIQUE (resource,
	// token) index answers the anti-join).
	n, err = deleteChunks(ctx, conn, `DELETE FROM write_counts WHERE (resource, token) IN
		(SELECT w.resource, w.token FROM write_counts w
		 WHERE $1::int = 0 AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.resource = w.resource AND l.token = w.token)
		 LIMIT $2)`, 0)
	p.WriteCounts = n
	if err != nil {
		return p, s.interpret("prune write counts", err)
	}
	p.Keys, err = s.pruneKeys(ctx, conn)
	if err != nil {
		return p, s.interpret("prune idempotency keys", err)
	}
	return p, nil
}

// deleteChunks runs a DELETE whose second parameter is the chunk size
// until it deletes less than a chunk.
func deleteChunks(ctx context.Context, conn *pgxpool.Conn, sql string, arg any) (int64, error) {
	var total int64
	for {
		tag, err := conn.Exec(ctx, sql, arg, pruneChunk)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneChunk {
			return total, nil
		}
	}
}
