package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/tokens"
)

// fanout carries rejections between replicas (PostgreSQL NOTIFY or Redis
// pub/sub).
type fanout interface {
	PublishRejection(ctx context.Context, r tokens.Rejection) error
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
		Logger:           log,
	})
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL: %w", err)
	}
	b := &backend{mode: "postgres", store: pg, locker: pg, close: pg.Close}
	feed := fanout(pg)

	if cfg.Redis != "" {
		opt, err := goredis.ParseURL(cfg.Redis)
		if err != nil {
			pg.Close()
			return nil, usageError("--redis: %v", err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
		rdb := goredis.NewClient(opt)
		if err := rdb.Ping(openCtx).Err(); err != nil {
			rdb.Close()
			pg.Close()
			return nil, fmt.Errorf("connect to Redis: %w", err)
		}
		rs := redis.New(rdb, pg, redis.Options{Logger: log})
		b.mode, b.store, feed = "postgres+redis", rs, rs
		b.close = func() {
			_ = rdb.Close()
			pg.Close()
		}
	}

	// Every replica, this one included, hears each rejection once through
	// the shared feed; publishing locally too would show it twice.
	b.publish = func(r tokens.Rejection) {
		pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := feed.PublishRejection(pctx, r); err != nil {
			log.Warn("live rejection feed: publish failed (the rejection is recorded)", "err", err)
		}
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
