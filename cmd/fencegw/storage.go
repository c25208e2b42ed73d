package main

// The storage mode serve opens (storage/mode, through the replica): its
// configuration from the flags, and what serve says when a store does not
// open: one line naming the flag, the address (a password hidden) and the
// cause, instead of a driver's wrapped chain (which printed PostgreSQL's
// dial error once per attempt, and go-redis's own logger four lines before
// it). storage/mode classifies the failure; this file words it.

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/fencegw/fencegw/storage/mode"
)

// modeConfig is the storage mode the flags name.
func modeConfig(cfg config) mode.Config {
	return mode.Config{
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
	}
}

// storeError turns a replica's failure to start into one line: a usage
// error (exit 2) for a value the driver refused or a data directory in
// use, else one naming the store, its address and the cause (exit 1).
func storeError(err error, cfg config) error {
	var ce *mode.ConfigError
	if errors.As(err, &ce) {
		return cfg.src.bad(ce.Field, "%v", ce.Err)
	}
	var se *mode.StoreError
	if errors.As(err, &se) {
		switch {
		case se.Failure == mode.InUse:
			return usageError("%s: %s is in use by another process%s: is another fencegw serving from it? Stop it, or give this one its own --data",
				cfg.src.of("data"), se.Where, se.Holder)
		case se.Failure == mode.NoDirectory:
			return fmt.Errorf("%s %s: cannot create the directory: %s", cfg.src.of("data"), cfg.Data, se.Cause)
		case se.Store == "postgres":
			return fmt.Errorf("%s %s: cannot reach PostgreSQL at %s: %s", cfg.src.of("postgres"), redactURL(cfg.Postgres), se.Where, se.Cause)
		case se.Store == "redis":
			return fmt.Errorf("%s %s: cannot reach Redis at %s: %s", cfg.src.of("redis"), redactURL(cfg.Redis), se.Where, se.Cause)
		}
	}
	// Anything else, on one line.
	return errors.New(strings.Join(strings.Fields(err.Error()), " "))
}

// redactURL is a store URL with its password hidden.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(key=value settings)"
	}
	return u.Redacted()
}
