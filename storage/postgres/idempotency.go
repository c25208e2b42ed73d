package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/tokens"
)

// Idempotency records (tokens.IdempotencyStore), in idempotency_keys
// (migration 00007). Each call is one autocommitted statement, so the
// record is durable when it returns; concurrent keyed writes on a replica
// run on the pool's connections, and their commits share WAL flushes as
// PostgreSQL groups concurrent commits. Time is the database's.
//
// The Redis mode keeps its records here too: they are durable facts, like
// rejections, and Redis is not a durable store.

// DefaultMaxIdempotencyRecords bounds the records kept (the oldest go
// first, at each prune).
const DefaultMaxIdempotencyRecords = 100_000

var _ tokens.IdempotencyStore = (*Store)(nil)

const keyCols = `attempt, fingerprint, state, token, started_at, deadline, completed_at, expires_at,
	status, header, body, body_omitted, clock_timestamp()`

func newInstance() string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// BeginKey implements tokens.IdempotencyStore: one INSERT that takes the
// scope if it is free or its record expired, and otherwise leaves the row
// as it is (then read by a second statement).
func (s *Store) BeginKey(ctx context.Context, b tokens.KeyBegin) (tokens.KeyRecord, bool, error) {
	sc := b.Scope
	for range 3 {
		rec := tokens.KeyRecord{Scope: sc, Attempt: b.Attempt, Fingerprint: b.Fingerprint, State: tokens.KeyInProgress, Token: b.Token}
		err := s.pool.QueryRow(ctx, `
			INSERT INTO idempotency_keys AS k
				(resource, upstream, principal, key, attempt, owner, fingerprint, state, token, started_at, deadline, expires_at)
			SELECT $1, $2, $3, $4, $5, $6, $7, 'in_progress', $8, t.now,
				t.now + $9::bigint * interval '1 microsecond', t.now + $10::bigint * interval '1 microsecond'
			FROM (SELECT clock_timestamp() AS now) t
			ON CONFLICT (resource, upstream, principal, key) DO UPDATE SET
				seq = EXCLUDED.seq, attempt = EXCLUDED.attempt, owner = EXCLUDED.owner,
				fingerprint = EXCLUDED.fingerprint, state = EXCLUDED.state, token = EXCLUDED.token,
				started_at = EXCLUDED.started_at, deadline = EXCLUDED.deadline, completed_at = NULL,
				expires_at = EXCLUDED.expires_at, status = NULL, header = NULL, body = NULL, body_omitted = false
				WHERE k.expires_at <= EXCLUDED.started_at
			RETURNING started_at, deadline, expires_at, started_at`,
			sc.Resource, sc.Upstream, sc.Principal, sc.Key, b.Attempt, s.instance, b.Fingerprint, b.Token,
			micros(b.InFlight), micros(b.Window),
		).Scan(&rec.StartedAt, &rec.Deadline, &rec.ExpiresAt, &rec.Now)
		if err == nil {
			return rec, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return tokens.KeyRecord{}, false, s.interpret("begin idempotency key", err)
		}
		// Taken and unexpired. Read it; it may have been dropped since,
		// then try again.
		rec, err = s.lookupKey(ctx, sc, false)
		if err == nil {
			return rec, false, s.recordKeyEvent(ctx, rec, b)
		}
		if !errors.Is(err, tokens.ErrNotFound) {
			return tokens.KeyRecord{}, false, err
		}
	}
	return tokens.KeyRecord{}, false, tokens.Unavailable("begin idempotency key", errors.New("the key's record kept changing"))
}

// FinishKey implements tokens.IdempotencyStore.
func (s *Store) FinishKey(ctx context.Context, sc tokens.KeyScope, attempt string, o tokens.KeyOutcome) error {
	var status *int
	var header map[string][]string
	var body []byte
	if o.State == tokens.KeyCompleted {
		status, header, body = &o.Status, o.Header, o.Body
	}
	_, err := s.pool.Exec(ctx, `
		UPDATE idempotency_keys SET state = $6, status = $7, header = $8, body = $9, body_omitted = $10,
			completed_at = clock_timestamp(), expires_at = clock_timestamp() + $11::bigint * interval '1 microsecond'
		WHERE resource = $1 AND upstream = $2 AND principal = $3 AND key = $4 AND attempt = $5 AND state = 'in_progress'`,
		sc.Resource, sc.Upstream, sc.Principal, sc.Key, attempt, string(o.State), status, header, body, o.BodyOmitted,
		micros(o.Window))
	return s.interpret("finish idempotency key", err)
}

// DropKey implements tokens.IdempotencyStore.
func (s *Store) DropKey(ctx context.Context, sc tokens.KeyScope, attempt string) error {
	_, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_keys
		WHERE resource = $1 AND upstream = $2 AND principal = $3 AND key = $4 AND attempt = $5 AND state = 'in_progress'`,
		sc.Resource, sc.Upstream, sc.Principal, sc.Key, attempt)
	return s.interpret("drop idempotency key", err)
}

// LookupKey implements tokens.IdempotencyStore.
func (s *Store) LookupKey(ctx context.Context, sc tokens.KeyScope) (tokens.KeyRecord, error) {
	return s.lookupKey(ctx, sc, true)
}

func (s *Store) lookupKey(ctx context.Context, sc tokens.KeyScope, unexpired bool) (tokens.KeyRecord, error) {
	rec := tokens.KeyRecord{Scope: sc}
	var state string
	var completed *time.Time
	var status *int32
	err := s.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM idempotency_keys
		WHERE resource = $1 AND upstream = $2 AND principal = $3 AND key = $4 AND (NOT $5 OR expires_at > clock_timestamp())`,
		sc.Resource, sc.Upstream, sc.Principal, sc.Key, unexpired,
	).Scan(&rec.Attempt, &rec.Fingerprint, &state, &rec.Token, &rec.StartedAt, &rec.Deadline, &completed, &rec.ExpiresAt,
		&status, &rec.Header, &rec.Body, &rec.BodyOmitted, &rec.Now)
	if err != nil {
		return tokens.KeyRecord{}, s.interpret("lookup idempotency key", err)
	}
	rec.State = tokens.KeyState(state)
	if completed != nil {
		rec.CompletedAt = *completed
	}
	if status != nil {
		rec.Status = int(*status)
	}
	return rec, nil
}

// keyEventGap spaces the commits of idempotency history events under
// load; a lone one is committed at once.
const keyEventGap = 5 * time.Millisecond

// newKeyEventRecorder starts the group commit of idempotency history events
// (a retry replayed or refused, tokens rule 8): many retries share one
// transaction and its WAL flush instead of one each, like the rejection
// log. Callers wait for their row, so the history is read-your-writes.
func newKeyEventRecorder(s *Store) *batch.Batcher[tokens.Event, struct{}] {
	return batch.New(batch.Options{Max: maxRejectionBatch, Gap: keyEventGap}, s.commitKeyEvents)
}

// recordKeyEvent appends the history event of a retry b that found rec,
// if it gets one.
func (s *Store) recordKeyEvent(ctx context.Context, rec tokens.KeyRecord, b tokens.KeyBegin) error {
	ev, ok := tokens.KeyHistoryEvent(rec, b, rec.Now)
	if !ok {
		return nil
	}
	_, err := s.keyEvents.Do(ctx, ev)
	switch {
	case errors.Is(err, batch.ErrClosed):
		return tokens.Unavailable("record idempotency event", errStoreClosed)
	case err != nil && errors.Is(err, ctx.Err()):
		return tokens.Unavailable("record idempotency event", err)
	}
	return err
}

// commitKeyEvents inserts evs in one transaction. The event's time is the
// database's at the lookup (Event.At).
func (s *Store) commitKeyEvents(evs []tokens.Event, _ []struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StatementTimeout)
	defer cancel()
	// One pipelined batch is one implicit transaction and one round trip
	// (BEGIN and COMMIT of their own would make it three).
	b := &pgx.Batch{}
	for _, e := range evs {
		b.Queue(`INSERT INTO lease_events (at, resource, kind, token, holder, actor, idempotency)
			VALUES ($1, $2, $3, $4, $5, '', $6)`, e.At, e.Resource, string(e.Kind), e.Token, e.Holder, e.Key)
	}
	err := s.pool.SendBatch(ctx, b).Close()
	return s.interpret("record idempotency event", err)
}

// closeKeys turns this process's records still in progress into unknown
// outcomes: after a clean shutdown none of its forwards is running, so a
// record it left in progress had no answer. The history events queued are
// committed first.
func (s *Store) closeKeys() error {
	s.keyEvents.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET state = 'unknown', completed_at = clock_timestamp()
		WHERE owner = $1 AND state = 'in_progress'`, s.instance)
	if err != nil {
		return fmt.Errorf("mark idempotency keys in flight as unknown (they turn unknown at their deadline): %w", err)
	}
	if tag.RowsAffected() > 0 {
		s.log.Warn("idempotency keys in flight at shutdown now answer outcome unknown", "keys", tag.RowsAffected())
	}
	return nil
}

// pruneKeys deletes expired records and, oldest first, those beyond
// MaxIdempotencyRecords (Prune calls it).
func (s *Store) pruneKeys(ctx context.Context, conn *pgxpool.Conn) (int64, error) {
	n, err := deleteChunks(ctx, conn, `DELETE FROM idempotency_keys WHERE seq IN
		(SELECT seq FROM idempotency_keys WHERE expires_at <= clock_timestamp() - $1::bigint * interval '1 microsecond' LIMIT $2)`, int64(0))
	if err != nil {
		return n, err
	}
	var excess int64
	if err := conn.QueryRow(ctx, `SELECT count(*) - $1 FROM idempotency_keys`, s.opts.MaxIdempotencyRecords).Scan(&excess); err != nil {
		return n, err
	}
	if excess > 0 {
		tag, err := conn.Exec(ctx, `DELETE FROM idempotency_keys WHERE seq IN
			(SELECT seq FROM idempotency_keys ORDER BY seq LIMIT $1)`, excess)
		if err != nil {
			return n, err
		}
		n += tag.RowsAffected()
	}
	return n, nil
}
