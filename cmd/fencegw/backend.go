package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/tokens"
)

// backend is one storage mode wired up (storage/mode), with the metrics
// serve registers for it.
type backend struct {
	mode   string
	store  tokens.Store
	locker tokens.Locker
	fencer tokens.Fencer // nil: writes lock per write (embedded mode)
	// keys keeps Idempotency-Key records: the bolt file, or PostgreSQL
	// (also in the Redis mode: Redis is not durable).
	keys tokens.IdempotencyStore
	// onFree, if set, registers a func to call with each resource freed on
	// any replica (waiting acquires are woken with it).
	onFree func(func(resource string))
	// collectors are the backend's own metrics, registered by serve.
	collectors []prometheus.Collector
	// feed carries each recorded rejection to every replica's live stream
	// (storage/feed); close closes it first.
	feed  feed.Feed
	close func()
}

// openBackend opens the storage mode the flags name; cmd only maps its
// configuration and exports its metrics.
func openBackend(ctx context.Context, cfg config, log *slog.Logger) (*backend, error) {
	m, err := mode.Open(ctx, mode.Config{
		Data:                  cfg.Data,
		Postgres:              cfg.Postgres,
		Redis:                 cfg.Redis,
		DrainPeriod:           cfg.DrainPeriod,
		IdempotencyMaxRecords: cfg.IdempotencyMaxRecords,
		Schema:                cfg.PGSchema,
		RedisPrefix:           cfg.RedisPrefix,
		MaxConns:              cfg.PGMaxConns,
		LockConns:             cfg.PGLockConns,
		StatementTimeout:      cfg.PGStatementTimeout,
		LockTimeout:           cfg.PGLockTimeout,
		SessionCheck:          cfg.PGSessionCheck,
		FenceSessions:         cfg.PGFenceSessions,
		MaxFences:             cfg.PGMaxFences,
		Logger:                log,
	})
	if ce := (*mode.ConfigError)(nil); errors.As(err, &ce) {
		return nil, cfg.src.bad(ce.Field, "%v", ce.Err)
	}
	if err != nil {
		return nil, storeError(err, cfg) // storeerrors.go
	}
	b := &backend{mode: m.Name, store: m.Store, locker: m.Locker, fencer: m.Fencer, keys: m.Keys, feed: m.Feed, close: m.Close,
		collectors: m.Collectors}
	if m.Fence != nil {
		b.onFree = m.OnFree
		b.collectors = append(b.collectors, fenceMetrics(m.Fence)...)
	}
	return b, nil
}
