package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/tokens"
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
		st := pgtest.Open(t, schema, postgres.Options{Logger: testLog(t)})
		gws = append(gws, startWith(t, fenced(t, st, st, nil, i, o), ups, o))
	}
	return gws
}

func startPostgresRedis(t *testing.T, ups map[string]string, o options) []*gw {
	pgtest.Require(t)
	rdb := requireRedis(t)
	schema := pgtest.NewSchema(t)
	prefix := fmt.Sprintf("fencegw-e2e:%s:", schema)
	var gws []*gw
	for i := range replicas {
		pg := pgtest.Open(t, schema, postgres.Options{Logger: testLog(t)})
		rs := redis.New(rdb, pg, redis.Options{Prefix: prefix, Logger: testLog(t)})
		gws = append(gws, startWith(t, fenced(t, rs, pg, rs, i, o), ups, o))
	}
	return gws
}

// fenced admits writes under fences the replica keeps in PostgreSQL, as
// cmd/fencegw does in both PostgreSQL modes (backend_postgres.go): state
// reads leases from Redis in the Redis mode, from PostgreSQL if nil.
func fenced(t *testing.T, store tokens.Store, pg *postgres.Store, state postgres.StateReader, replica int, o options) stores {
	t.Helper()
	drain := o.drainPeriod
	if drain <= 0 {
		drain = tokens.DefaultDrainPeriod
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fence, err := pg.NewFence(ctx, postgres.FenceOptions{
		SessionCheck: postgres.DefaultSessionCheck,
		OrphanDrain:  drain + postgres.DefaultSessionCheck,
		Replica:      fmt.Sprintf("e2e/%d", replica),
		State:        state,
	})
	if err != nil {
		t.Fatalf("fences of replica %d: %v", replica, err)
	}
	return stores{store: store, locker: fence, fencer: fence, onFree: fence.OnFree, keys: pg, close: fence.Close}
}

func requireRedis(t *testing.T) *goredis.Client {
	t.Helper()
	url := os.Getenv("FENCEGW_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
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
