package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/tokens"
)

// backend is one storage mode wired up: the store, the per-resource lock,
// and how live rejections travel between replicas.
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

func openBackend(ctx context.Context, cfg config, log *slog.Logger) (*backend, error) {
	if cfg.Postgres != "" {
		return openPostgres(ctx, cfg, log)
	}
	return openEmbedded(cfg, log)
}

// openEmbedded: one process, tokens and leases in a bbolt file.
func openEmbedded(cfg config, log *slog.Logger) (*backend, error) {
	if err := os.MkdirAll(cfg.Data, 0o750); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	store, err := bolt.Open(filepath.Join(cfg.Data, "fencegw.db"), bolt.Options{
		CrashDrain:            cfg.DrainPeriod,
		MaxIdempotencyRecords: cfg.IdempotencyMaxRecords,
		Logger:                log,
	})
	if err != nil {
		return nil, fmt.Errorf("open embedded store in %s: %w", cfg.Data, err)
	}
	// In one process the live feed needs no transport: OnRejection hands
	// each rejection straight to the gateway's subscribers.
	f := feed.NewLocal()
	return &backend{
		mode:   "embedded (" + filepath.Join(cfg.Data, "fencegw.db") + ")",
		store:  store,
		keys:   store,
		locker: tokens.NewLocalLocker(),
		feed:   f,
		close: func() {
			f.Close()
			if err := store.Close(); err != nil {
				log.Error("close store", "err", err)
			}
		},
	}, nil
}
