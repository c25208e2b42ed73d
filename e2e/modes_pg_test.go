package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// Three replicas sharing one PostgreSQL schema (and, in the second mode,
// one Redis key prefix): every story runs with workers spread across them.
const replicas = 3

func init() {
	modes = append(modes,
		mode{name: "postgres", start: startPostgres},
		mode{name: "postgres-redis", start: startPostgresRedis},
	)
}

func startPostgres(t *testing.T, ups map[string]string, o options) []*gw {
	pgtest.Require(t)
	schema := pgtest.NewSchema(t)
	var gws []*gw
	for i := range replicas {
		gws = append(gws, startWith(t, openMode(t, storagemode.Config{Schema: schema}, i, o), ups, o))
	}
	return gws
}

func startPostgresRedis(t *testing.T, ups map[string]string, o options) []*gw {
	pgtest.Require(t)
	requireRedis(t)
	schema := pgtest.NewSchema(t)
	var gws []*gw
	for i := range replicas {
		cfg := storagemode.Config{Schema: schema, Redis: redisURL(), RedisPrefix: fmt.Sprintf("fencegw-e2e:%s:", schema)}
		gws = append(gws, startWith(t, openMode(t, cfg, i, o), ups, o))
	}
	return gws
}

// openMode opens replica's PostgreSQL mode (with Redis if cfg.Redis is
// set) as cmd/fencegw does, through storage/mode: writes admitted under
// the fences the replica keeps in PostgreSQL.
func openMode(t *testing.T, cfg storagemode.Config, replica int, o options) stores {
	t.Helper()
	cfg.Postgres = pgtest.URL()
	cfg.DrainPeriod = o.drainPeriod
	cfg.Replica = fmt.Sprintf("e2e/%d", replica)
	cfg.Logger = testLog(t)
	m, err := storagemode.OpenPostgres(context.Background(), cfg)
	if err != nil {
		t.Fatalf("replica %d: %v", replica, err)
	}
	return stores{store: m.Store, locker: m.Locker, fencer: m.Fencer, onFree: m.OnFree, keys: m.Keys, close: m.Close}
}

// redisURL is the test Redis (FENCEGW_TEST_REDIS, or the local one).
func redisURL() string {
	if url := os.Getenv("FENCEGW_TEST_REDIS"); url != "" {
		return url
	}
	return "redis://127.0.0.1:6379/0"
}

func requireRedis(t *testing.T) *goredis.Client {
	t.Helper()
	url := redisURL()
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatalf("FENCEGW_TEST_REDIS: %v", err)
	}
	rdb := goredis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Redis at %s is required under CI: %v", url, err)
		}
		t.Skipf("Redis at %s unreachable: %v", url, err)
	}
	return rdb
}
