package postgres

// The lock sessions that hold a replica's shared fences, and their health
// checks (see the comment at the top of fence.go).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/tokens"
)

// lockSession is one long-lived connection holding shared fences.
type lockSession struct {
	f   *Fence
	idx int

	mu    sync.Mutex // serialises use of conn
	conn  *pgx.Conn
	pid   uint32
	start time.Time

	gen atomic.Uint64 // changes on each reconnect; 0 while disconnected
	// okAt: epoch offset (ns) at which the last successful check was sent.
	okAt atomic.Int64
	// settled is closed (and replaced) each time a health check settles,
	// confirming the session or destroying it: the proofs waiting on a
	// session not confirmed lately (heldRef.Check) look again then.
	settled atomic.Pointer[chan struct{}]
}

// settle wakes the proofs waiting for the session's next health check.
func (ls *lockSession) settle() {
	ch := make(chan struct{})
	close(*ls.settled.Swap(&ch))
}

// confirmed reports whether the session that took a fence of generation gen
// is still the one connected and was confirmed alive within SessionCheck.
func (ls *lockSession) confirmed(now time.Time, gen uint64) bool {
	if ls.gen.Load() != gen {
		return false
	}
	ok := ls.f.epoch.Add(time.Duration(ls.okAt.Load()))
	return now.Sub(ok) < ls.f.opts.SessionCheck
}

var sessionGen atomic.Uint64

func (ls *lockSession) connect(ctx context.Context) error {
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, ls.f.store.sessionConfig(ls.f.opts.Replica))
	if err != nil {
		return tokens.Unavailable("postgres lock session", err)
	}
	var pid uint32
	var start time.Time
	err = conn.QueryRow(cctx, `SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&pid, &start)
	if err != nil {
		_ = conn.Close(cctx)
		return tokens.Unavailable("postgres lock session", err)
	}
	ls.mu.Lock()
	ls.conn, ls.pid, ls.start = conn, pid, start
	ls.okAt.Store(int64(sent.Sub(ls.f.epoch)))
	ls.gen.Store(sessionGen.Add(1))
	ls.mu.Unlock()
	return nil
}

// fail destroys the session after an error: PostgreSQL frees its locks, its
// presence rows become orphans, and every fence on it is dropped (writes
// still in flight under them finish; the orphan rows make the next grant
// drain for them).
func (ls *lockSession) fail(gen uint64, err error) {
	ls.mu.Lock()
	if ls.gen.Load() != gen || ls.conn == nil {
		ls.mu.Unlock()
		return
	}
	conn := ls.conn
	ls.conn = nil
	ls.gen.Store(0)
	ls.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Close(ctx)
	cancel()
	ls.f.log.Error("fence lock session lost: its fences are dropped, and their resources drain before the next grant",
		"session", ls.idx, "err", err)
	f := ls.f
	f.mu.Lock()
	for _, hf := range f.byResource {
		if hf.sess == ls && hf.gen == gen && hf.status != fenceAcquiring {
			f.stats.Lost.Add(1)
			f.dropLocked(hf)
		}
	}
	f.mu.Unlock()
	ls.settle()
}

func (ls *lockSession) healthLoop() {
	defer ls.f.wg.Done()
	// Often: a session that died is noticed within one interval (fail
	// closed, guarantee 4), and a ping is cheap.
	every := ls.f.opts.SessionCheck / 10
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ls.f.stop:
			return
		case <-t.C:
		}
		if ls.gen.Load() == 0 {
			if err := ls.connect(context.Background()); err != nil {
				ls.f.log.Warn("fence lock session: reconnect failed", "session", ls.idx, "err", err)
			}
			continue
		}
		sent := time.Now()
		ls.mu.Lock()
		conn, gen := ls.conn, ls.gen.Load()
		var err error
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), sessionPingTimeout(ls.f.opts.SessionCheck))
			_, err = conn.Exec(ctx, "SELECT 1")
			cancel()
		}
		ls.mu.Unlock()
		if conn == nil {
			continue
		}
		if err != nil {
			ls.fail(gen, err)
			continue
		}
		ls.okAt.Store(int64(sent.Sub(ls.f.epoch)))
		ls.settle()
	}
}

// sessionPingTimeout is how long a health check may take before its session
// is destroyed. Longer than SessionCheck on purpose: admission already stops
// SessionCheck after the last check that succeeded (confirmed), whether or
// not the session is destroyed, so a slow answer costs nothing in safety; but
// destroying a session that is only slow (a CPU-starved replica, a busy
// database) drops every fence on it, and each of their resources then drains
// for OrphanDrain (the drain period plus SessionCheck) before its next grant.
// pgx closes a connection whose query times out, so keeping the session
// means waiting for the answer. A dead session answers with an error at once
// (a terminated backend, a reset connection), or, cut off, in this time.
func sessionPingTimeout(check time.Duration) time.Duration {
	return max(5*check, 5*time.Second)
}

// acquire tries hf's shared lock and records presence; it returns the
// session generation the lock was taken on, or 0 if the lock is not free.
func (ls *lockSession) acquire(ctx context.Context, hf *heldFence) (uint64, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	gen := ls.gen.Load()
	if ls.conn == nil || gen == 0 {
		return 0, tokens.Unavailable("postgres lock session", errors.New("reconnecting"))
	}
	var ok bool
	err := ls.conn.QueryRow(ctx, `
		WITH l AS (SELECT pg_try_advisory_lock_shared($1) AS ok),
		p AS (
			INSERT INTO fence_presence (resource, backend_pid, backend_start, replica)
			SELECT $2, $3, $4, $5 FROM l WHERE l.ok
			ON CONFLICT DO NOTHING
		)
		SELECT ok FROM l`, hf.key, hf.resource, ls.pid, ls.start, ls.f.opts.Replica).Scan(&ok)
	if err != nil {
		// The lock may have been granted before the error: only the
		// session's death makes sure it is not held.
		go ls.fail(gen, err)
		if ctx.Err() != nil {
			return 0, fmt.Errorf("fence %q: %w", hf.resource, ctx.Err())
		}
		return 0, tokens.Unavailable("postgres fence", err)
	}
	if !ok {
		return 0, nil
	}
	return gen, nil
}

// unlock gives hf's lock up and deletes its presence row.
func (ls *lockSession) unlock(hf *heldFence) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.conn == nil || ls.gen.Load() != hf.gen {
		return // the session is gone, and its locks with it
	}
	ctx, cancel := context.WithTimeout(context.Background(), ls.f.opts.SessionCheck)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(`DELETE FROM fence_presence WHERE resource = $1 AND backend_pid = $2 AND backend_start = $3`,
		hf.resource, ls.pid, ls.start)
	b.Queue(`SELECT pg_advisory_unlock_shared($1)`, hf.key)
	if err := ls.conn.SendBatch(ctx, b).Close(); err != nil {
		go ls.fail(hf.gen, err)
	}
}

func (ls *lockSession) close() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = ls.conn.Close(ctx)
		cancel()
		ls.conn = nil
	}
	ls.gen.Store(0)
}
