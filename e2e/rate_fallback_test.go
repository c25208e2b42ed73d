package e2e

// When the store's shared rate limit is slow, each replica meters a key by
// its own bucket (gateway/ratelimit.go): no request waits on the store past
// the take's bound, and once the store answers again the shared bucket
// decides again.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/gateway"
	storagemode "github.com/fencegw/fencegw/storage/mode"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
)

// slowRates makes one key's shared take slow in a store.
type slowRates interface {
	// stall makes the key's take wait until release.
	stall(t *testing.T)
	// release lets the takes through, waits until the takes the gateway
	// left behind have run, and empties the key's bucket record, so that
	// the next take finds a full bucket.
	release(t *testing.T)
}

// A key with burst 5 and a slow refill; its shared take is made to wait
// (PostgreSQL: another session holds the key's rate_buckets row; Redis:
// CLIENT PAUSE WRITE on a private server). Twenty requests at once, half to
// each of two replicas, are all answered while the store still waits, each
// replica letting through up to its own burst and counting every request in
// fencegw_rate_fallbacks_total; once the store answers again, the shared
// bucket decides again: the burst once over both replicas, no fallback.
func TestRateFallsBackWhileTheStoreIsSlow(t *testing.T) {
	const (
		key, scraperKey = "fgk_test-fallback-rate", "fgk_test-fallback-scraper"
		name            = "slowed"
		rate, burst     = 0.05, 5 // one token in 20 s: no refill to speak of while the test runs
		perReplica      = 2 * burst
	)
	// Well within the forward timeout, and far past the take's 250 ms: a
	// request still waiting then is waiting on the store.
	answerWithin := gateway.DefaultForwardTimeout / 3
	authFile := fmt.Appendf(nil, "keys:\n"+
		"  - {name: %s, sha256: %s, role: worker, rate: %v, burst: %d}\n"+
		"  - {name: scraper, sha256: %s, role: viewer}\n", // no rate: its /metrics scrapes take nothing
		name, auth.Hash(key), rate, burst, auth.Hash(scraperKey))

	modes := []struct {
		name  string
		start func(t *testing.T, schema string) (storagemode.Config, slowRates)
	}{
		{"postgres", func(t *testing.T, schema string) (storagemode.Config, slowRates) {
			return storagemode.Config{Schema: schema}, &lockedRateRow{schema: schema, key: name}
		}},
		{"postgres-redis", func(t *testing.T, schema string) (storagemode.Config, slowRates) {
			// A private server: pausing the shared one would stall every
			// other test using it.
			r := startPrivateRedis(t)
			prefix := "fencegw-e2e-rate-fallback:" + schema + ":"
			return storagemode.Config{Schema: schema, Redis: r.url, RedisPrefix: prefix},
				&pausedRedis{rdb: r.client(t), bucket: redisRateKey(prefix, name)}
		}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			pgtest.Require(t)
			schema := pgtest.NewSchema(t)
			cfg, slow := m.start(t, schema)
			// The store's own bounds on a waiting statement are set past
			// answerWithin, so that only the gateway's bound on the take
			// can answer the requests in time.
			cfg.StatementTimeout, cfg.LockTimeout = time.Minute, time.Minute
			gws := startKeyedReplicas(t, authFile, cfg)
			// One request through the shared bucket, which creates the
			// key's record in the store (the row the lock holds).
			if a := do(t, "GET", gws[0].URL+"/v1/rejections", nil, bearer(key)...); a.Status != http.StatusOK {
				t.Fatalf("first request: %d %s", a.Status, a.Body)
			}
			before := []float64{rateFallbacks(t, gws[0], scraperKey), rateFallbacks(t, gws[1], scraperKey)}
			if before[0] != 0 || before[1] != 0 {
				t.Fatalf("fallbacks before the store was slowed: %v, want none", before)
			}

			slow.stall(t)
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { slow.release(t) }) }
			t.Cleanup(release) // a failed test must not leave the store stalled
			answers, took := sendAtOnce(t, gws, key, perReplica, answerWithin)
			// Every answer is in, and the store still waits: release comes
			// only now.
			for r, as := range answers {
				ok := judgeRateAnswers(t, as)
				t.Logf("replica %d, store stalled: %d of %d requests let through in %v", r, ok, len(as), took.Round(time.Millisecond))
				if most := burst + int(math.Ceil(took.Seconds()*rate)); ok < 1 || ok > most {
					t.Fatalf("replica %d let through %d of %d with the store stalled; want its own burst: at least 1, at most %d",
						r, ok, len(as), most)
				}
				if got := rateFallbacks(t, gws[r], scraperKey) - before[r]; got != float64(len(as)) {
					t.Fatalf("replica %d: fencegw_rate_fallbacks_total rose by %v with the store stalled, want %d (each request it metered)",
						r, got, len(as))
				}
			}

			release()
			// The takes given up on may have closed their connections
			// (pgx closes one whose context ended mid-query): a read with
			// the unmetered key on each replica dials its next one, not a
			// take within its 250 ms.
			for _, g := range gws {
				if a := do(t, "GET", g.URL+"/v1/rejections", nil, bearer(scraperKey)...); a.Status != http.StatusOK {
					t.Fatalf("read after the release: %d %s", a.Status, a.Body)
				}
			}
			stalled := []float64{rateFallbacks(t, gws[0], scraperKey), rateFallbacks(t, gws[1], scraperKey)}
			// Each replica's own bucket is empty now: only the shared one,
			// full again, can let requests through. Sent one at a time,
			// alternating replicas, so that each take finds a connection
			// to the store idle.
			start := time.Now()
			ok := 0
			for i := range 2 * perReplica {
				r := i % 2
				a, err := get(gws[r].URL+"/v1/rejections", key, answerWithin)
				if err != nil {
					t.Fatalf("request %d to replica %d after the release: %v", i, r, err)
				}
				ok += judgeRateAnswers(t, []answer{a})
			}
			took = time.Since(start)
			t.Logf("store answering: %d of %d requests over two replicas let through in %v", ok, 2*perReplica, took.Round(time.Millisecond))
			if most := burst + int(math.Ceil(took.Seconds()*rate)); ok < burst || ok > most {
				t.Fatalf("%d of %d requests over two replicas let through after the release; want the shared burst, %d, and at most %d",
					ok, 2*perReplica, burst, most)
			}
			for r := range gws {
				if got := rateFallbacks(t, gws[r], scraperKey); got != stalled[r] {
					t.Fatalf("replica %d: fencegw_rate_fallbacks_total %v after the release, was %v: the store answers again",
						r, got, stalled[r])
				}
			}
		})
	}
}

// sendAtOnce sends n requests with key to each replica, all at once, each
// bounded by within, and returns the answers by replica (failing the test,
// on its own goroutine, if one was not answered in time).
func sendAtOnce(t *testing.T, gws []*gw, key string, n int, within time.Duration) ([][]answer, time.Duration) {
	t.Helper()
	answers := make([][]answer, len(gws))
	errs := make([][]error, len(gws))
	for r := range gws {
		answers[r], errs[r] = make([]answer, n), make([]error, n)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for r := range gws {
		for i := range n {
			wg.Go(func() {
				answers[r][i], errs[r][i] = get(gws[r].URL+"/v1/rejections", key, within)
			})
		}
	}
	wg.Wait()
	took := time.Since(start)
	for r := range errs {
		for i, err := range errs[r] {
			if err != nil {
				t.Fatalf("request %d to replica %d: %v (not answered within %v while the store was slow)", i, r, err, within)
			}
		}
	}
	return answers, took
}

// judgeRateAnswers returns how many of as were let through; every other one
// must be 429 rate_limited with a Retry-After in whole seconds.
func judgeRateAnswers(t *testing.T, as []answer) int {
	t.Helper()
	ok := 0
	for i, a := range as {
		if a.Status == http.StatusOK {
			ok++
			continue
		}
		wantProblem(t, a, http.StatusTooManyRequests, "rate_limited")
		if s, err := strconv.Atoi(a.Header.Get("Retry-After")); err != nil || s < 1 {
			t.Fatalf("answer %d: Retry-After %q, want whole seconds >= 1", i, a.Header.Get("Retry-After"))
		}
	}
	return ok
}

// get is do's GET with key, bounded by within, returning its failure
// instead of failing the test (it runs off the test's goroutine).
func get(url, key string, within time.Duration) (answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{Status: resp.StatusCode, Header: resp.Header, Body: data}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		if err := json.Unmarshal(data, &a.Problem); err != nil {
			return answer{}, fmt.Errorf("problem body %q: %w", data, err)
		}
	}
	return a, nil
}

// rateFallbacks is g's fencegw_rate_fallbacks_total, from its /metrics.
func rateFallbacks(t *testing.T, g *gw, scraperKey string) float64 {
	t.Helper()
	a := do(t, "GET", g.URL+"/metrics", nil, bearer(scraperKey)...)
	if a.Status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", a.Status, a.Body)
	}
	for line := range strings.SplitSeq(string(a.Body), "\n") {
		if v, ok := strings.CutPrefix(line, "fencegw_rate_fallbacks_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("fencegw_rate_fallbacks_total %q: %v", v, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no fencegw_rate_fallbacks_total:\n%s", a.Body)
	return 0
}

// lockedRateRow stalls a key's take in PostgreSQL: another session holds
// the key's rate_buckets row (SELECT ... FOR UPDATE), so the take's upsert
// waits for the row lock.
type lockedRateRow struct {
	schema, key string
	conn        *pgx.Conn
	tx          pgx.Tx
	tokens      float64 // the bucket's when the row was locked
}

func (l *lockedRateRow) table() string { return pgx.Identifier{l.schema, "rate_buckets"}.Sanitize() }

func (l *lockedRateRow) stall(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "SELECT tokens FROM "+l.table()+" WHERE key_name = $1 FOR UPDATE", l.key).Scan(&l.tokens); err != nil {
		t.Fatalf("lock the rate_buckets row of %q: %v", l.key, err)
	}
	l.conn, l.tx = conn, tx
}

func (l *lockedRateRow) release(t *testing.T) {
	t.Helper()
	if l.tx == nil {
		return
	}
	ctx := context.Background()
	// How many takes still wait on the lock although the gateway gave up
	// on them, directly or queued behind one that waits (they would run
	// once it is released): none while pgx cancels the statements of the
	// contexts that ended.
	var waiting int
	if err := l.conn.QueryRow(ctx, `
WITH RECURSIVE w(pid) AS (
    SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))
    UNION
    SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid)))
SELECT count(*) FROM w`).Scan(&waiting); err != nil {
		t.Errorf("takes waiting on the lock: %v", err)
	}
	if err := l.tx.Rollback(ctx); err != nil {
		t.Fatalf("release the rate_buckets row: %v", err)
	}
	l.tx = nil
	// EXCLUSIVE waits for every transaction that holds the table (the
	// takes left behind) to end, and keeps new takes out until the record
	// is gone.
	var tokens float64
	err := pgx.BeginFunc(ctx, l.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+l.table()+" IN EXCLUSIVE MODE"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "DELETE FROM "+l.table()+" WHERE key_name = $1 RETURNING tokens", l.key).Scan(&tokens)
	})
	if err != nil {
		t.Fatalf("empty the rate_buckets row after the release: %v", err)
	}
	t.Logf("released: %d takes were still waiting on the row; the bucket held %.2f tokens, %.2f when locked", waiting, tokens, l.tokens)
}

// pausedRedis stalls every take in a private Redis: CLIENT PAUSE WRITE
// holds every script (they may write) until CLIENT UNPAUSE.
type pausedRedis struct {
	rdb    *goredis.Client
	bucket string
	tokens string // the bucket's when paused
}

func (p *pausedRedis) stall(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var err error
	if p.tokens, err = p.rdb.HGet(ctx, p.bucket, "tokens").Result(); err != nil {
		t.Fatalf("the bucket %s: %v", p.bucket, err)
	}
	// The pause ends by itself after a minute, should the test not get to
	// release it.
	if err := p.rdb.Do(ctx, "CLIENT", "PAUSE", time.Minute.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
}

func (p *pausedRedis) release(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := p.rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatalf("CLIENT UNPAUSE: %v", err)
	}
	// Redis runs the scripts it held before it reads another command, so
	// the takes left behind (those whose connection go-redis has not
	// closed yet) have run by now.
	tokens, err := p.rdb.HGet(ctx, p.bucket, "tokens").Result()
	if err != nil {
		t.Fatalf("the bucket %s after the release: %v", p.bucket, err)
	}
	if err := p.rdb.Del(ctx, p.bucket).Err(); err != nil {
		t.Fatalf("empty the bucket %s: %v", p.bucket, err)
	}
	t.Logf("released: the bucket held %s tokens, %s when paused", tokens, p.tokens)
}

// redisRateKey is the Redis hash of a key's bucket (storage/redis
// ratelimit.go, rateKey).
func redisRateKey(prefix, keyName string) string {
	return prefix + "rate:" + hex.EncodeToString([]byte(keyName))
}

// privateRedis is a redis-server of the test's own, on a unix socket,
// killed when the test ends.
type privateRedis struct{ url, sock string }

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is required under CI")
		}
		t.Skip("redis-server not installed: the Redis mode needs a private server to pause")
	}
	// A short directory: a socket's path is limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "fgw-redis")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	r := &privateRedis{url: "unix://" + sock + "?db=0", sock: sock}
	rdb := goredis.NewClient(&goredis.Options{Network: "unix", Addr: sock})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return r
		}
		select {
		case <-exited:
			t.Fatal("redis-server exited at start")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("private redis-server not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *privateRedis) client(t *testing.T) *goredis.Client {
	rdb := goredis.NewClient(&goredis.Options{Network: "unix", Addr: r.sock})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
