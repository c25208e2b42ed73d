// Package bolt is fencegw's embedded store: tokens, leases, lease history and
// the rejection log in one bbolt file, for a single gateway process.
//
// Every mutation is one bbolt read-write transaction that checks the
// persisted state and changes it, run through DB.Batch so that concurrent
// mutations of different resources share one fsync (group commit). A call
// returns only after its transaction was committed and synced: a token is
// durable before it is handed out. Mutations of the same resource are
// serialised by a per-resource lock held across the transaction and the
// cache update, so the in-memory cache changes in commit order.
//
// The hot read path of the gateway, Lease and Resource, is served from that
// cache without opening a transaction.
package bolt

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/internal/batch"
	"github.com/fencegw/fencegw/internal/failpoint"
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

// maxBatchDelay bounds how long a mutation waits for others to share its
// commit. bbolt's default (10 ms) adds that much latency to every grant and,
// with a fixed number of callers, caps throughput at callers/10 ms; shorter
// delays split callers into more, smaller commits. Measured on a 2-core VM
// with 64 acquirers (BenchmarkGrantParallel): 1 ms and 2 ms were best
// (8,000–11,000 grants/s), 5 ms and 0.5 ms about half of that.
const maxBatchDelay = time.Millisecond

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
	// Logger receives operational messages; nil means slog.Default().
	Logger *slog.Logger
}

// Bucket names.
var (
	bucketMeta       = []byte("meta")
	bucketResources  = []byte("resources")
	bucketLeases     = []byte("leases")
	bucketRejections = []byte("rejections")
	bucketRejIndex   = []byte("rejections_by_resource") // one sub-bucket per resource: id -> nil
	bucketHistory    = []byte("history")                // one sub-bucket per resource: seq -> event

	keyClean = []byte("clean_shutdown")
)

// Store is a tokens.Store on a bbolt file. It is safe for concurrent use.
type Store struct {
	db     *bbolt.DB
	now    func() time.Time
	log    *slog.Logger
	opts   Options
	locks  *tokens.LocalLocker // serialises mutations of one resource
	closed atomic.Bool

	// life is held shared by every operation that uses db and exclusively
	// by Close, so Close writes its marker after the last commit.
	life sync.RWMutex

	// mu guards the cache, a copy of the committed leases and resource
	// states. It is changed only after a successful commit, under the
	// resource's lock.
	mu        sync.RWMutex
	leases    map[string]*tokens.Lease
	resources map[string]*resState

	stopGC   chan struct{}
	stopOnce sync.Once
	gcDone   chan struct{}

	recorder *batch.Batcher[tokens.Rejection, tokens.Rejection] // log.go

	keys *keyLog // idempotency records (keys.go)
}

var _ tokens.Store = (*Store)(nil)

// Open opens (or creates) the store file at path, creating its directory if
// missing. Only one process can have it open; a second Open waits up to a
// second for the file lock and then fails with ErrUnavailable.
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
	db.MaxBatchDelay = maxBatchDelay
	s := &Store{
		db:        db,
		now:       opts.Now,
		log:       opts.Logger,
		opts:      opts,
		locks:     tokens.NewLocalLocker(),
		leases:    make(map[string]*tokens.Lease),
		resources: make(map[string]*resState),
		stopGC:    make(chan struct{}),
		gcDone:    make(chan struct{}),
	}
	if err := s.recover(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, err
	}
	if err := s.openKeys(); err != nil {
		_ = db.Close()
		return nil, err
	}
	go s.gcLoop()
	s.recorder = s.newRecorder()
	return s, nil
}

// recover creates the buckets, applies the crash drain if the previous
// process did not close the store, and clears the clean-shutdown marker.
func (s *Store) recover() error {
	err := s.db.Update(func(tx *bbolt.Tx) error {
		fresh := tx.Bucket(bucketMeta) == nil
		for _, name := range [][]byte{bucketMeta, bucketResources, bucketLeases, bucketRejections, bucketRejIndex, bucketHistory} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		clean := meta.Get(keyClean) != nil
		// The marker is cleared now and written again by Close: if it is
		// missing at the next Open, this process did not shut down cleanly.
		if err := meta.Delete(keyClean); err != nil {
			return err
		}
		if fresh || clean || s.opts.CrashDrain < 0 {
			return nil
		}
		// The previous process died (kill -9, power loss, panic). It may
		// have forwarded writes whose outcome it never saw: the upstream
		// has them and may still apply them. Their shared locks died with
		// the process, so nothing would stop a new grant from fencing the
		// old holder while its write is still on the way. Every resource
		// whose lease was live, or ended so recently that a write admitted
		// just before the end may still be in flight (within CrashDrain,
		// the forward timeout), is closed to grants until now+CrashDrain,
		// exactly as a forward with an unknown outcome would have done.
		now := s.now()
		horizon := now.Add(-s.opts.CrashDrain)
		until := now.Add(s.opts.CrashDrain)
		res, leases := tx.Bucket(bucketResources), tx.Bucket(bucketLeases)
		type update struct {
			name []byte
			st   resState
		}
		var updates []update
		err := res.ForEach(func(k, v []byte) error {
			st, err := decodeResource(v)
			if err != nil {
				return fmt.Errorf("resource %q: %w", k, err)
			}
			if st.current == "" {
				return nil
			}
			lv := leases.Get([]byte(st.current))
			if lv == nil {
				return nil
			}
			l, err := decodeLease(st.current, lv)
			if err != nil {
				return fmt.Errorf("lease %s: %w", tokens.LeaseHint(st.current), err)
			}
			if l.Released() || !l.ExpiresAt.After(horizon) || !st.drainUntil.Before(until) {
				return nil
			}
			st.drainUntil = until
			updates = append(updates, update{bytes.Clone(k), st})
			return nil
		})
		if err != nil {
			return err
		}
		for _, u := range updates {
			if err := res.Put(u.name, encodeResource(&u.st)); err != nil {
				return err
			}
		}
		s.log.Warn("store was not closed cleanly; draining resources whose writes may still be in flight",
			"resources", len(updates), "drain", s.opts.CrashDrain)
		return nil
	})
	if err != nil {
		return tokens.Unavailable("recover store", err)
	}
	return nil
}

// load fills the cache from the file.
func (s *Store) load() error {
	err := s.db.View(func(tx *bbolt.Tx) error {
		err := tx.Bucket(bucketLeases).ForEach(func(k, v []byte) error {
			l, err := decodeLease(string(k), v)
			if err != nil {
				return fmt.Errorf("lease %s: %w", tokens.LeaseHint(string(k)), err)
			}
			s.leases[l.ID] = &l
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketResources).ForEach(func(k, v []byte) error {
			st, err := decodeResource(v)
			if err != nil {
				return fmt.Errorf("resource %q: %w", k, err)
			}
			s.resources[string(k)] = &st
			return nil
		})
	})
	if err != nil {
		return tokens.Unavailable("load store", err)
	}
	return nil
}

// Close writes the clean-shutdown marker and closes the file. Operations
// after Close return ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	// Stop the collector first: it enters like any operation.
	s.stopOnce.Do(func() { close(s.stopGC) })
	<-s.gcDone
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	// No caller is left (they hold life while they wait); the recorder
	// commits what a caller that gave up waiting left queued, then stops.
	s.recorder.Close()
	s.closeKeys()
	err := s.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyClean, []byte{1})
	})
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return tokens.Unavailable("close store", err)
	}
	return nil
}

var errClosed = errors.New("store closed")

// enter starts an operation that uses the file; leave must be called after.
func (s *Store) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
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
		return nil, err
	}
	return func() { unlock(); s.leave() }, nil
}

// update runs fn in a batched read-write transaction. fn may run more than
// once (bbolt re-runs a batch when another call in it fails), so it must
// reset whatever it reports. Domain refusals are reported through fn's
// closure, not as fn's error: an error aborts the whole shared batch.
func (s *Store) update(op string, fn func(tx *bbolt.Tx) error) error {
	if err := s.db.Batch(fn); err != nil {
		return tokens.Unavailable(op, err)
	}
	return nil
}

// cachedLeaseResource returns the resource of a cached lease.
func (s *Store) cachedLeaseResource(id string) (string, bool) {
	s.mu.RLock()
	l, ok := s.leases[id]
	var r string
	if ok {
		r = l.Resource
	}
	s.mu.RUnlock()
	return r, ok
}

func getResource(tx *bbolt.Tx, name string) (resState, error) {
	v := tx.Bucket(bucketResources).Get([]byte(name))
	if v == nil {
		return resState{}, nil
	}
	st, err := decodeResource(v)
	if err != nil {
		return resState{}, fmt.Errorf("resource %q: %w", name, err)
	}
	return st, nil
}

func getLease(tx *bbolt.Tx, id string) (*tokens.Lease, error) {
	if id == "" {
		return nil, nil
	}
	v := tx.Bucket(bucketLeases).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	l, err := decodeLease(id, v)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", tokens.LeaseHint(id), err)
	}
	return &l, nil
}

func putLease(tx *bbolt.Tx, l *tokens.Lease) error {
	return tx.Bucket(bucketLeases).Put([]byte(l.ID), encodeLease(l))
}

func putResource(tx *bbolt.Tx, name string, st *resState) error {
	return tx.Bucket(bucketResources).Put([]byte(name), encodeResource(st))
}

// addEvent appends to the resource's history and drops the oldest events
// beyond the cap.
func (s *Store) addEvent(tx *bbolt.Tx, ev tokens.Event) error {
	b, err := tx.Bucket(bucketHistory).CreateBucketIfNotExists([]byte(ev.Resource))
	if err != nil {
		return err
	}
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	if err := b.Put(seqKey(seq), encodeEvent(&ev)); err != nil {
		return err
	}
	limit := uint64(s.opts.MaxHistoryPerResource)
	if seq <= limit {
		return nil
	}
	// Sequences have no gaps except at the front, so everything at or
	// below seq-limit is beyond the cap; usually that is one event.
	var old [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n, ok := keySeq(k)
		if ok && n > seq-limit {
			break
		}
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func event(kind tokens.EventKind, at time.Time, l *tokens.Lease) tokens.Event {
	return tokens.Event{At: at, Resource: l.Resource, Kind: kind, Token: l.Token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

// Grant implements tokens.Store.
func (s *Store) Grant(ctx context.Context, req tokens.GrantRequest) (tokens.Lease, error) {
	if failpoint.NotDurable {
		return s.grantBeforeDurable(req)
	}
	unlock, err := s.lockResource(ctx, req.Resource)
	if err != nil {
		return tokens.Lease{}, err
	}
	defer unlock()
	var (
		lease   tokens.Lease
		st      resState
		refusal error
	)
	err = s.update("grant", func(tx *bbolt.Tx) error {
		refusal = nil
		now := s.now()
		cur, err := getResource(tx, req.Resource)
		if err != nil {
			return err
		}
		holder, err := getLease(tx, cur.current)
		if err != nil {
			return err
		}
		if holder != nil && holder.Token == cur.token && holder.Live(now) {
			refusal = &tokens.Error{Kind: tokens.ErrLeaseHeld, Resource: req.Resource, Holder: holder.Holder,
				CurrentToken: cur.token, ExpiresAt: holder.ExpiresAt, RetryAfter: holder.Remaining(now)}
			return nil
		}
		if now.Before(cur.drainUntil) {
			refusal = &tokens.Error{Kind: tokens.ErrFenceBusy, Resource: req.Resource, CurrentToken: cur.token,
				Detail: "draining: a write whose outcome is unknown may still land", RetryAfter: cur.drainUntil.Sub(now)}
			return nil
		}
		if tx.Bucket(bucketLeases).Get([]byte(req.LeaseID)) != nil {
			refusal = tokens.Invalid("lease_id", "already used")
			return nil
		}
		lease = tokens.Lease{ID: req.LeaseID, Resource: req.Resource, Holder: req.Holder, Owner: req.Owner, Token: cur.token + 1,
			TTL: req.TTL, GrantedAt: now, ExpiresAt: now.Add(req.TTL)}
		st = resState{token: lease.Token, current: lease.ID, drainUntil: cur.drainUntil}
		if err := putLease(tx, &lease); err != nil {
			return err
		}
		if err := putResource(tx, req.Resource, &st); err != nil {
			return err
		}
		return s.addEvent(tx, event(tokens.EventGranted, now, &lease))
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	s.mu.Lock()
	l := lease
	s.leases[l.ID] = &l
	s.resources[req.Resource] = &st
	s.mu.Unlock()
	return lease, nil
}

// lost is the ErrLeaseLost for l, given its resource's state.
func lost(l *tokens.Lease, st resState) error {
	why := "expired"
	switch {
	case st.current != l.ID || st.token != l.Token:
		why = "superseded by a newer grant"
	case l.Released():
		why = "released"
	}
	return &tokens.Error{Kind: tokens.ErrLeaseLost, Resource: l.Resource, Detail: why, Token: l.Token,
		CurrentToken: st.token, Holder: l.Holder, ExpiresAt: l.ExpiresAt}
}

func notFound() error {
	return &tokens.Error{Kind: tokens.ErrNotFound, Detail: "no such lease"}
}

// lockLeaseResource takes the per-resource mutation lock of the lease's
// resource: ErrNotFound for an unknown lease, ErrUnavailable once closed.
func (s *Store) lockLeaseResource(ctx context.Context, leaseID string) (func(), error) {
	resource, ok := s.cachedLeaseResource(leaseID)
	if !ok {
		if s.closed.Load() {
			return nil, tokens.Unavailable("bolt", errClosed)
		}
		return nil, notFound()
	}
	return s.lockResource(ctx, resource)
}

// Renew implements tokens.Store.
func (s *Store) Renew(ctx context.Context, leaseID string, ttl time.Duration) (tokens.Lease, error) {
	unlock, err := s.lockLeaseResource(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	defer unlock()
	var (
		lease   tokens.Lease
		refusal error
	)
	err = s.update("renew", func(tx *bbolt.Tx) error {
		refusal = nil
		now := s.now()
		l, err := getLease(tx, leaseID)
		if err != nil {
			return err
		}
		if l == nil {
			refusal = notFound()
			return nil
		}
		st, err := getResource(tx, l.Resource)
		if err != nil {
			return err
		}
		if st.current != l.ID || st.token != l.Token || !l.Live(now) {
			refusal = lost(l, st)
			return s.addEvent(tx, event(tokens.EventRenewRefused, now, l))
		}
		if ttl != 0 {
			l.TTL = ttl
		}
		l.ExpiresAt = now.Add(l.TTL)
		lease = *l
		if err := putLease(tx, l); err != nil {
			return err
		}
		return s.addEvent(tx, event(tokens.EventRenewed, now, l))
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	s.mu.Lock()
	l := lease
	s.leases[l.ID] = &l
	s.mu.Unlock()
	return lease, nil
}

// Release implements tokens.Store.
func (s *Store) Release(ctx context.Context, leaseID string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, "")
}

// Revoke implements tokens.Store: Release, recorded as revoked by by.
func (s *Store) Revoke(ctx context.Context, leaseID, by string) (tokens.Lease, error) {
	return s.release(ctx, leaseID, by)
}

// release ends the lease; revokedBy, if set, names the administrator who
// ordered it.
func (s *Store) release(ctx context.Context, leaseID, revokedBy string) (tokens.Lease, error) {
	unlock, err := s.lockLeaseResource(ctx, leaseID)
	if err != nil {
		return tokens.Lease{}, err
	}
	defer unlock()
	var (
		lease   tokens.Lease
		changed bool
		refusal error
	)
	err = s.update("release", func(tx *bbolt.Tx) error {
		refusal, changed = nil, false
		now := s.now()
		l, err := getLease(tx, leaseID)
		if err != nil {
			return err
		}
		if l == nil {
			refusal = notFound()
			return nil
		}
		lease = *l
		if l.Released() {
			return nil // idempotent: its holder already released it
		}
		st, err := getResource(tx, l.Resource)
		if err != nil {
			return err
		}
		if st.current != l.ID || st.token != l.Token || !l.Live(now) {
			refusal = lost(l, st)
			return s.addEvent(tx, event(tokens.EventReleaseRefused, now, l))
		}
		l.ReleasedAt = now
		lease, changed = *l, true
		if err := putLease(tx, l); err != nil {
			return err
		}
		ev := event(tokens.EventReleased, now, l)
		if revokedBy != "" {
			ev.Kind, ev.Actor = tokens.EventRevoked, revokedBy
		}
		return s.addEvent(tx, ev)
	})
	if err != nil {
		return tokens.Lease{}, err
	}
	if refusal != nil {
		return tokens.Lease{}, refusal
	}
	if changed {
		s.mu.Lock()
		l := lease
		s.leases[l.ID] = &l
		s.mu.Unlock()
	}
	return lease, nil
}

// Lease implements tokens.Store from the cache, without touching the file.
func (s *Store) Lease(ctx context.Context, leaseID string) (tokens.Lease, error) {
	if s.closed.Load() {
		return tokens.Lease{}, tokens.Unavailable("bolt", errClosed)
	}
	s.mu.RLock()
	l, ok := s.leases[leaseID]
	var out tokens.Lease
	if ok {
		out = *l
	}
	s.mu.RUnlock()
	if !ok {
		return tokens.Lease{}, notFound()
	}
	return out, nil
}

// Resource implements tokens.Store from the cache, without touching the
// file. A resource that was only ever drained, never granted, is not found.
func (s *Store) Resource(ctx context.Context, name string) (tokens.Resource, error) {
	if s.closed.Load() {
		return tokens.Resource{}, tokens.Unavailable("bolt", errClosed)
	}
	r := tokens.Resource{Name: name}
	s.mu.RLock()
	st, ok := s.resources[name]
	if ok && st.token > 0 {
		r.Token, r.DrainUntil = st.token, st.drainUntil
		if l, ok := s.leases[st.current]; ok {
			c := *l
			r.Lease = &c
		}
	}
	s.mu.RUnlock()
	if r.Token == 0 {
		return tokens.Resource{}, &tokens.Error{Kind: tokens.ErrNotFound, Resource: name, Detail: "never granted"}
	}
	r.Now = s.now()
	return r, nil
}

// CurrentLeases implements tokens.Store from the cache. limit <= 0 means
// 100; it is capped at 1000.
func (s *Store) CurrentLeases(ctx context.Context, limit int) ([]tokens.Lease, error) {
	if s.closed.Load() {
		return nil, tokens.Unavailable("bolt", errClosed)
	}
	limit = clampLimit(limit)
	now := s.now()
	var out []tokens.Lease
	s.mu.RLock()
	for _, st := range s.resources {
		if l, ok := s.leases[st.current]; ok && l.Token == st.token && l.Live(now) {
			out = append(out, *l)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b tokens.Lease) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Resource, b.Resource))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func clampLimit(limit int) int {
	if limit <= 0 {
		return defaultLimit
	}
	return min(limit, maxLimit)
}

// Drain implements tokens.Store.
func (s *Store) Drain(ctx context.Context, resource string, d time.Duration) error {
	unlock, err := s.lockResource(ctx, resource)
	if err != nil {
		return err
	}
	defer unlock()
	var st resState
	err = s.update("drain", func(tx *bbolt.Tx) error {
		var err error
		st, err = getResource(tx, resource)
		if err != nil {
			return err
		}
		until := s.now().Add(d)
		if !until.After(st.drainUntil) {
			return nil
		}
		st.drainUntil = until
		return putResource(tx, resource, &st)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.resources[resource] = &st
	s.mu.Unlock()
	return nil
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
