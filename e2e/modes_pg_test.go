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
		gws = append(gws, startWith(t, pgMode(t, storagemode.Config{Schema: schema}, i), ups, o))
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
		gws = append(gws, startWith(t, pgMode(t, cfg, i), ups, o))
	}
	return gws
}

// pgMode is replica's PostgreSQL mode (with Redis if cfg.Redis is set),
// opened by replica.New as cmd/fencegw opens it: writes admitted under the
// fences the replica keeps in PostgreSQL.
func pgMode(t *testing.T, cfg storagemode.Config, replica int) storagemode.Config {
	t.Helper()
	cfg.Postgres = pgtest.URL()
	cfg.Replica = fmt.Sprintf("e2e/%d", replica)
	cfg.Logger = testLog(t)
	return cfg
}

// sharedStoreMode is one of the modes in which replicas share a store.
type sharedStoreMode struct {
	name string
	// config is the mode on a schema of the test's own; in the Redis
	// mode its keys go under a prefix made of keyPrefix and the schema.
	config func(t *testing.T, schema string) storagemode.Config
}

// sharedStoreModes are the PostgreSQL and the PostgreSQL + Redis modes;
// keyPrefix names the test's Redis keys.
func sharedStoreModes(keyPrefix string) []sharedStoreMode {
	return []sharedStoreMode{
		{"postgres", func(t *testing.T, schema string) storagemode.Config {
			return storagemode.Config{Schema: schema}
		}},
		{"postgres-redis", func(t *testing.T, schema string) storagemode.Config {
			requireRedis(t)
			return storagemode.Config{Schema: schema, Redis: redisURL(), RedisPrefix: keyPrefix + schema + ":"}
		}},
	}
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
