// Package mode builds a storage mode: the store and everything a gateway
// runs on it (the per-resource lock, the fencer, where Idempotency-Key
// records live, the live rejection feed, the wake-up of waiting acquires,
// the store's metrics). It is the one package that imports the storage
// backends: package replica opens a mode here for cmd/fencegw, its demo,
// the benchmarks and the end-to-end tests, so that each is wired one way;
// a new mode is one constructor.
package mode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/bolt"
	"github.com/fencegw/fencegw/storage/feed"
	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/tokens"
)

// Config says which mode to open and how. Zero values take the stores'
// defaults.
type Config struct {
	// Data is the embedded mode's directory (created if missing); used
	// when Postgres is empty.
	Data string
	// Postgres is the PostgreSQL URL of the replicated modes; Redis, if
	// set too, moves leases and the live feed to Redis.
	Postgres, Redis string
	// DrainPeriod is how long a resource stays closed after a write whose
	// outcome is unknown (tokens.DefaultDrainPeriod if zero); the crash
	// and orphan drains derive from it.
	DrainPeriod time.Duration
	// IdempotencyMaxRecords bounds the stored Idempotency-Key records.
	IdempotencyMaxRecords int

	// The PostgreSQL modes (see postgres.Options and postgres.FenceOptions).
	Schema                        string
	MaxConns, LockConns           int32
	StatementTimeout, LockTimeout time.Duration
	SessionCheck                  time.Duration // postgres.DefaultSessionCheck if zero
	FenceSessions, MaxFences      int
	// Replica names this process in the fence's presence rows (host/pid
	// if empty).
	Replica string
	// RedisPrefix starts every Redis key and channel (if empty,
	// redis.SchemaPrefix(Schema): two deployments in two schemas share
	// nothing in one Redis database).
	RedisPrefix string

	Logger *slog.Logger
}

// Mode is one storage mode opened: what tokens.Config, the idempotency
// records and the live feed are built from.
type Mode struct {
	// Name is shown in the start banner: "embedded (path)", "postgres",
	// "postgres+redis".
	Name  string
	Store tokens.Store
	// Exactly one of Locker and Fencer is set, as tokens.Config wants:
	// Locker in the embedded mode, which locks per write; Fencer (the
	// PostgreSQL fence, which also takes the exclusive lock of grants,
	// releases and revokes) in the PostgreSQL modes.
	Locker tokens.Locker
	Fencer tokens.Fencer
	// Keys keeps Idempotency-Key records: the bolt file, or PostgreSQL
	// (also in the Redis mode: Redis is not durable).
	Keys tokens.IdempotencyStore
	// Feed carries each recorded rejection to every replica's live stream.
	Feed feed.Feed
	// Rates holds the API keys' request budgets that every replica shares
	// (gateway.RateStore): PostgreSQL's, or Redis's in the Redis mode. Nil
	// in the embedded mode, whose one process meters keys exactly itself.
	Rates interface {
		Take(ctx context.Context, key string, rate float64, burst int) (ok bool, retryAfter time.Duration, err error)
	}
	// Collectors are the store's own metrics (the embedded store's commit
	// durations, the PostgreSQL fence's admits and yields), for the
	// gateway's registry.
	Collectors []prometheus.Collector

	fence   *postgres.Fence // behind Fencer; nil in the embedded mode
	closers []func()
}

// OnFree registers wake, the tokens.Service's Wake, to be called with each
// resource freed on another replica. A no-op in the embedded mode, where
// every release goes through the one Service.
func (m *Mode) OnFree(wake func(resource string)) {
	if m.fence != nil {
		m.fence.OnFree(wake)
	}
}

// Close closes the feed, the fence and the stores, in that order.
func (m *Mode) Close() {
	for i := len(m.closers) - 1; i >= 0; i-- {
		m.closers[i]()
	}
	m.closers = nil
}

// Open opens the mode cfg names: PostgreSQL (with Redis) if cfg.Postgres
// is set, else the embedded store in cfg.Data. A bad value in cfg is a
// *ConfigError, a store that is unreachable or in use a *StoreError
// (errors.go).
func Open(ctx context.Context, cfg Config) (*Mode, error) {
	if cfg.Postgres != "" {
		return OpenPostgres(ctx, cfg)
	}
	return OpenEmbedded(cfg)
}

func (cfg *Config) defaults() {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DrainPeriod <= 0 {
		cfg.DrainPeriod = tokens.DefaultDrainPeriod
	}
	if cfg.SessionCheck <= 0 {
		cfg.SessionCheck = postgres.DefaultSessionCheck
	}
}

// OpenEmbedded opens the embedded mode: one process, tokens, leases and
// rejections in a bbolt file in cfg.Data.
func OpenEmbedded(cfg Config) (_ *Mode, err error) {
	cfg.defaults()
	defer func() {
		if err != nil {
			err = classify(err, cfg)
		}
	}()
	if err := os.MkdirAll(cfg.Data, 0o750); err != nil {
		cause := err.Error()
		var pe *os.PathError
		if errors.As(err, &pe) {
			cause = pe.Err.Error() // "permission denied"
			if pe.Path != cfg.Data {
				cause = pe.Op + " " + pe.Path + ": " + cause // a parent's
			}
		}
		return nil, &StoreError{Store: "data", Failure: NoDirectory, Where: cfg.Data, Cause: cause, Err: err}
	}
	path := filepath.Join(cfg.Data, "fencegw.db")
	// Every fenced write holds its resource's shared lock until it is done
	// or its drain is recorded: the store closed while any is held is not
	// marked clean, so that the next open drains as after a crash.
	locker := tokens.NewLocalLocker()
	store, err := bolt.Open(path, bolt.Options{
		CrashDrain:            cfg.DrainPeriod,
		MaxIdempotencyRecords: cfg.IdempotencyMaxRecords,
		Logger:                cfg.Logger,
		InFlight:              locker.HeldShared,
	})
	if err != nil {
		return nil, fmt.Errorf("open embedded store in %s: %w", cfg.Data, err)
	}
	// In one process the live feed needs no transport: OnRejection hands
	// each rejection straight to the gateway's subscribers.
	f := feed.NewLocal()
	log := cfg.Logger
	return &Mode{
		Name:       "embedded (" + path + ")",
		Store:      store,
		Keys:       store,
		Locker:     locker,
		Feed:       f,
		Collectors: store.Collectors(),
		closers: []func(){func() {
			if err := store.Close(); err != nil {
				log.Error("close store", "err", err)
			}
		}, f.Close},
	}, nil
}

// OpenPostgres opens a PostgreSQL mode: tokens, fences, leases and
// rejections in PostgreSQL (many replicas); with cfg.Redis, leases in Redis
// and the live feed over Redis. Writes are admitted under fences this
// replica keeps across writes (storage/postgres/fence.go), so a grant on
// any replica waits for writes in flight on every replica.
func OpenPostgres(ctx context.Context, cfg Config) (_ *Mode, err error) {
	cfg.defaults()
	log := cfg.Logger
	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m := &Mode{Name: "postgres"}
	defer func() {
		if err != nil {
			m.Close()
			err = classify(err, cfg)
		}
	}()
	pg, err := postgres.Open(openCtx, cfg.Postgres, postgres.Options{
		MaxConns:         cfg.MaxConns,
		MaxLockConns:     cfg.LockConns,
		StatementTimeout: cfg.StatementTimeout,
		LockTimeout:      cfg.LockTimeout,
		RestartDrain:     cfg.DrainPeriod,
		Schema:           cfg.Schema,
		Logger:           log,

		MaxIdempotencyRecords: int64(cfg.IdempotencyMaxRecords),
	})
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL: %w", err)
	}
	m.closers = append(m.closers, func() {
		if err := pg.Close(); err != nil {
			log.Error("close PostgreSQL store", "err", err)
		}
	})
	m.Store, m.Keys, m.Rates = pg, pg, pg
	transport := feed.Transport(pg)
	var state postgres.StateReader // nil: PostgreSQL's own

	if cfg.Redis != "" {
		opt, err := goredis.ParseURL(cfg.Redis)
		if err != nil {
			return nil, &ConfigError{Field: "redis", Err: err}
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
		// One dial per attempt and one retry (a pooled connection Redis
		// broke, after a restart): go-redis's defaults (5 dials, 3
		// retries) kept a grant on a replica cut from Redis (packets
		// dropped, so every dial waits out DialTimeout) for over 30 s
		// before its 503; with these it is 4 s, two dial timeouts (cmd
		// TestFaultReplicaPartitionedFromRedis).
		opt.DialerRetries, opt.MaxRetries = 1, 1
		rdb := goredis.NewClient(opt)
		m.closers = append(m.closers, func() { _ = rdb.Close() })
		if err := rdb.Ping(openCtx).Err(); err != nil {
			return nil, fmt.Errorf("connect to Redis: %w", err)
		}
		prefix := cfg.RedisPrefix
		if prefix == "" {
			prefix = redis.SchemaPrefix(cfg.Schema)
		}
		rs := redis.New(rdb, pg, redis.Options{Prefix: prefix, Logger: log})
		m.Name, m.Store, transport, state, m.Rates = "postgres+redis", rs, rs, rs, rs
	}

	replica := cfg.Replica
	if replica == "" {
		host, _ := os.Hostname()
		replica = fmt.Sprintf("%s/%d", host, os.Getpid())
	}
	fence, err := pg.NewFence(openCtx, postgres.FenceOptions{
		Sessions:     cfg.FenceSessions,
		MaxFences:    cfg.MaxFences,
		SessionCheck: cfg.SessionCheck,
		OrphanDrain:  postgres.OrphanDrain(cfg.DrainPeriod, cfg.SessionCheck),
		Replica:      replica,
		State:        state,
	})
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL fences: %w", err)
	}
	m.closers = append(m.closers, fence.Close)
	m.fence, m.Fencer = fence, fence
	m.Collectors = fenceMetrics(fence)

	// Every replica, this one included, hears each rejection once through
	// the transport (storage/feed).
	f := feed.NewReplicated(transport, feed.Options{Logger: log})
	m.closers = append(m.closers, f.Close)
	m.Feed = f
	return m, nil
}
