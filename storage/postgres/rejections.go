package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

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

// pendingRejection is a rejection waiting for the recorder's next commit.
type pendingRejection struct {
	r    tokens.Rejection
	done chan recorded // buffered: the recorder never waits for a caller
}

type recorded struct {
	r   tokens.Rejection
	err error
}

// recorder commits the rejection log in groups. A storm of refused writes
// would otherwise cost one transaction (and one WAL flush) per refusal and
// occupy the query pool that the current holder's writes and the grants
// need. One goroutine takes whatever is queued, up to maxRejectionBatch,
// and inserts it in one transaction; callers still return only once their
// row is committed, so the log is read-your-writes. While a batch
// commits, the next one gathers, so batches grow with the load and a lone
// rejection is never delayed by a timer beyond rejectionGap.
type recorder struct {
	s        *Store
	queue    chan pendingRejection
	stop     chan struct{}
	stopOnce sync.Once
	exited   chan struct{} // closed when run has returned
}

func newRecorder(s *Store) *recorder {
	rec := &recorder{s: s, queue: make(chan pendingRejection, 4*maxRejectionBatch), stop: make(chan struct{}), exited: make(chan struct{})}
	go rec.run()
	return rec
}

// close stops the recorder after it has committed what is queued.
func (rec *recorder) close() {
	rec.stopOnce.Do(func() { close(rec.stop) })
	<-rec.exited
}

func (rec *recorder) run() {
	defer close(rec.exited)
	batch := make([]pendingRejection, 0, maxRejectionBatch)
	var last time.Time
	for {
		select {
		case p := <-rec.queue:
			batch = append(batch[:0], p)
		case <-rec.stop:
			// Commit what callers already queued, then refuse new ones
			// (RecordRejection sees stop closed).
			for {
				select {
				case p := <-rec.queue:
					rec.commit([]pendingRejection{p})
				default:
					return
				}
			}
		}
		if wait := time.Until(last.Add(rejectionGap)); wait > 0 {
			time.Sleep(wait) // more gather meanwhile
		}
		last = time.Now()
	gather:
		for len(batch) < maxRejectionBatch {
			select {
			case p := <-rec.queue:
				batch = append(batch, p)
			default:
				break gather
			}
		}
		rec.commit(batch)
	}
}

// commit inserts batch in one transaction and answers every caller.
func (rec *recorder) commit(batch []pendingRejection) {
	ctx, cancel := context.WithTimeout(context.Background(), rec.s.opts.StatementTimeout)
	defer cancel()
	out := make([]tokens.Rejection, len(batch))
	err := pgx.BeginFunc(ctx, rec.s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for i, p := range batch {
			r := p.r
			var ended, at *time.Time
			if !r.LeaseEndedAt.IsZero() {
				ended = &r.LeaseEndedAt
			}
			if !r.At.IsZero() {
				at = &r.At
			}
			b.Queue(`INSERT INTO rejections
				(resource, code, token, current_token, holder, lease_hint, method, upstream, path, lease_ended_at, at, principal)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, clock_timestamp()), $12) RETURNING id, at`,
				r.Resource, r.Code, r.Token, r.CurrentToken, r.Holder, r.LeaseHint, r.Method, r.Upstream, r.Path, ended, at, r.Principal,
			).QueryRow(func(row pgx.Row) error {
				out[i] = r
				return row.Scan(&out[i].ID, &out[i].At)
			})
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		err = interpret("record rejection", err)
	}
	for i, p := range batch {
		p.done <- recorded{r: out[i], err: err}
	}
}

// RecordRejection appends to the rejection log. Its time is r.At if set
// (the gateway's moment of refusal), else the database clock. Concurrent
// calls are committed together (see recorder).
func (s *Store) RecordRejection(ctx context.Context, r tokens.Rejection) (tokens.Rejection, error) {
	p := pendingRejection{r: r, done: make(chan recorded, 1)}
	select {
	case <-s.recorder.stop:
		return tokens.Rejection{}, tokens.Unavailable("record rejection", errStoreClosed)
	default:
	}
	select {
	case s.recorder.queue <- p:
	case <-s.recorder.stop:
		return tokens.Rejection{}, tokens.Unavailable("record rejection", errStoreClosed)
	case <-ctx.Done():
		return tokens.Rejection{}, tokens.Unavailable("record rejection", ctx.Err())
	}
	select {
	case res := <-p.done:
		return res.r, res.err
	case <-s.recorder.exited:
		// Queued after the recorder's last look at the queue: never written.
		select {
		case res := <-p.done:
			return res.r, res.err
		default:
			return tokens.Rejection{}, tokens.Unavailable("record rejection", errStoreClosed)
		}
	case <-ctx.Done():
		// The row may still be committed; the caller only stops waiting.
		return tokens.Rejection{}, tokens.Unavailable("record rejection", ctx.Err())
	}
}
