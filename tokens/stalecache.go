package tokens

// The cache of stale_token verdicts, so that a storm of writes under a
// superseded lease is refused without a store read each.

import (
	"sync"
	"sync/atomic"
	"time"
)

// Stale-verdict cache bounds.
const (
	staleCacheTTL  = time.Second
	staleCacheSize = 4096
)

// staleCache remembers, for a short while, leases refused as stale_token:
// a superseded lease is stale for good (tokens never go down), so its next
// writes can be refused without reading the store. In a rejection storm,
// where a superseded holder sends the same lease again and again, that
// spares the store (on PostgreSQL, a round trip per refusal) and leaves it
// to the current holder. Only the facts reported with the refusal may age:
// the resource's current token is as of the cached read, until a grant
// through this Service forgets the resource's entries or the entry
// expires after staleCacheTTL. A grant on another replica, or a refusal
// that read the state just before a local grant and is cached just after
// it, shows the older current token for at most that long.
//
// Every write asks it first, so the miss is cheap: no lock at all while
// the cache is empty, a shared lock otherwise; expired entries are left
// for put to overwrite or evict.
type staleCache struct {
	size       atomic.Int64 // len(byID), read without mu
	mu         sync.RWMutex
	byID       map[string]staleEntry
	byResource map[string]map[string]struct{}
}

type staleEntry struct {
	lease Lease
	state Resource
	until time.Time // monotonic
}

func newStaleCache() *staleCache {
	return &staleCache{byID: make(map[string]staleEntry), byResource: make(map[string]map[string]struct{})}
}

// get returns the cached verdict for leaseID, if fresh.
func (c *staleCache) get(leaseID string) (Lease, Resource, bool) {
	if c.size.Load() == 0 {
		return Lease{}, Resource{}, false
	}
	c.mu.RLock()
	e, ok := c.byID[leaseID]
	c.mu.RUnlock()
	if !ok || time.Now().After(e.until) {
		return Lease{}, Resource{}, false
	}
	return e.lease, e.state, true
}

// put caches a stale_token verdict on lease given state.
func (c *staleCache) put(lease Lease, state Resource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byID[lease.ID]; !ok && len(c.byID) >= staleCacheSize {
		now := time.Now()
		for id, e := range c.byID {
			if now.After(e.until) {
				c.drop(id, e.lease.Resource)
			}
		}
		for id, e := range c.byID { // still full: evict one, any
			if len(c.byID) < staleCacheSize {
				break
			}
			c.drop(id, e.lease.Resource)
		}
	}
	c.byID[lease.ID] = staleEntry{lease: lease, state: state, until: time.Now().Add(staleCacheTTL)}
	c.size.Store(int64(len(c.byID)))
	ids := c.byResource[lease.Resource]
	if ids == nil {
		ids = make(map[string]struct{})
		c.byResource[lease.Resource] = ids
	}
	ids[lease.ID] = struct{}{}
}

// forget drops every entry of resource (a new grant changed its token).
func (c *staleCache) forget(resource string) {
	if c.size.Load() == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.byResource[resource] {
		delete(c.byID, id)
	}
	delete(c.byResource, resource)
	c.size.Store(int64(len(c.byID)))
}

func (c *staleCache) drop(id, resource string) {
	delete(c.byID, id)
	c.size.Store(int64(len(c.byID)))
	if ids := c.byResource[resource]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(c.byResource, resource)
		}
	}
}
