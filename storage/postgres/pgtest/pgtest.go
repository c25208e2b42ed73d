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
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
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
	t.Cleanup(func() { // registered after NewSchema's cleanup: runs before the drop
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// OpenFresh opens a Store on a fresh schema.
func OpenFresh(t testing.TB) *postgres.Store {
	t.Helper()
	return Open(t, NewSchema(t), postgres.Options{})
}

// FenceReplicas opens n replicas on one fresh schema, each a Store with a
// Fence, for storagetest.RunFence. wrap turns a replica's PostgreSQL store
// into the store the replica serves with and the state its fence reads
// (nil wrap: PostgreSQL alone).
func FenceReplicas(t *testing.T, n int, opts storagetest.FenceOptions,
	wrap func(t *testing.T, pg *postgres.Store) (tokens.Store, postgres.StateReader)) []*storagetest.FenceReplica {
	t.Helper()
	schema := NewSchema(t)
	var out []*storagetest.FenceReplica
	for i := range n {
		pg := Open(t, schema, postgres.Options{})
		var store tokens.Store = pg
		var state postgres.StateReader = pg
		if wrap != nil {
			store, state = wrap(t, pg)
		}
		counted := &countingState{StateReader: state}
		var name [4]byte
		_, _ = rand.Read(name[:])
		replica := "test-" + hex.EncodeToString(name[:]) + "-" + strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		fence, err := pg.NewFence(ctx, postgres.FenceOptions{
			SessionCheck: opts.SessionCheck,
			OrphanDrain:  postgres.OrphanDrain(opts.DrainPeriod, opts.SessionCheck),
			Idle:         opts.Idle,
			MaxFences:    opts.MaxFences,
			Replica:      replica,
			State:        counted,
		})
		cancel()
		if err != nil {
			t.Fatalf("NewFence: %v", err)
		}
		t.Cleanup(fence.Close) // before the store's Close
		r := &storagetest.FenceReplica{
			Store:  store,
			Fencer: fence,
			Reads:  counted.reads.Load,
			Close:  fence.Close,
		}
		r.KillSessions = func(t *testing.T) { terminate(t, fence.SessionPIDs()...) }
		r.KillListener = func(t *testing.T) { terminate(t, fence.ListenerPID()) }
		r.Crash = func(t *testing.T) {
			terminate(t, append(fence.SessionPIDs(), fence.ListenerPID())...)
			fence.Close() // its sessions are gone: nothing is given up
		}
		r.Connections = func(t *testing.T) int {
			var fenceConns int
			query(t, func(conn *pgx.Conn) error {
				return conn.QueryRow(context.Background(),
					`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, "fencegw-fence "+replica).Scan(&fenceConns)
			})
			return fenceConns + int(pg.PoolConns())
		}
		out = append(out, r)
	}
	return out
}

type countingState struct {
	postgres.StateReader
	reads atomic.Int64
}

func (c *countingState) LeaseState(ctx context.Context, id string) (tokens.Lease, tokens.Resource, error) {
	c.reads.Add(1)
	return c.StateReader.LeaseState(ctx, id)
}

func query(t *testing.T, fn func(*pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if err := fn(conn); err != nil {
		t.Fatal(err)
	}
}

// terminate kills backends by pid, as an operator's pg_terminate_backend
// or a network partition would.
func terminate(t *testing.T, pids ...uint32) {
	t.Helper()
	query(t, func(conn *pgx.Conn) error {
		for _, pid := range pids {
			if pid == 0 {
				continue
			}
			if _, err := conn.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, int64(pid)); err != nil {
				return err
			}
		}
		return nil
	})
}
