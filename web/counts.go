package web

// Counts of forwarded and refused writes per resource and token, for the
// dashboard, persisted to the store where it can keep them.

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Counts counts forwarded writes per resource and token, for the timeline's
// "writes accepted under it", and totals of this process.
//
// The write path calls Accepted once per forwarded write: a sync.Map load
// and one atomic add, never a store round trip. With Persist, a flusher
// adds what was counted to the store (a tokens.WriteCounter) in one batch
// a second, and readers add the store's counts (every replica's, every
// earlier process's) to what this process has not flushed yet. A crash
// loses at most the last interval's counts; another replica's last
// interval shows once it flushes.
type Counts struct {
	started  time.Time
	res      sync.Map // resource -> *resourceCounts
	nEntries atomic.Int64
	accepted atomic.Uint64
	rejected atomic.Uint64
	overflow atomic.Uint64 // writes not counted per token (past maxCountedTokens)

	// flushMu orders a flush (Lock: store the batch, then advance flushed)
	// against readers (RLock: the store's counts plus the unflushed part),
	// so that a count is never both in the store and unflushed, nor in
	// neither. The write path never takes it.
	flushMu sync.RWMutex
	store   tokens.WriteCounter
	pending map[tokenKey]uint64 // counts of retired entries not yet stored
}

// Bounds of Counts. Past maxCountedTokens (resource, token) pairs in
// memory, writes count only in the totals, so a client inventing resource
// names cannot grow memory without bound. With Persist, a pair retires
// from memory after idleFlushes flushes without a write, and a resource
// with none left retires too.
const (
	maxCountedTokens = 100_000
	idleFlushes      = 3
	// maxPending bounds the retired counts kept while the store refuses
	// them; past it they are dropped (and the page undercounts).
	maxPending = 100_000
	closedBit  = uint64(1) << 63
)

type tokenKey struct {
	resource string
	token    int64
}

// resourceCounts are one resource's tokens. Entries are created, and the
// resource retired, under mu; counting into an existing entry takes no lock.
type resourceCounts struct {
	tokens sync.Map // int64 -> *tokenCount
	// last is the entry a write last counted in, found without a lookup
	// in tokens: a resource's writes come under one token until its next
	// grant, and the lookup was about half of Accepted's cost.
	last atomic.Pointer[lastToken]
	mu   sync.Mutex
	dead bool // retired: count in a fresh resourceCounts
}

// lastToken is a resource's entry last counted in, and its token.
type lastToken struct {
	token int64
	e     *tokenCount
}

type tokenCount struct {
	n       atomic.Uint64 // writes counted; closedBit once retired
	flushed uint64        // of n, stored (guarded by Counts.flushMu)
	idle    int           // flushes without a write (the flusher's own)
}

// NewCounts returns empty counters that started now.
func NewCounts() *Counts { return &Counts{started: time.Now(), pending: map[tokenKey]uint64{}} }

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
	for {
		v, ok := c.res.Load(resource)
		if !ok {
			v, _ = c.res.LoadOrStore(resource, &resourceCounts{})
		}
		rc := v.(*resourceCounts)
		if l := rc.last.Load(); l != nil && l.token == token {
			if l.e.n.Add(1)&closedBit == 0 {
				return
			}
			// Retired by the flusher before the add, as below: count in
			// the entry under the token now, or a fresh one.
		}
		e, ok := rc.tokens.Load(token)
		if !ok {
			rc.mu.Lock()
			if rc.dead { // retired by the flusher: start over
				rc.mu.Unlock()
				c.res.CompareAndDelete(resource, rc)
				continue
			}
			if e, ok = rc.tokens.Load(token); !ok {
				if c.nEntries.Load() >= maxCountedTokens {
					rc.mu.Unlock()
					c.overflow.Add(1)
					return
				}
				e = &tokenCount{}
				rc.tokens.Store(token, e)
				c.nEntries.Add(1)
			}
			rc.mu.Unlock()
		}
		if e.(*tokenCount).n.Add(1)&closedBit == 0 {
			if l := rc.last.Load(); l == nil || l.e != e {
				rc.last.Store(&lastToken{token, e.(*tokenCount)})
			}
			return
		}
		// The flusher retired this entry before the add (its count was
		// taken without it): count in a fresh one.
		rc.tokens.CompareAndDelete(token, e)
	}
}

// Rejected counts one refused write. Safe for concurrent use; nil-safe.
func (c *Counts) Rejected(tokens.Rejection) {
	if c == nil {
		return
	}
	c.rejected.Add(1)
}

// Durable reports whether the counts are kept in a store (Persist).
func (c *Counts) Durable() bool {
	if c == nil {
		return false
	}
	c.flushMu.RLock()
	defer c.flushMu.RUnlock()
	return c.store != nil
}

// Writes returns the accepted-write counts of resource's given tokens:
// with Persist, the store's plus this process's unflushed ones; without,
// this process's since it started.
func (c *Counts) Writes(ctx context.Context, resource string, toks []int64) (map[int64]uint64, error) {
	out := map[int64]uint64{}
	if c == nil || len(toks) == 0 {
		return out, nil
	}
	c.flushMu.RLock()
	defer c.flushMu.RUnlock()
	if c.store != nil {
		stored, err := c.store.Writes(ctx, resource, toks)
		if err != nil {
			return nil, err
		}
		out = stored
	}
	var rc *resourceCounts
	if v, ok := c.res.Load(resource); ok {
		rc = v.(*resourceCounts)
	}
	for _, t := range toks {
		if rc != nil {
			if v, ok := rc.tokens.Load(t); ok {
				e := v.(*tokenCount)
				if n := e.n.Load() &^ closedBit; n > e.flushed {
					out[t] += n - e.flushed
				}
			}
		}
		if n := c.pending[tokenKey{resource, t}]; n > 0 {
			out[t] += n
		}
	}
	return out, nil
}

// Persist keeps the counts in store from now on: it adds what was counted
// to the store every interval, in one batch. stop flushes once more
// (call it after the last write was answered) and ends the flusher.
func (c *Counts) Persist(store tokens.WriteCounter, every time.Duration, log *slog.Logger) (stop func()) {
	if log == nil {
		log = slog.Default()
	}
	c.flushMu.Lock()
	c.store = store
	c.flushMu.Unlock()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-quit:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := c.flush(ctx); err != nil {
					log.Error("store the last accepted-write counts", "err", err)
				}
				cancel()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), every+time.Second)
			err := c.flush(ctx)
			cancel()
			if err != nil && !failing {
				log.Warn("store accepted-write counts (retrying every interval)", "err", err)
			}
			failing = err != nil
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}

// flush adds every count not yet stored to the store, in one batch, and
// retires idle entries.
func (c *Counts) flush(ctx context.Context) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	type taken struct {
		e   *tokenCount
		cur uint64
	}
	var took []taken
	batch := map[tokenKey]uint64{}
	c.res.Range(func(rk, rv any) bool {
		resource, rc := rk.(string), rv.(*resourceCounts)
		live := 0
		rc.tokens.Range(func(tk, tv any) bool {
			k, e := tokenKey{resource, tk.(int64)}, tv.(*tokenCount)
			live++
			cur := e.n.Load()
			if cur != e.flushed {
				e.idle = 0
				took = append(took, taken{e, cur})
				batch[k] += cur - e.flushed
				return true
			}
			if e.idle++; e.idle < idleFlushes {
				return true
			}
			// Retire it: from here on, a writer sees closedBit and counts
			// in a fresh entry; what it counted before the Or is in old.
			// Only this entry goes: a writer that saw closedBit may have
			// taken it out already and stored its fresh one under the
			// token, whose counts a plain Delete would lose.
			old := e.n.Or(closedBit)
			rc.tokens.CompareAndDelete(tk, e)
			c.nEntries.Add(-1)
			live--
			if old > e.flushed {
				c.pending[k] += old - e.flushed
			}
			return true
		})
		if live == 0 {
			// No entry left: retire the resource, unless a writer is
			// creating one (entries are created under mu).
			rc.mu.Lock()
			empty := true
			rc.tokens.Range(func(any, any) bool { empty = false; return false })
			if empty {
				rc.dead = true
				c.res.CompareAndDelete(resource, rc)
			}
			rc.mu.Unlock()
		}
		return true
	})
	for k, n := range c.pending {
		batch[k] += n
	}
	if len(batch) == 0 {
		return nil
	}
	writes := make([]tokens.TokenWrites, 0, len(batch))
	for k, n := range batch {
		writes = append(writes, tokens.TokenWrites{Resource: k.resource, Token: k.token, N: n})
	}
	if err := c.store.AddWrites(ctx, writes); err != nil {
		if len(c.pending) > maxPending {
			clear(c.pending)
		}
		return err
	}
	for _, t := range took {
		t.e.flushed = t.cur
	}
	clear(c.pending)
	return nil
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
