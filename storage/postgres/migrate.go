package postgres

import (
	"context"
	"embed"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/fencegw/fencegw/tokens"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationTable is goose's version table, named so that it cannot collide
// with an application's own goose table in a shared database.
const migrationTable = "fencegw_migrations"

// migrate creates the schema (if one is configured) and applies the embedded
// migrations with goose's Provider API.
//
// Several gateways may start at once against an empty database. They are
// serialised by one session-level advisory lock taken here, around both the
// CREATE SCHEMA and the migrations, instead of goose's own session locker:
// goose's locker polls pg_try_advisory_lock (at least once a second), while
// a blocking pg_advisory_lock lets the second replica go the moment the
// first is done, and it also covers CREATE SCHEMA IF NOT EXISTS, which is
// not safe to run concurrently. The lock dies with its session, so a replica
// that crashes mid-migration cannot wedge the others; goose runs each
// migration in a transaction, so a half-applied one is rolled back.
func (s *Store) migrate(ctx context.Context) error {
	lock, err := s.lock(ctx, "migrate", "", false)
	if err != nil {
		return interpret("migration lock", err)
	}
	defer lock.Unlock()

	if s.opts.Schema != "" {
		if _, err := s.pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.opts.Schema}.Sanitize()); err != nil {
			return interpret("create schema", err)
		}
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err // embedded at build time: cannot happen
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName(migrationTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return tokens.Unavailable("postgres migrations", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return tokens.Unavailable("postgres migrations", err)
	}
	return nil
}
