package bolt

// The bounded cache of resource states and leases that serves the hot reads
// without a transaction, and the reads that fill it from the file.

import (
	"context"
	"sync"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// DefaultCacheEntries is the default of Options.CacheEntries. An entry costs
// about 250-400 bytes of heap (a resource state with its current lease, or
// a lease), so the cache stays below ~30 MB whatever the file holds. It was
// 65,536: halved, a million grants end at ~55 MB of anonymous memory
// instead of ~95 (docs/benchmarks.md, "Memory"), and a resource or lease
// stays cached until 32,768 to 65,536 others went in after its last use.
const DefaultCacheEntries = 32_768

// cache holds copies of committed resource states (with their current
// lease) and leases, so that the read path of a fenced write (Lease, then
// Resource) usually opens no transaction. It is bounded: each kind is kept
// in two generations of at most max entries; when the newest is full it
// becomes the old one and the old one is dropped, and a hit in the old
// generation moves the entry to the new one. So what is read or written
// often stays, and the rest is read from the file again when needed.
//
// Correctness never depends on what is cached: every mutation decides on
// the file inside its transaction. What the cache must never do is hold a
// value older than the file's, and two rules keep it so:
//   - a mutation updates the cache after its commit, under the resource's
//     exclusive lock, so updates of one resource land in commit order;
//   - a miss is filled under the resource's shared lock (no mutation of it
//     can commit meanwhile), and a lease is filled only if no lease was
//     garbage-collected during the fill (epoch), since collection takes no
//     resource lock.
type cache struct {
	mu     sync.RWMutex
	max    int
	res    [2]map[string]*entry        // resource name -> state; [0] is the newest
	leases [2]map[string]*tokens.Lease // lease id -> lease
	epoch  uint64                      // bumped by every collection of leases
}

// entry is a resource's persisted state and its current lease (nil if it
// has none).
type entry struct {
	st    resState
	lease *tokens.Lease
}

func newCache(max int) *cache {
	c := &cache{max: max}
	for i := range 2 {
		c.res[i] = make(map[string]*entry)
		c.leases[i] = make(map[string]*tokens.Lease)
	}
	return c
}

// lookup finds k in the generations gens under c.mu, moving a hit in the
// old generation to the new one.
func lookup[V comparable](c *cache, gens *[2]map[string]V, k string) (V, bool) {
	c.mu.RLock()
	v, ok := gens[0][k]
	if !ok {
		v, ok = gens[1][k]
		c.mu.RUnlock()
		if ok {
			c.mu.Lock()
			// Unless something newer went in meanwhile, or the generations
			// turned and dropped it.
			if _, newer := gens[0][k]; !newer && gens[1][k] == v {
				insert(c, gens, k, v)
			}
			c.mu.Unlock()
		}
		return v, ok
	}
	c.mu.RUnlock()
	return v, ok
}

// insert puts k into the newest generation; c.mu is held.
func insert[V any](c *cache, gens *[2]map[string]V, k string, v V) {
	if len(gens[0]) >= c.max {
		gens[1], gens[0] = gens[0], make(map[string]V, c.max/4)
	}
	gens[0][k] = v
	delete(gens[1], k)
}

func (c *cache) resource(name string) (*entry, bool) { return lookup(c, &c.res, name) }

func (c *cache) lease(id string) (*tokens.Lease, bool) { return lookup(c, &c.leases, id) }

// set records a committed state of resource name and its current lease cur
// (nil if none). The caller holds the resource's exclusive lock, or its
// shared lock while filling a miss. Other leases of the resource are left
// as they are: a mutation that supersedes one does not change its record,
// and putting it back here could revive one that collectLeases deleted
// meanwhile (collection takes no resource lock).
func (c *cache) set(name string, st resState, cur *tokens.Lease) {
	c.mu.Lock()
	insert(c, &c.res, name, &entry{st: st, lease: cur})
	if cur != nil {
		insert(c, &c.leases, cur.ID, cur)
	}
	c.mu.Unlock()
}

// fillLease records a lease read while its resource's shared lock was
// held, unless leases were collected since epoch.
func (c *cache) fillLease(l *tokens.Lease, epoch uint64) {
	c.mu.Lock()
	if c.epoch == epoch {
		insert(c, &c.leases, l.ID, l)
	}
	c.mu.Unlock()
}

func (c *cache) leaseEpoch() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.epoch
}

// dropLeases forgets collected leases.
func (c *cache) dropLeases(ids []string) {
	c.mu.Lock()
	for _, id := range ids {
		delete(c.leases[0], id)
		delete(c.leases[1], id)
	}
	c.epoch++
	c.mu.Unlock()
}

// resourceEntry returns resource name's committed state and current lease,
// from the cache or else from the file. The caller must not hold the
// resource's lock.
func (s *Store) resourceEntry(ctx context.Context, name string) (*entry, error) {
	if e, ok := s.cache.resource(name); ok {
		return e, nil
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	unlock, err := s.locks.Shared(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	e := &entry{}
	err = s.db.View(func(tx *bbolt.Tx) error {
		var err error
		if e.st, err = getResource(tx, name); err != nil {
			return err
		}
		e.lease, err = getLease(tx, e.st.current)
		return err
	})
	if err != nil {
		return nil, tokens.Unavailable("read resource", err)
	}
	if s.fillHook != nil {
		s.fillHook()
	}
	// A name never granted nor drained is not cached: lookups of any
	// name (GET /v1/resources/{name}, the dashboard) would otherwise push
	// the resources that writes use out of the cache.
	if e.st != (resState{}) {
		s.cache.set(name, e.st, e.lease)
	}
	return e, nil
}

// leaseByID returns the committed lease leaseID, from the cache or else from
// the file; ErrNotFound if there is none. The caller must not hold the
// lease's resource's lock.
func (s *Store) leaseByID(ctx context.Context, leaseID string) (*tokens.Lease, error) {
	if l, ok := s.cache.lease(leaseID); ok {
		return l, nil
	}
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	defer s.leave()
	epoch := s.cache.leaseEpoch()
	read := func() (*tokens.Lease, error) {
		var l *tokens.Lease
		err := s.db.View(func(tx *bbolt.Tx) error {
			var err error
			l, err = getLease(tx, leaseID)
			return err
		})
		if err != nil {
			return nil, tokens.Unavailable("read lease", err)
		}
		if l == nil {
			return nil, notFound()
		}
		return l, nil
	}
	// The first read finds the resource whose shared lock orders the
	// second against renewals and releases.
	l, err := read()
	if err != nil {
		return nil, err
	}
	unlock, err := s.locks.Shared(ctx, l.Resource)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if l, err = read(); err != nil {
		return nil, err
	}
	if s.fillHook != nil {
		s.fillHook()
	}
	s.cache.fillLease(l, epoch)
	return l, nil
}
