package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/redis"
)

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
	transport := feed.Transport(pg)
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
		b.mode, b.store, transport, state = "postgres+redis", rs, rs, rs
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
	// the transport (storage/feed).
	b.feed = feed.NewReplicated(transport, feed.Options{Logger: log})
	closeStores := b.close
	b.close = func() {
		b.feed.Close()
		closeStores()
	}
	return b, nil
}

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
