package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/tokens"
)

// Live fan-out of rejections between replicas: each replica publishes the
// rejections it records (NOTIFY) and every replica listens (LISTEN), so each
// dashboard's live stream shows all of them. NOTIFY is transactional and
// best effort: a listener that is reconnecting misses what was sent
// meanwhile; the rejection log (Rejections) stays the record.

// maxNotifyPayload keeps a NOTIFY under PostgreSQL's 8000-byte limit.
const maxNotifyPayload = 7900

var _ feed.Transport = (*Store)(nil)

// PublishRejections sends rs to every replica's ListenRejections, packed
// into as few notifications as fit, in one transaction (so in order).
func (s *Store) PublishRejections(ctx context.Context, rs []tokens.Rejection) error {
	payloads, err := feed.EncodeRejections(rs, maxNotifyPayload)
	if err != nil {
		return tokens.Unavailable("encode rejection", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, p := range payloads {
			b.Queue("SELECT pg_notify($1, $2)", s.channel, string(p))
		}
		return tx.SendBatch(ctx, b).Close()
	})
	return s.interpret("notify", err)
}

// ListenRejections calls fn for every published rejection, from every
// replica, on a dedicated connection, and ready (if set) each time LISTEN
// is (again) in effect: what is published from then on arrives. It
// reconnects (with backoff, errors logged) until ctx is done, and then
// returns ctx.Err(); what is published while it reconnects is missed. fn
// runs on the listening goroutine: it must not block (feed.Transport).
func (s *Store) ListenRejections(ctx context.Context, fn func(tokens.Rejection), ready func()) error {
	backoff := 100 * time.Millisecond
	for {
		err := s.listenOnce(ctx, fn, ready, func() { backoff = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Error("rejection listener: reconnecting", "err", err, "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *Store) listenOnce(ctx context.Context, fn func(tokens.Rejection), ready, connected func()) error {
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["statement_timeout"] = "0"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return err
	}
	connected()
	if ready != nil {
		ready()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		rs, err := feed.DecodeRejections([]byte(n.Payload))
		if err != nil {
			s.log.Error("rejection listener: bad payload", "err", err)
		}
		for _, r := range rs {
			fn(r)
		}
	}
}
