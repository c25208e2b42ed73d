// Package bolt is fencegw's embedded store: tokens, leases, lease history and
// the rejection log in one bbolt file, for a single gateway process.
//
// Every change is one bbolt read-write transaction that checks the
// persisted state and changes it, run through the store's one group commit
// (groupcommit.go) so that concurrent changes share one fsync. A call
// returns only after its transaction was committed and synced (a token is
// durable before it is handed out), or with an error once its context ends
// (update: the commit goes on without it). Mutations of the same resource
// are serialised by a per-resource lock held across the transaction and the
// cache update, also after a caller gave up, so the in-memory cache changes
// in commit order.
//
// The hot read path of the gateway, Lease and Resource, is served from that
// cache without opening a transaction. The cache is bounded (cache.go):
// what it does not hold is read from the file, so the heap does not grow
// with the number of resources the file knows.
package bolt

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// Defaults for Options fields left zero.
const (
	DefaultMaxRejections         = 1_000_000
	DefaultMaxHistoryPerResource = 1000
	// DefaultCrashDrain is the drain period applied after a crash; it
	// matches the gateway's default drain period (the forward timeout).
	DefaultCrashDrain = tokens.DefaultDrainPeriod
	// LeaseRetention is how long a lease that ended (expired or released)
	// and is no longer its resource's current lease is kept before it is
	// garbage-collected. A collected lease id is unknown from then on
	// (ErrNotFound, and unknown_lease for a write).
	LeaseRetention = 24 * time.Hour
)

// Query limits for Rejections and History.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Now is the store's clock, used for lease expiry; nil means time.Now.
	Now func() time.Time
	// CrashDrain is the drain period applied, when the previous process did
	// not shut down cleanly, to every resource whose lease may still have had
	// a write in flight. 0 means DefaultCrashDrain; negative disables it.
	CrashDrain time.Duration
	// MaxRejections caps the rejection log; the oldest entries are dropped.
	// 0 means DefaultMaxRejections.
	MaxRejections int
	// MaxHistoryPerResource caps each resource's lease history; the oldest
	// events are dropped. 0 means DefaultMaxHistoryPerResource.
	MaxHistoryPerResource int
	// MaxIdempotencyRecords caps the idempotency records kept (keys.go);
	// the oldest go first. 0 means DefaultMaxIdempotencyRecords.
	MaxIdempotencyRecords int
	// CacheEntries bounds the resource states, and separately the leases,
	// kept in memory, in each of the cache's two generations (cache.go).
	// 0 means DefaultCacheEntries.
	CacheEntries int
	// Logger receives operational messages; nil means slog.Default().
	Logger *slog.Logger
	// InFlight, if set, reports how many fenced writes may still be on
	// their way to an upstream: in the embedded mode, the shared holds of
	// the mode's lock (tokens.LocalLocker.HeldShared). Close asks it once
	// no call is left and new ones fail; if it reports any, the file is
	// closed without the clean-shutdown marker, and the next Open drains
	// as after a crash (recover.go).
	InFlight func() int
}

// Bucket names.
var (
	bucketMeta       = []byte("meta")
	bucketResources  = []byte("resource_states") // resourcePrefix(name) -> state (tx.go)
	bucketLeases     = []byte("lease_records")   // leaseKey(id) -> lease (tx.go)
	bucketRejections = []byte("rejections")
	bucketRejIndex   = []byte("rejections_by_resource") // one sub-bucket per resource: id -> nil
	bucketRejRepeats = []byte("rejections_by_repeat")   // tokens.Rejection.RepeatKey -> id of its latest entry
	bucketEvents     = []byte("events")                 // lease history (history.go): resource, seq -> event

	keyClean = []byte("clean_shutdown")
)

// Store is a tokens.Store on a bbolt file. It is safe for concurrent use.
type Store struct {
	db     *bbolt.DB
	group  *groupCommit // update's transactions
	slow   *slowLog     // commit durations, and the log of a slow disk (slow.go)
	now    func() time.Time
	log    *slog.Logger
	opts   Options
	locks  *tokens.LocalLocker // exclusive: a resource's mutations; shared: its cache fills
	closed atomic.Bool

	// life is held shared by every operation that uses db and exclusively
	// by Close, so Close writes its marker after the last commit.
	life sync.RWMutex

	// cache holds copies of committed leases and resource states, changed
	// only after a successful commit under the resource's lock.
	cache *cache
	// fillHook, if set (by tests), runs between a cache fill's read and
	// its insert: where a mutation committing unordered would be missed.
	fillHook func()

	stopGC   chan struct{}
	stopOnce sync.Once
	gcDone   chan struct{}

	keys *keyLog // idempotency records (keys.go)

	fills fillTracker // where pages split (tx.go); write transactions only
}

var _ tokens.Store = (*Store)(nil)

// Open opens (or creates) the store file at path, creating its directory if
// missing. Only one process can have it open; a second Open waits up to a
// second for the file lock and then fails with ErrStoreUnavailable.
func Open(path string, opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CrashDrain == 0 {
		opts.CrashDrain = DefaultCrashDrain
	}
	if opts.MaxRejections <= 0 {
		opts.MaxRejections = DefaultMaxRejections
	}
	if opts.MaxHistoryPerResource <= 0 {
		opts.MaxHistoryPerResource = DefaultMaxHistoryPerResource
	}
	if opts.MaxIdempotencyRecords <= 0 {
		opts.MaxIdempotencyRecords = DefaultMaxIdempotencyRecords
	}
	if opts.CacheEntries <= 0 {
		opts.CacheEntries = DefaultCacheEntries
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, tokens.Unavailable("create data directory", err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout: time.Second,
		// The freelist is rebuilt by scanning at open instead of being
		// written on every commit: cheaper commits.
		NoFreelistSync: true,
		FreelistType:   bbolt.FreelistMapType,
	})
	if err != nil {
		return nil, tokens.Unavailable("open "+path, err)
	}
	s := &Store{
		db:     db,
		group:  newGroupCommit(db),
		slow:   newSlowLog(),
		now:    opts.Now,
		log:    opts.Logger,
		opts:   opts,
		locks:  tokens.NewLocalLocker(),
		cache:  newCache(opts.CacheEntries),
		stopGC: make(chan struct{}),
		gcDone: make(chan struct{}),
	}
	s.group.gap = rejectionGap
	s.group.observe = func(d time.Duration, calls int, err error) { s.slow.committed(s.log, d, calls, err) }
	// The guard goes in first, in a commit of its own: a migration cut off
	// midway (a crash, a kill) leaves some records moved, and a version
	// older than the compact layout must refuse that file, not serve it
	// with the moved resources' tokens starting again at 1.
	if err := db.Update(putLayoutGuard); err != nil {
		_ = db.Close()
		return nil, tokens.Unavailable("open "+path, err)
	}
	if err := s.migrateResources(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.migrateLeases(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.recover(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.migrateHistory(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.openKeys(); err != nil {
		_ = db.Close()
		return nil, err
	}
	go s.gcLoop()
	return s, nil
}

// Close waits for every call in flight (and every commit a caller gave up
// waiting for), marks the file as closed cleanly and closes it. With
// fenced writes still in flight (Options.InFlight: a shutdown that gave
// up on a write whose body was still streaming in) it leaves the marker
// out: the process may exit with such a write half-forwarded, and the
// next Open must drain its resource as after a crash.
func (s *Store) Close() error {
	// Stop the collector first: it enters like any operation.
	s.stopOnce.Do(func() { close(s.stopGC) })
	<-s.gcDone
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	// No call is left: a caller holds life until its commit has ended,
	// also one that gave up waiting for it (update). A write admitted from
	// now on is not: the embedded mode admits under the shared lock and
	// then reads the resource, which fails once closed is set. So a write
	// that read it holds its lock now, and InFlight counts it.
	var err error
	if n := s.inFlight(); n > 0 {
		s.log.Warn("closing the store with fenced writes in flight: not marked clean, so the next start drains their resources as after a crash",
			"writes_in_flight", n)
	} else {
		err = s.db.Update(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keyClean, []byte{1})
		})
	}
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tokens.Unavailable("close store", err)
	}
	return nil
}

// inFlight is Options.InFlight's count, 0 without it.
func (s *Store) inFlight() int {
	if s.opts.InFlight == nil {
		return 0
	}
	return s.opts.InFlight()
}

var errClosed = errors.New("store closed")

// enter starts an operation that uses the file; leave must be called after.
func (s *Store) enter(ctx context.Context) error {
	if ctx.Err() != nil {
		return gaveUp("bolt", ctx)
	}
	s.life.RLock()
	if s.closed.Load() {
		s.life.RUnlock()
		return tokens.Unavailable("bolt", errClosed)
	}
	return nil
}

func (s *Store) leave() { s.life.RUnlock() }

// lockResource enters and takes the resource's mutation lock.
func (s *Store) lockResource(ctx context.Context, resource string) (func(), error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	unlock, err := s.locks.Exclusive(ctx, resource)
	if err != nil {
		s.leave()
		// The lock is held until the resource's previous change is in the
		// file (update), so a stalled disk shows here too.
		if ctx.Err() != nil {
			return nil, gaveUp("wait for the resource's previous commit", ctx)
		}
		return nil, err
	}
	return func() { unlock(); s.leave() }, nil
}

// update runs fn in the group commit (groupcommit.go) with c's options
// and waits for its commit until ctx ends. fn may run more than once (a
// batch is re-run when another call in it fails), so it must reset
// whatever it reports. Domain refusals are reported through fn's closure,
// not as fn's error: an error rolls back the whole shared batch.
//
// then, if set, runs once with the commit's result: before update returns
// if the caller waited for it; else, once the commit (which goes on
// without its caller) has ended, on a goroutine of its own. It gives back
// what must stay held until the change is in the file: the resource's
// lock (so that the next change of the resource, and the cache, follow
// this one), the caller's share of life (so that Close waits for it).
//
// A caller whose ctx ends first gets gaveUp's error: its change may still
// be committed (a grant then exists that nobody heard of, like a grant
// whose answer was lost), unless c.gone dropped it before it ran. Nothing that gave up is reported as done.
func (s *Store) update(ctx context.Context, op string, c *call, then func(error)) error {
	s.group.submit(c)
	select {
	case err := <-c.done:
		if then != nil {
			then(err)
		}
		if err != nil {
			return tokens.Unavailable(op, err)
		}
		return nil
	case <-ctx.Done():
		running := s.group.runningFor()
		if then != nil {
			go func() { then(<-c.done) }()
		}
		s.slow.gaveUp(s.log, op, running)
		return gaveUp(op, ctx)
	}
}

// gaveUp is the error of a call whose ctx ended before its answer: past
// its bound, ErrStoreUnavailable wrapping ctx's error (503 with
// Retry-After); its caller gone, ctx's error as it is (nobody reads the
// answer, and the gateway logs an abandoned request as such).
func gaveUp(op string, ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return tokens.Unavailable(op+": "+errGaveUp.Error(), ctx.Err())
	}
	return ctx.Err()
}

func clampLimit(limit int) int {
	if limit <= 0 {
		return defaultLimit
	}
	return min(limit, maxLimit)
}

// Ping implements tokens.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	defer s.leave()
	if err := s.db.View(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil {
			return errors.New("meta bucket missing")
		}
		return nil
	}); err != nil {
		return tokens.Unavailable("ping", err)
	}
	return nil
}
