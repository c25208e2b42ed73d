package web

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Counts keeps in-memory counters for the dashboard: accepted writes per
// resource and token, and totals since the process started. The write path
// calls Accepted once per forwarded write, so it never touches disk and
// takes no lock in the common case (an existing resource, one of its
// recent tokens): a sync.Map load, a short scan and an atomic add.
//
// Counters are per process and reset on restart; with several gateway
// replicas each counts its own writes.
type Counts struct {
	started   time.Time
	resources sync.Map // string -> *resourceCounts
	nres      atomic.Int64
	accepted  atomic.Uint64
	rejected  atomic.Uint64
	overflow  atomic.Uint64 // accepted writes of resources past maxCountedResources
}

// Past maxCountedResources, writes to new resources count only in the
// total, so a client inventing resource names cannot grow memory without
// bound. Each resource remembers its tokensPerResource newest tokens.
const (
	maxCountedResources = 100_000
	tokensPerResource   = 8
)

type resourceCounts struct {
	mu    sync.Mutex // taken only to start counting a new token
	slots [tokensPerResource]tokenCount
	next  int // the slot the next new token takes (oldest first)
}

type tokenCount struct {
	token atomic.Int64
	n     atomic.Uint64
}

// NewCounts returns empty counters that started now.
func NewCounts() *Counts { return &Counts{started: time.Now()} }

// Started is when counting began.
func (c *Counts) Started() time.Time {
	if c == nil {
		return time.Time{}
	}
	return c.started
}

// Accepted counts one write under token that the gateway forwarded and the
// upstream answered. Safe for concurrent use; nil-safe.
func (c *Counts) Accepted(resource string, token int64) {
	if c == nil {
		return
	}
	c.accepted.Add(1)
	v, ok := c.resources.Load(resource)
	if !ok {
		if c.nres.Load() >= maxCountedResources {
			c.overflow.Add(1)
			return
		}
		var loaded bool
		v, loaded = c.resources.LoadOrStore(resource, &resourceCounts{})
		if !loaded {
			c.nres.Add(1)
		}
	}
	v.(*resourceCounts).add(token)
}

func (rc *resourceCounts) add(token int64) {
	for i := range rc.slots {
		if rc.slots[i].token.Load() == token {
			rc.slots[i].n.Add(1)
			return
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for i := range rc.slots { // another writer may have added it meanwhile
		if rc.slots[i].token.Load() == token {
			rc.slots[i].n.Add(1)
			return
		}
	}
	s := &rc.slots[rc.next]
	rc.next = (rc.next + 1) % tokensPerResource
	// A reader may briefly see the new token with the old count; counts
	// are for humans, and the window is one store.
	s.n.Store(1)
	s.token.Store(token)
}

// Rejected counts one refused write. Safe for concurrent use; nil-safe.
func (c *Counts) Rejected(tokens.Rejection) {
	if c == nil {
		return
	}
	c.rejected.Add(1)
}

// Tokens returns the accepted-write counts of resource's recent tokens.
func (c *Counts) Tokens(resource string) map[int64]uint64 {
	out := map[int64]uint64{}
	if c == nil {
		return out
	}
	v, ok := c.resources.Load(resource)
	if !ok {
		return out
	}
	rc := v.(*resourceCounts)
	for i := range rc.slots {
		if t := rc.slots[i].token.Load(); t != 0 {
			out[t] = rc.slots[i].n.Load()
		}
	}
	return out
}

// Totals are process-wide counts since Started.
type Totals struct {
	Started  time.Time `json:"started"`
	Accepted uint64    `json:"accepted_writes"`
	Rejected uint64    `json:"rejected_writes"`
}

// Totals returns the totals so far.
func (c *Counts) Totals() Totals {
	if c == nil {
		return Totals{}
	}
	return Totals{Started: c.started, Accepted: c.accepted.Load(), Rejected: c.rejected.Load()}
}
