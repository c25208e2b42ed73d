package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/tokens"
)

// fanout carries rejections between replicas (PostgreSQL NOTIFY or Redis
// pub/sub).
type fanout interface {
	PublishRejections(ctx context.Context, rs []tokens.Rejection) error
	ListenRejections(ctx context.Context, fn func(tokens.Rejection)) error
}

// openPostgres: tokens, fences, leases and rejections in PostgreSQL (many
// replicas); with --redis, leases in Redis and the live feed over Redis.
// The per-resource lock is PostgreSQL's advisory lock in both cases, so a
// grant on any replica waits for writes in flight on every replica.
func openPostgres(ctx context.Context, cfg config, log *slog.Logger) (*backend, error) {
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pg, err := postgres.Open(openCtx, cfg.Postgres, postgres.Options{
		MaxConns:         cfg.PGMaxConns,
		MaxLockConns:     cfg.PGLockConns,
		StatementTimeout: cfg.PGStatementTimeout,
		LockTimeout:      cfg.PGLockTimeout,
		RestartDrain:     cfg.DrainPeriod,
		Schema:           cfg.PGSchema,
		Logger:           log,

		MaxIdempotencyRecords: int64(cfg.IdempotencyMaxRecords),
	})
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL: %w", err)
	}
	closePG := func() {
		if err := pg.Close(); err != nil {
			log.Error("close PostgreSQL store", "err", err)
		}
	}
	b := &backend{mode: "postgres", store: pg, keys: pg, close: closePG}
	feed := fanout(pg)
	var state postgres.StateReader // nil: PostgreSQL's own

	if cfg.Redis != "" {
		opt, err := goredis.ParseURL(cfg.Redis)
		if err != nil {
			closePG()
			return nil, usageError("--redis: %v", err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
		rdb := goredis.NewClient(opt)
		if err := rdb.Ping(openCtx).Err(); err != nil {
			rdb.Close()
			closePG()
			return nil, fmt.Errorf("connect to Redis: %w", err)
		}
		rs := redis.New(rdb, pg, redis.Options{Logger: log})
		b.mode, b.store, feed, state = "postgres+redis", rs, rs, rs
		b.close = func() {
			_ = rdb.Close()
			closePG()
		}
	}

	// Writes are admitted under fences this replica keeps across writes
	// (storage/postgres/fence.go). A replica that dies with a fence held
	// leaves its resources draining for the drain period plus the session
	// check: the longest a write it admitted after its session died can
	// still be on its way (tokens/service.go, point 6).
	check := cfg.PGSessionCheck
	if check <= 0 {
		check = postgres.DefaultSessionCheck
	}
	host, _ := os.Hostname()
	fence, err := pg.NewFence(openCtx, postgres.FenceOptions{
		Sessions:     cfg.PGFenceSessions,
		MaxFences:    cfg.PGMaxFences,
		SessionCheck: check,
		OrphanDrain:  cfg.DrainPeriod + check,
		Replica:      fmt.Sprintf("%s/%d", host, os.Getpid()),
		State:        state,
	})
	if err != nil {
		b.close()
		return nil, fmt.Errorf("start PostgreSQL fences: %w", err)
	}
	b.locker, b.fencer, b.onFree = fence, fence, fence.OnFree
	b.collectors = fenceMetrics(fence)
	closeFence := b.close
	b.close = func() {
		fence.Close()
		closeFence()
	}

	// Every replica, this one included, hears each rejection once through
	// the shared feed; publishing locally too would show it twice.
	pub := newPublisher(feed, log)
	b.publish = pub.publish
	closeStores := b.close
	b.close = func() {
		pub.close()
		closeStores()
	}
	b.subscribe = func(ctx context.Context, deliver func(tokens.Rejection)) error {
		go func() {
			if err := feed.ListenRejections(ctx, deliver); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("live rejection feed stopped", "err", err)
			}
		}()
		return nil
	}
	return b, nil
}

// publishQueue bounds the rejections waiting for the feed. The feed is best
// effort (the log is the record): past this, rejections are left out of
// the live feed rather than slow down the refusals.
const publishQueue = 10_000

// publisher sends this replica's rejections to the feed in batches
// (internal/batch): one loop publishes whatever is queued packed into as
// few messages as fit, so a storm of refusals costs the database (or
// Redis) a message per batch instead of a round trip per refusal, and no
// refusal waits for the feed.
type publisher struct {
	batch   *batch.Batcher[tokens.Rejection, struct{}]
	log     *slog.Logger
	dropped atomic.Int64
}

func newPublisher(feed fanout, log *slog.Logger) *publisher {
	opts := batch.Options{Max: 1000, Queue: publishQueue}
	return &publisher{log: log, batch: batch.New(opts, func(rs []tokens.Rejection, _ []struct{}) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := feed.PublishRejections(ctx, rs); err != nil {
			log.Warn("live rejection feed: publish failed (the rejections are recorded)", "rejections", len(rs), "err", err)
		}
		return nil
	})}
}

func (p *publisher) publish(r tokens.Rejection) {
	if !p.batch.Send(r) {
		if p.dropped.Add(1)%1000 == 1 {
			p.log.Warn("live rejection feed: queue full, rejections left out of the feed (they are recorded)", "dropped", p.dropped.Load())
		}
	}
}

// close stops the publisher after it has published what is queued.
func (p *publisher) close() { p.batch.Close() }

// fenceMetrics exports what the replica's fence does (storage/postgres/fence.go).
func fenceMetrics(f *postgres.Fence) []prometheus.Collector {
	st := f.Stats()
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fencegw_fences_held",
			Help: "Resources whose shared fence this replica holds in PostgreSQL (one advisory lock each)."},
			func() float64 { return float64(f.Held()) }),
		counter("fencegw_fence_local_admits_total", "Writes admitted on the replica's own fence, without a database round trip.", &st.LocalAdmits),
		counter("fencegw_fence_acquired_total", "Shared fences taken (one round trip each).", &st.Acquired),
		counter("fencegw_fence_yielded_total", "Shared fences given up (idle, ended, or another replica's grant, release or revoke).", &st.Yielded),
		counter("fencegw_fence_lost_total", "Fences dropped because their lock session died: their resources drain before the next grant.", &st.Lost),
	}
}
