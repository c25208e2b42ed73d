package postgres

import (
	"context"
	"errors"
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

// commitRejections inserts rs in one transaction, filling out.
func (s *Store) commitRejections(rs, out []tokens.Rejection) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.StatementTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for i, r := range rs {
			var ended, at *time.Time
			if !r.LeaseEndedAt.IsZero() {
				ended = &r.LeaseEndedAt
			}
			if !r.At.IsZero() {
				at = &r.At
			}
			b.Queue(`INSERT INTO rejections
				(resource, code, token, current_token, holder, lease_hint, method, upstream, path, lease_ended_at, at, principal, would_refuse, trace_id)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, clock_timestamp()), $12, $13, $14) RETURNING id, at`,
				r.Resource, r.Code, r.Token, r.CurrentToken, r.Holder, r.LeaseHint, r.Method, r.Upstream, r.Path, ended, at, r.Principal,
				r.WouldRefuse, r.TraceID,
			).QueryRow(func(row pgx.Row) error {
				out[i] = r
				return row.Scan(&out[i].ID, &out[i].At)
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
