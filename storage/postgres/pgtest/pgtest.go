// Package pgtest opens PostgreSQL-backed stores for tests, each in a fresh
// schema that is dropped when the test ends.
//
// The database comes from FENCEGW_TEST_POSTGRES (default
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). If it cannot be
// reached the test is skipped, except under CI=true, where it fails: a
// missing backend must never pass silently in CI.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
)

// DefaultURL is used when FENCEGW_TEST_POSTGRES is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL is the test database's connection URL.
func URL() string {
	if u := os.Getenv("FENCEGW_TEST_POSTGRES"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	reachOnce sync.Once
	reachErr  error
)

// Require skips the test (fails it under CI=true) if PostgreSQL is unreachable.
func Require(t testing.TB) {
	t.Helper()
	reachOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		reachErr = err
	})
	if reachErr != nil {
		msg := "PostgreSQL unreachable at " + URL() + " (set FENCEGW_TEST_POSTGRES, or run scripts/test-services.sh): " + reachErr.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// NewSchema returns a fresh schema name, fencegw_test_<random>, whose
// schema is dropped (CASCADE) when the test ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	Require(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "fencegw_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Open opens a Store on schema (closed when the test ends). opts.Schema is
// overwritten.
func Open(t testing.TB, schema string, opts postgres.Options) *postgres.Store {
	t.Helper()
	opts.Schema = schema
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, URL(), opts)
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	t.Cleanup(s.Close) // registered after NewSchema's cleanup: runs before the drop
	return s
}

// OpenFresh opens a Store on a fresh schema.
func OpenFresh(t testing.TB) *postgres.Store {
	t.Helper()
	return Open(t, NewSchema(t), postgres.Options{})
}
