package postgres

// The rejection log: RecordRejection's group commit, a repeat counted on
// the entry it repeats.

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/tokens"
)

// maxRejectionBatch bounds the rows one commit of the rejection log takes.
const maxRejectionBatch = 500

// rejectionGap is the shortest time between two commits of the rejection
// log: under a storm it commits at most ~50 times a second, each commit a
// WAL flush shared with the current holder's grants and writes. A lone
// rejection after a quiet spell is committed at once.
const rejectionGap = 20 * time.Millisecond

var errStoreClosed = errors.New("store closed")

// newRecorder starts the group commit of the rejection log
// (internal/batch). A storm of refused writes would otherwise cost one
// transaction (and one WAL flush) per refusal and occupy the query pool
// that the current holder's writes and the grants need. Callers still
// return only once their row is committed, so the log is
// read-your-writes; Close commits what is queued.
func newRecorder(s *Store) *batch.Batcher[tokens.Rejection, tokens.Rejection] {
	opts := batch.Options{Max: maxRejectionBatch, Queue: 4 * maxRejectionBatch, Gap: rejectionGap}
	return batch.New(opts, s.commitRejections)
}

// repeatLockClass is the first key of the transaction advisory locks that
// serialize the counting of one RepeatKey across replicas. The two-key form
// is a key space apart from the one-key locks of locker.go.
const repeatLockClass = 0x66677772 // "fgwr"

// The statement that records one rejection: the latest row with its
// RepeatKey (would_refuse included) counts it (repeats, at the last, first_at kept, the other
// fields the new refusal's), or else it is inserted. The caller holds the
// key's advisory lock, so two replicas never both miss the row and insert.
// first_at is NULL on an inserted row (as an older replica writes it) and
// read as at.
const recordRepeatSQL = `WITH prev AS (
		SELECT id FROM rejections
		WHERE resource = $1 AND lease_hint = $6 AND token = $3 AND code = $2 AND principal = $12 AND would_refuse = $14
		ORDER BY id DESC LIMIT 1
	), up AS (
		UPDATE rejections SET at = COALESCE($11, clock_timestamp()), current_token = $4, holder = $5,
			method = $7, upstream = $8, path = $9, lease_ended_at = $10,
			repeats = repeats + $13, first_at = COALESCE(first_at, at), trace_id = $15
		FROM prev WHERE rejections.id = prev.id
		RETURNING rejections.id, rejections.at, rejections.repeats, rejections.first_at
	), ins AS (
		INSERT INTO rejections
			(resource, code, token, current_token, holder, lease_hint, method, upstream, path, lease_ended_at, at, principal, repeats, would_refuse, trace_id)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, clock_timestamp()), $12, $13, $14, $15
		WHERE NOT EXISTS (SELECT 1 FROM up)
		RETURNING id, at, repeats, first_at
	)
	SELECT id, at, repeats, COALESCE(first_at, at) FROM up UNION ALL SELECT id, at, repeats, COALESCE(first_at, at) FROM ins`

const insertRejectionSQL = `INSERT INTO rejections
		(resource, code, token, current_token, holder, lease_hint, method, upstream, path, lease_ended_at, at, principal, repeats, would_refuse, trace_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, clock_timestamp()), $12, $13, $14, $15)
		RETURNING id, at, repeats, COALESCE(first_at, at)`

// commitRejections records rs in one transaction, filling out. It first
// takes the advisory locks of the batch's repeat keys, in one order, so
// that two replicas' batches cannot deadlock on them.
func (s *Store) commitRejections(rs, out []tokens.Rejection) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StatementTimeout)
	defer cancel()
	var keys []string
	for _, r := range rs {
		if k, ok := r.RepeatKey(); ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, k := range keys {
			b.Queue(`SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(repeatLockClass), k)
		}
		for i, r := range rs {
			var ended, at *time.Time
			if !r.LeaseEndedAt.IsZero() {
				ended = &r.LeaseEndedAt
			}
			if !r.At.IsZero() {
				at = &r.At
			}
			sql := insertRejectionSQL
			if _, ok := r.RepeatKey(); ok {
				sql = recordRepeatSQL
			}
			b.Queue(sql,
				r.Resource, r.Code, r.Token, r.CurrentToken, r.Holder, r.LeaseHint, r.Method, r.Upstream, r.Path, ended, at, r.Principal, max(r.Repeats, 1),
				r.WouldRefuse, r.TraceID,
			).QueryRow(func(row pgx.Row) error {
				out[i] = r
				return row.Scan(&out[i].ID, &out[i].At, &out[i].Repeats, &out[i].FirstAt)
			})
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return s.interpret("record rejection", err)
	}
	return nil
}

// RecordRejection appends to the rejection log. Its time is r.At if set
// (the gateway's moment of refusal), else the database clock. Concurrent
// calls are committed together (see recorder).
func (s *Store) RecordRejection(ctx context.Context, r tokens.Rejection) (tokens.Rejection, error) {
	out, err := s.recorder.Do(ctx, r)
	switch {
	case errors.Is(err, batch.ErrClosed):
		return tokens.Rejection{}, tokens.Unavailable("record rejection", errStoreClosed)
	case err != nil && errors.Is(err, ctx.Err()):
		// The row may still be committed; the caller only stops waiting.
		return tokens.Rejection{}, tokens.Unavailable("record rejection", err)
	}
	return out, err
}
