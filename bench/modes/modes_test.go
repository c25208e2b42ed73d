package modes_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/bench"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/tokens"
)

var (
	conc      = flag.Int("modes.clients", 16, "concurrent clients (spread grants, all writes, raw rates)")
	resources = flag.Int("modes.resources", 1000, "resources in the spread runs")
	bodySize  = flag.Int("modes.body", 256, "write body size in bytes")
)

var modeNames = []string{"embedded", "postgres", "postgres-redis"}

// env is one gateway (in process, served on loopback) in one storage mode,
// forwarding to a counting upstream.
type env struct {
	mode   string
	up     *bench.Upstream
	base   *url.URL
	client *http.Client
	body   []byte
}

// start serves one replica in mode, built as fencegw serve builds it
// (replica.New, through bench.StartModeGateway).
func start(tb testing.TB, mode string) *env {
	tb.Helper()
	up, err := bench.StartUpstream()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = up.Close() })
	var schema string
	if mode != "embedded" {
		schema = pgtest.NewSchema(tb)
	}
	gw := startReplica(tb, modeConfig(tb, mode, schema, 0), up.URL)
	c := bench.NewClient(max(*conc, 64))
	tb.Cleanup(c.CloseIdleConnections)
	return &env{mode: mode, up: up, base: gw.URL, client: c, body: bytes.Repeat([]byte("x"), *bodySize)}
}

// startReplica serves a replica on the storage mode m, forwarding to
// upstream, until the benchmark ends.
func startReplica(tb testing.TB, m storagemode.Config, upstream *url.URL) *bench.Gateway {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := bench.StartModeGateway(ctx, "server", m, upstream)
	if err != nil {
		tb.Fatalf("start a %s replica: %v", m.Postgres+m.Data, err)
	}
	tb.Cleanup(func() { _ = gw.Close() })
	return gw
}

// modeConfig is the storage configuration of mode: the embedded store in
// a temporary directory, or replica i of a PostgreSQL mode on schema (and,
// with Redis, a key prefix of the schema's, deleted when the benchmark
// ends). Everything else is fencegw serve's defaults.
func modeConfig(tb testing.TB, mode, schema string, i int) storagemode.Config {
	tb.Helper()
	switch mode {
	case "embedded":
		return storagemode.Config{Data: tb.TempDir()}
	case "postgres", "postgres-redis":
		cfg := storagemode.Config{Postgres: pgtest.URL(), Schema: schema, Replica: fmt.Sprintf("bench/%d", i)}
		if mode == "postgres-redis" {
			rdb := requireRedis(tb)
			cfg.Redis = redisURL()
			cfg.RedisPrefix = "fencegw-bench:" + schema + ":"
			tb.Cleanup(func() { deletePrefix(rdb, cfg.RedisPrefix) })
		}
		return cfg
	}
	tb.Fatalf("unknown mode %q", mode)
	return storagemode.Config{}
}

func redisURL() string {
	if u := os.Getenv("FENCEGW_TEST_REDIS"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

func requireRedis(tb testing.TB) *goredis.Client {
	tb.Helper()
	opt, err := goredis.ParseURL(redisURL())
	if err != nil {
		tb.Fatalf("FENCEGW_TEST_REDIS: %v", err)
	}
	opt.PoolSize = 128
	rdb := goredis.NewClient(opt)
	tb.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("Redis at %s is required under CI: %v", redisURL(), err)
		}
		tb.Skipf("Redis at %s unreachable: %v", redisURL(), err)
	}
	return rdb
}

// deletePrefix removes this run's keys (never FLUSHALL: Redis is shared).
func deletePrefix(rdb *goredis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 500 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}

// grantCycle acquires resource (waiting up to 5 s if it is held) and
// releases it; it returns the grant's latency (the release is not timed).
func (e *env) grantCycle(ctx context.Context, resource string) (time.Duration, error) {
	payload, _ := json.Marshal(map[string]any{"resource": resource, "holder": "bench", "ttl_ms": 60000, "wait_ms": 5000})
	t0 := time.Now()
	resp, err := e.do(ctx, http.MethodPost, e.base.String()+"/v1/leases", payload)
	took := time.Since(t0)
	if err != nil {
		return 0, err
	}
	var l struct {
		LeaseID string `json:"lease_id"`
		Token   int64  `json:"token"`
	}
	if resp.code != http.StatusCreated || json.Unmarshal(resp.body, &l) != nil || l.Token < 1 {
		return 0, &bench.StatusError{Status: resp.code, Body: string(resp.body)}
	}
	resp, err = e.do(ctx, http.MethodDelete, e.base.String()+"/v1/leases/"+l.LeaseID, nil)
	if err != nil {
		return 0, err
	}
	if resp.code != http.StatusNoContent {
		return 0, &bench.StatusError{Status: resp.code, Body: string(resp.body)}
	}
	return took, nil
}

type reply struct {
	code int
	body []byte
}

func (e *env) do(ctx context.Context, method, u string, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, b}, err
}

// leases takes n leases (one per resource prefix-i), valid for an hour.
func (e *env) leases(tb testing.TB, prefix string, n int) []string {
	tb.Helper()
	ids, err := bench.AcquireMany(context.Background(), e.client, e.base, prefix+"-"+runID(), n, 16, time.Hour)
	if err != nil {
		first, _, _ := strings.Cut(err.Error(), "\n")
		tb.Fatalf("take %d leases: %s", n, first)
	}
	return ids
}

func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// measure runs op n times from workers goroutines and reports throughput
// and latency percentiles. op returns the latency to record (0: time the
// whole call).
func measure(b *testing.B, workers int, unit string, op func(ctx context.Context, i int) (time.Duration, error)) {
	ctx := context.Background()
	var (
		next     atomic.Int64
		rec      bench.Recorder
		failed   atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	n := int64(b.N)
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1024)
			for {
				i := next.Add(1) - 1
				if i >= n {
					break
				}
				t0 := time.Now()
				took, err := op(ctx, int(i))
				if err != nil {
					failed.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				if took == 0 {
					took = time.Since(t0)
				}
				lat = append(lat, took)
			}
			rec.Add(lat)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d operations failed; first: %v", f, n, firstErr)
	}
	s := rec.Summary()
	b.ReportMetric(float64(n)/elapsed.Seconds(), unit+"/s")
	b.ReportMetric(float64(s.P50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(s.P99.Microseconds())/1000, "p99-ms")
}

// BenchmarkGrant: a grant is POST /v1/leases (timed) followed by DELETE
// (not timed). hot: one resource changing hands as fast as one client can
// take and give it back (grants of one resource are serial by nature);
// spread: -modes.clients clients on random resources out of
// -modes.resources.
func BenchmarkGrant(b *testing.B) {
	for _, mode := range modeNames {
		b.Run(mode, func(b *testing.B) {
			e := start(b, mode)
			id := runID()
			b.Run("hot", func(b *testing.B) {
				measure(b, 1, "grants", func(ctx context.Context, _ int) (time.Duration, error) {
					return e.grantCycle(ctx, "hot-"+id)
				})
			})
			b.Run("spread", func(b *testing.B) {
				measure(b, *conc, "grants", func(ctx context.Context, _ int) (time.Duration, error) {
					return e.grantCycle(ctx, "spread-"+id+"-"+strconv.Itoa(mrand.IntN(*resources)))
				})
			})
		})
	}
}

// BenchmarkWrite: fenced writes (POST through /v1/proxy/...) from
// -modes.clients clients. hot: every write under one lease on one resource
// (all share its lock); spread: each write under one of -modes.resources
// leases on as many resources, picked at random.
func BenchmarkWrite(b *testing.B) {
	for _, mode := range modeNames {
		b.Run(mode, func(b *testing.B) {
			e := start(b, mode)
			hot := bench.GatewayTarget("hot", e.base, bench.UpstreamName, e.leases(b, "whot", 1))
			spread := bench.GatewayTarget("spread", e.base, bench.UpstreamName, e.leases(b, "wspread", *resources))
			for _, tg := range []bench.Target{hot, spread} {
				b.Run(tg.Name, func(b *testing.B) {
					before := e.up.Requests.Load()
					measure(b, *conc, "writes", func(ctx context.Context, _ int) (time.Duration, error) {
						_, err := bench.Write(ctx, e.client, tg, e.body, mrand.IntN(len(tg.Leases)))
						return 0, err
					})
					if got := e.up.Requests.Load() - before; got != int64(b.N) || e.up.Leaked.Load() != 0 {
						b.Fatalf("upstream got %d writes for %d answered (leaked leases: %d)", got, b.N, e.up.Leaked.Load())
					}
				})
			}
		})
	}
}

// BenchmarkWriteKeyed: what an Idempotency-Key costs a fenced write in
// each mode (docs/benchmarks.md, "Idempotency keys"): the same writes from
// -modes.clients clients under one lease, without a key ("plain") and with
// a fresh key each ("keyed": two durable changes per write, begin and
// finish), side by side in one run, spread over -modes.resources leases so
// that the resource lock is not what is measured.
func BenchmarkWriteKeyed(b *testing.B) {
	for _, mode := range modeNames {
		b.Run(mode, func(b *testing.B) {
			e := start(b, mode)
			leases := e.leases(b, "wkeyed", *resources)
			plain := bench.GatewayTarget("plain", e.base, bench.UpstreamName, leases)
			keyed := bench.GatewayTarget("keyed", e.base, bench.UpstreamName, leases)
			keyed.Keyed = true
			for _, tg := range []bench.Target{plain, keyed, plain, keyed} {
				b.Run(tg.Name, func(b *testing.B) {
					before := e.up.Requests.Load()
					syncs := walSyncs(b, mode)
					measure(b, *conc, "writes", func(ctx context.Context, _ int) (time.Duration, error) {
						_, err := bench.Write(ctx, e.client, tg, e.body, mrand.IntN(len(tg.Leases)))
						return 0, err
					})
					if got := e.up.Requests.Load() - before; got != int64(b.N) || e.up.Leaked.Load() != 0 {
						b.Fatalf("upstream got %d writes for %d answered (leaked leases: %d)", got, b.N, e.up.Leaked.Load())
					}
					if syncs >= 0 {
						// The server's WAL fsyncs during the run per write: an
						// upper bound (the server's other clients count too).
						b.ReportMetric(float64(walSyncs(b, mode)-syncs)/float64(b.N), "wal-syncs/write")
					}
				})
			}
		})
	}
}

// walSyncs is the PostgreSQL server's count of WAL fsyncs (pg_stat_wal,
// PostgreSQL 14+), or -1 in the embedded mode or if it cannot be read.
func walSyncs(tb testing.TB, mode string) int64 {
	if mode == "embedded" {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		tb.Logf("pg_stat_wal: %v", err)
		return -1
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, `SELECT wal_sync FROM pg_stat_wal`).Scan(&n); err != nil {
		tb.Logf("pg_stat_wal: %v", err)
		return -1
	}
	return n
}

// BenchmarkHandover: a lease released through one replica and acquired
// through another (the PostgreSQL modes, tokens.Service API), the acquire
// timed: what a worker on replica B waits once A's holder let go.
func BenchmarkHandover(b *testing.B) {
	for _, mode := range modeNames[1:] {
		b.Run(mode, func(b *testing.B) {
			schema := pgtest.NewSchema(b)
			up, err := bench.StartUpstream()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = up.Close() })
			var svcs [2]*tokens.Service
			for i := range svcs {
				svcs[i] = startReplica(b, modeConfig(b, mode, schema, i), up.URL).Service()
			}
			resource := "handover-" + runID()
			ctx := context.Background()
			var held tokens.Lease
			if held, err = svcs[0].Acquire(ctx, tokens.AcquireRequest{Resource: resource, Holder: "w", TTL: time.Minute}); err != nil {
				b.Fatal(err)
			}
			side := 0
			measure(b, 1, "handovers", func(ctx context.Context, _ int) (time.Duration, error) {
				if _, err := svcs[side].Release(ctx, held.ID, ""); err != nil {
					return 0, err
				}
				side = 1 - side
				start := time.Now()
				held, err = svcs[side].Acquire(ctx, tokens.AcquireRequest{Resource: resource, Holder: "w", TTL: time.Minute})
				return time.Since(start), err
			})
		})
	}
}

// BenchmarkRaw: the operations underneath, from Go on the same machine.
// postgres-update: UPDATE t SET n = n + 1 WHERE id = 1 on a one-row table
// (autocommit, one transaction each); redis-setnx: SET key v NX PX 60000 on
// -modes.resources keys (most already set, as for a held lease).
func BenchmarkRaw(b *testing.B) {
	b.Run("postgres-update", func(b *testing.B) {
		schema := pgtest.NewSchema(b)
		cfg, err := pgxpool.ParseConfig(pgtest.URL())
		if err != nil {
			b.Fatal(err)
		}
		cfg.MaxConns = int32(*conc)
		cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
		ctx := context.Background()
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()+
			"; CREATE TABLE t (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO t VALUES (1, 0)"); err != nil {
			b.Fatal(err)
		}
		measure(b, *conc, "updates", func(ctx context.Context, _ int) (time.Duration, error) {
			_, err := pool.Exec(ctx, "UPDATE t SET n = n + 1 WHERE id = 1")
			return 0, err
		})
	})
	b.Run("redis-setnx", func(b *testing.B) {
		rdb := requireRedis(b)
		prefix := "fencegw-bench-raw:" + runID() + ":"
		defer deletePrefix(rdb, prefix)
		measure(b, *conc, "sets", func(ctx context.Context, _ int) (time.Duration, error) {
			err := rdb.SetArgs(ctx, prefix+strconv.Itoa(mrand.IntN(*resources)), "v", goredis.SetArgs{Mode: "NX", TTL: time.Minute}).Err()
			if errors.Is(err, goredis.Nil) { // NX refused: the key is held
				err = nil
			}
			return 0, err
		})
	})
}

// TestModes is the quick sanity check run without -bench: in every mode a
// few grants (hot and spread) and fenced writes go through, each write
// reaches the upstream once with its Fencing-Token and never the lease.
func TestModes(t *testing.T) {
	for _, mode := range modeNames {
		t.Run(mode, func(t *testing.T) {
			e := start(t, mode)
			ctx := context.Background()
			id := runID()
			for i := range 5 {
				if _, err := e.grantCycle(ctx, "hot-"+id); err != nil {
					t.Fatalf("hot grant %d: %v", i, err)
				}
				if _, err := e.grantCycle(ctx, fmt.Sprintf("spread-%s-%d", id, i)); err != nil {
					t.Fatalf("spread grant %d: %v", i, err)
				}
			}
			tg := bench.GatewayTarget("spread", e.base, bench.UpstreamName, e.leases(t, "w", 10))
			var wg sync.WaitGroup
			errs := make([]error, 40)
			for i := range 40 {
				wg.Go(func() { _, errs[i] = bench.Write(ctx, e.client, tg, e.body, i) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if e.up.Requests.Load() != 40 || e.up.Fenced.Load() != 40 || e.up.Leaked.Load() != 0 {
				t.Fatalf("upstream: %d requests, %d fenced, %d leaked; want 40, 40, 0",
					e.up.Requests.Load(), e.up.Fenced.Load(), e.up.Leaked.Load())
			}
		})
	}
}
