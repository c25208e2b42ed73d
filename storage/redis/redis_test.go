package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/fencegw/fencegw/storage/postgres"
	"github.com/fencegw/fencegw/storage/postgres/pgtest"
	"github.com/fencegw/fencegw/storage/redis"
	"github.com/fencegw/fencegw/storage/storagetest"
	"github.com/fencegw/fencegw/tokens"
)

func redisURL() string {
	if u := os.Getenv("FENCEGW_TEST_REDIS"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// client connects to the test Redis (db overrides the URL's database if
// >= 0). Missing Redis skips the test, or fails it under CI=true.
func client(t testing.TB, db int) *goredis.Client {
	t.Helper()
	opt, err := goredis.ParseURL(redisURL())
	if err != nil {
		t.Fatalf("FENCEGW_TEST_REDIS: %v", err)
	}
	if db >= 0 {
		opt.DB = db
	}
	c := goredis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		msg := "Redis unreachable at " + redisURL() + " (set FENCEGW_TEST_REDIS, or run scripts/test-services.sh): " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func prefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fencegw_test_" + hex.EncodeToString(b[:]) + ":"
}

type env struct {
	schema, prefix string
	rdb            *goredis.Client
	ledger         *postgres.Store
	store          *redis.Store
}

func open(t *testing.T, db int) *env {
	t.Helper()
	e := &env{rdb: client(t, db), schema: pgtest.NewSchema(t), prefix: prefix(t)}
	e.reopen(t)
	return e
}

func (e *env) reopen(t *testing.T) {
	e.ledger = pgtest.Open(t, e.schema, postgres.Options{})
	e.store = redis.New(e.rdb, e.ledger, redis.Options{Prefix: e.prefix})
}

func TestConformance(t *testing.T) {
	client(t, -1)
	pgtest.Require(t)
	envs := envsBy(func(e *env) tokens.Store { return e.store })
	storagetest.Run(t, storagetest.Harness{Open: envs.open, Reopen: envs.reopen})
}

// envRegistry remembers which env opened the store a suite holds (its
// ledger or its Redis store, as by says), so that Reopen finds the Redis
// client, schema and prefix to open again on.
type envRegistry[S comparable] struct {
	by func(*env) S
	mu sync.Mutex
	m  map[S]*env
}

func envsBy[S comparable](by func(*env) S) *envRegistry[S] {
	return &envRegistry[S]{by: by, m: map[S]*env{}}
}

func (r *envRegistry[S]) add(e *env) S {
	s := r.by(e)
	r.mu.Lock()
	r.m[s] = e
	r.mu.Unlock()
	return s
}

func (r *envRegistry[S]) of(s S) *env {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[s]
}

func (r *envRegistry[S]) open(t *testing.T) S { return r.add(open(t, -1)) }

// reopen closes the ledger under s and opens the same schema and prefix
// again, as a restarted gateway would.
func (r *envRegistry[S]) reopen(t *testing.T, s S) S {
	old := r.of(s)
	old.ledger.Close()
	e := &env{rdb: old.rdb, schema: old.schema, prefix: old.prefix}
	e.reopen(t)
	return r.add(e)
}

func grant(t *testing.T, s tokens.Store, resource string, ttl time.Duration) tokens.Lease {
	t.Helper()
	l, err := s.Grant(t.Context(), tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: resource, Holder: "h", TTL: ttl})
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	return l
}

func judge(t *testing.T, s tokens.Store, l tokens.Lease) error {
	t.Helper()
	r, err := s.Resource(t.Context(), l.Resource)
	if err != nil {
		t.Fatal(err)
	}
	return tokens.Judge(l, r, r.Now)
}

// Losing every Redis key mid-lease costs only efficiency: the holder's lease
// ends, the next grant gets a larger PostgreSQL token, the old one is fenced.
// (FLUSHDB on a database of its own, so that parallel tests keep their keys.)
func TestRedisLossFencesTheOldLease(t *testing.T) {
	t.Parallel()
	e := open(t, 15)
	ctx := t.Context()
	old := grant(t, e.store, "acct:1", time.Minute)
	if err := judge(t, e.store, old); err != nil {
		t.Fatalf("Judge before the loss: %v", err)
	}
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := judge(t, e.store, old); !errors.Is(err, tokens.ErrLeaseExpired) {
		t.Fatalf("Judge after the loss: %v, want ErrLeaseExpired", err)
	}
	next := grant(t, e.store, "acct:1", time.Minute)
	if next.Token <= old.Token {
		t.Fatalf("token after the loss %d, old %d", next.Token, old.Token)
	}
	if err := judge(t, e.store, old); !errors.Is(err, tokens.ErrStaleToken) {
		t.Fatalf("Judge(old) after the next grant: %v, want ErrStaleToken", err)
	}
	if err := judge(t, e.store, next); err != nil {
		t.Fatalf("Judge(next): %v", err)
	}
	if _, err := e.store.Renew(ctx, old.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(old): %v", err)
	}
	if _, err := e.store.Release(ctx, old.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release(old): %v", err)
	}
	if id, _ := e.rdb.Get(ctx, e.store.LeaseKey("acct:1")).Result(); id != next.ID {
		t.Fatalf("claim %q after the old lease's release, want the new lease's", id)
	}
}

// A superseded lease id can neither delete nor extend its successor's claim,
// even when Redis hands the old claim back (a failover to a stale replica).
func TestCompareAndSetProtectsTheSuccessor(t *testing.T) {
	t.Parallel()
	e := open(t, -1)
	ctx := t.Context()
	key := e.store.LeaseKey("inv/1")
	old := grant(t, e.store, "inv/1", 150*time.Millisecond)
	storagetest.WaitPast(t, e.store, "inv/1", old.ExpiresAt)
	next := grant(t, e.store, "inv/1", time.Minute)
	pttl := e.rdb.PTTL(ctx, key).Val()
	if _, err := e.store.Release(ctx, old.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release(old): %v", err)
	}
	if _, err := e.store.Renew(ctx, old.ID, time.Hour); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(old): %v", err)
	}
	if id := e.rdb.Get(ctx, key).Val(); id != next.ID {
		t.Fatalf("claim %q, want the successor's", id)
	}
	if p := e.rdb.PTTL(ctx, key).Val(); p > pttl {
		t.Fatalf("successor's claim extended from %v to %v", pttl, p)
	}

	// Stale claim restored: Redis says old, the ledger says next.
	if err := e.rdb.Set(ctx, key, old.ID, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := judge(t, e.store, old); !errors.Is(err, tokens.ErrStaleToken) {
		t.Fatalf("Judge(old) with its claim restored: %v, want ErrStaleToken", err)
	}
	if err := judge(t, e.store, next); !errors.Is(err, tokens.ErrLeaseExpired) {
		t.Fatalf("Judge(next) without its claim: %v, want ErrLeaseExpired", err)
	}
	if _, err := e.store.Renew(ctx, old.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(old) with its claim restored: %v", err)
	}
	if n := e.rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("the worthless restored claim was kept")
	}
	third := grant(t, e.store, "inv/1", time.Minute)
	if third.Token != next.Token+1 {
		t.Fatalf("token %d after %d", third.Token, next.Token)
	}
}

func TestRedisDownIsUnavailable(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	ledger := pgtest.OpenFresh(t)
	dead := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer dead.Close()
	s := redis.New(dead, ledger, redis.Options{Prefix: prefix(t)})
	ctx := t.Context()
	if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", TTL: time.Minute}); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Grant: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Ping: %v", err)
	}
	// A lease granted while Redis was up cannot be judged without it.
	l, err := ledger.GrantClaimed(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resource(ctx, "r"); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Resource: %v", err)
	}
	if _, err := s.Renew(ctx, l.ID, 0); !errors.Is(err, tokens.ErrStoreUnavailable) {
		t.Fatalf("Renew: %v", err)
	}
}

// A lease whose Redis claim is gone before the expiry the Ledger recorded
// does not hold its owner's slot against the grant that supersedes it: the
// owner takes the resource again under a cap of 1. (The Ledger counts the
// owner's leases, and leaves the superseded one out.)
func TestCapFreedByLostClaim(t *testing.T) {
	t.Parallel()
	e := open(t, -1)
	ctx := t.Context()
	req := func() tokens.GrantRequest {
		return tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "acct:cap", Holder: "h", Owner: "o", MaxLeases: 1, TTL: time.Minute}
	}
	old, err := e.store.Grant(ctx, req())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, e.store.LeaseKey("acct:cap")).Err(); err != nil {
		t.Fatal(err)
	}
	next, err := e.store.Grant(ctx, req())
	if err != nil {
		t.Fatalf("grant after the claim was lost, under a cap of 1: %v", err)
	}
	if next.Token <= old.Token {
		t.Fatalf("token %d after %d", next.Token, old.Token)
	}
	other := req()
	other.Resource = "acct:cap2"
	if _, err := e.store.Grant(ctx, other); !errors.Is(err, tokens.ErrTooManyLeases) {
		t.Fatalf("a second resource under a cap of 1: %v, want ErrTooManyLeases", err)
	}
}

// TestRatesConformance runs the shared rate-limit suite on two stores on
// one prefix, each with a Redis client of its own, as two replicas.
func TestRatesConformance(t *testing.T) {
	client(t, -1)
	storagetest.RunRates(t, storagetest.RateHarness{
		Replicas: func(t *testing.T) (a, b storagetest.RateTaker) {
			e := open(t, -1)
			return e.store, redis.New(client(t, -1), e.ledger, redis.Options{Prefix: e.prefix})
		},
	})
}

// slowLedger records grants and renewals late, as a busy PostgreSQL does:
// the claim is set, then the Ledger counts the TTL from its own later clock.
type slowLedger struct {
	*postgres.Store
	delay time.Duration
}

func (l slowLedger) GrantClaimed(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	time.Sleep(l.delay)
	return l.Store.GrantClaimed(ctx, req)
}

func (l slowLedger) Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error) {
	time.Sleep(l.delay)
	return l.Store.Renew(ctx, leaseID, ttl)
}

// A lease lasts until the expiry its holder was given, however late the
// Ledger recorded its grant or renewal; once that expiry passes, the next
// grant takes the resource at once (the claim's grace delays no one), and
// the old lease can be neither renewed nor released.
func TestLeaseLastsUntilItsExpiry(t *testing.T) {
	t.Parallel()
	e := open(t, -1)
	ctx := t.Context()
	const ttl, late, before = 2 * time.Second, 400 * time.Millisecond, 250 * time.Millisecond
	s := redis.New(e.rdb, slowLedger{Store: e.ledger, delay: late}, redis.Options{Prefix: e.prefix})
	current := func(when string, l tokens.Lease) {
		t.Helper()
		got, r, err := s.LeaseState(ctx, l.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.Now.Before(l.ExpiresAt) {
			if st := r.StateOf(got, r.Now); st != tokens.StateCurrent {
				t.Fatalf("%s, %v before its expiry: the lease reads %v, want current (its claim ended before the expiry the Ledger gave)",
					when, l.ExpiresAt.Sub(r.Now), st)
			}
		}
	}
	a := grant(t, s, "r", ttl)
	c := grant(t, s, "q", ttl)
	c, err := s.Renew(ctx, c.ID, ttl)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	time.Sleep(time.Until(a.ExpiresAt.Add(-before)))
	current("granted", a)
	time.Sleep(time.Until(c.ExpiresAt.Add(-before)))
	current("renewed", c)

	time.Sleep(time.Until(a.ExpiresAt.Add(50 * time.Millisecond)))
	if _, err := s.Renew(ctx, a.ID, ttl); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew after the expiry: %v, want ErrLeaseLost", err)
	}
	if _, err := s.Release(ctx, a.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release after the expiry: %v, want ErrLeaseLost", err)
	}
	b, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: ttl})
	if err != nil {
		t.Fatalf("Grant after the expiry, within the claim's grace: %v", err)
	}
	if b.Token != a.Token+1 {
		t.Fatalf("token after the expiry = %d, want %d", b.Token, a.Token+1)
	}
	if err := judge(t, s, a); !errors.Is(err, tokens.ErrStaleToken) {
		t.Fatalf("the old lease's write: %v, want ErrStaleToken", err)
	}
	if err := judge(t, s, b); err != nil {
		t.Fatalf("the new lease's write: %v", err)
	}
}

// A grant that finds a claim still held by a lease the Ledger reads as
// ended within its grace, but whose claim another grant takes first, is
// told the resource is held, not granted twice.
func TestGrantsRacingForAnEndedLeasesClaim(t *testing.T) {
	t.Parallel()
	e := open(t, -1)
	ctx := t.Context()
	a := grant(t, e.store, "r", 300*time.Millisecond)
	time.Sleep(time.Until(a.ExpiresAt.Add(50 * time.Millisecond)))
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []tokens.Lease
	for range n {
		wg.Go(func() {
			l, err := e.store.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: time.Minute})
			switch {
			case err == nil:
				mu.Lock()
				won = append(won, l)
				mu.Unlock()
			case !errors.Is(err, tokens.ErrLeaseHeld):
				t.Errorf("Grant: %v", err)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 || won[0].Token != a.Token+1 {
		t.Fatalf("grants won after the expiry: %+v, want one, token %d", won, a.Token+1)
	}
}
