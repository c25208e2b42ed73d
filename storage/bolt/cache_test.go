package bolt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/fencegw/fencegw/tokens"
)

// TestEvictedBehavesAsCached runs one random sequence of operations against
// a store whose cache holds almost nothing (one entry a generation, so
// nearly every read misses and is filled from the file) and one whose cache
// holds everything (as the store did before it was bounded), on the same
// clock, and wants the same answer from both every time, across restarts.
func TestEvictedBehavesAsCached(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	dir := t.TempDir()
	optsTiny := Options{Now: clock, CacheEntries: 1, CrashDrain: -1}
	optsAll := Options{Now: clock, CacheEntries: 1 << 20, CrashDrain: -1}
	tiny := openAt(t, filepath.Join(dir, "tiny.db"), optsTiny)
	all := openAt(t, filepath.Join(dir, "all.db"), optsAll)
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(11, 13))
	resources := []string{"a", "b", "c", "d", "e", "f", "g/h", "never"}
	var leases []string // every lease id granted, and one never granted
	leases = append(leases, tokens.NewLeaseID())

	for step := range 3000 {
		r := resources[rng.IntN(len(resources)-1)] // "never" is only read
		var id string
		if len(leases) > 0 {
			id = leases[rng.IntN(len(leases))]
		}
		var a, b string
		switch op := rng.IntN(10); op {
		case 0, 1:
			req := tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: r, Holder: "h", Owner: "o", TTL: time.Duration(1+rng.IntN(60)) * time.Second}
			a, b = show(tiny.Grant(ctx, req)), show(all.Grant(ctx, req))
			leases = append(leases, req.LeaseID)
		case 2:
			ttl := time.Duration(rng.IntN(3)) * 10 * time.Second
			a, b = show(tiny.Renew(ctx, id, ttl)), show(all.Renew(ctx, id, ttl))
		case 3:
			a, b = show(tiny.Release(ctx, id)), show(all.Release(ctx, id))
		case 4:
			d := time.Duration(rng.IntN(5)) * time.Second
			a, b = fmt.Sprint(tiny.Drain(ctx, r, d)), fmt.Sprint(all.Drain(ctx, r, d))
		case 5:
			now.Add(int64(time.Duration(rng.IntN(20)) * time.Second))
			continue
		case 6:
			id := leases[rng.IntN(len(leases))]
			a, b = show(tiny.Lease(ctx, id)), show(all.Lease(ctx, id))
		case 7:
			r := resources[rng.IntN(len(resources))]
			a, b = showRes(tiny.Resource(ctx, r)), showRes(all.Resource(ctx, r))
		case 8:
			a, b = showList(tiny.CurrentLeases(ctx, 0)), showList(all.CurrentLeases(ctx, 0))
		case 9:
			if rng.IntN(30) == 0 {
				tiny, all = reopen(t, tiny, optsTiny), reopen(t, all, optsAll)
			}
			continue
		}
		if a != b {
			t.Fatalf("step %d: evicted store says\n\t%s\nfully cached store says\n\t%s", step, a, b)
		}
		if nr, nl := tiny.cache.size(); nr > 2 || nl > 2 {
			t.Fatalf("step %d: cache holds %d resources and %d leases, want at most 2 each", step, nr, nl)
		}
	}
	// Every lease, including superseded ones, reads the same at the end.
	for _, id := range leases {
		if a, b := show(tiny.Lease(ctx, id)), show(all.Lease(ctx, id)); a != b {
			t.Fatalf("lease %s: %s, want %s", tokens.LeaseHint(id), a, b)
		}
	}
}

func show(l tokens.Lease, err error) string {
	if err != nil {
		return "error " + errText(err)
	}
	return leaseText(l)
}

func leaseText(l tokens.Lease) string {
	return fmt.Sprintf("{%s %s %s %s %d %v %d %d %d}", l.ID, l.Resource, l.Holder, l.Owner, l.Token, l.TTL,
		unixNano(l.GrantedAt), unixNano(l.ExpiresAt), unixNano(l.ReleasedAt))
}

func showRes(r tokens.Resource, err error) string {
	if err != nil {
		return "error " + errText(err)
	}
	s := fmt.Sprintf("{%s %d %d %d", r.Name, r.Token, unixNano(r.DrainUntil), unixNano(r.Now))
	if r.Lease != nil {
		s += " " + leaseText(*r.Lease)
	}
	return s + "}"
}

func showList(ls []tokens.Lease, err error) string {
	if err != nil {
		return "error " + errText(err)
	}
	s := fmt.Sprint(len(ls))
	for _, l := range ls {
		s += " " + leaseText(l)
	}
	return s
}

// errText is an error's kind and facts, without the times that Error
// renders from the wall clock.
func errText(err error) string {
	var e *tokens.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%v %s %s %d %d %s %d %v", e.Kind, e.Resource, e.Detail, e.Token, e.CurrentToken, e.Holder, unixNano(e.ExpiresAt), e.RetryAfter)
	}
	return err.Error()
}

// TestCacheNeverStale has readers fill a one-entry cache while mutations of
// the same resources commit, and then wants every cached value to be what
// the file holds: a fill may never put back a value older than a commit.
func TestCacheNeverStale(t *testing.T) {
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{CacheEntries: 1})
	ctx := t.Context()
	resources := []string{"a", "b", "c"}
	var (
		mu     sync.Mutex
		leases []string
	)
	var mutators, readers sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		mutators.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; i < 150; i++ {
				r := resources[rng.IntN(len(resources))]
				l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: r, Holder: "h", TTL: time.Duration(1+rng.IntN(3)) * time.Millisecond})
				if err == nil {
					mu.Lock()
					leases = append(leases, l.ID)
					mu.Unlock()
					if rng.IntN(2) == 0 {
						_, _ = s.Renew(ctx, l.ID, time.Millisecond)
					} else {
						_, _ = s.Release(ctx, l.ID)
					}
				}
			}
		})
	}
	for w := range 4 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = s.Resource(ctx, resources[rng.IntN(len(resources))])
				mu.Lock()
				var id string
				if len(leases) > 0 {
					id = leases[rng.IntN(len(leases))]
				}
				mu.Unlock()
				if id != "" {
					_, _ = s.Lease(ctx, id)
				}
			}
		})
	}
	mutators.Wait()
	close(stop)
	readers.Wait()
	// An empty cache would pass the comparison: the last commits must have
	// left their states in it.
	if res, _ := checkCacheMatchesFile(t, s); res == 0 {
		t.Fatal("the cache holds no resource after 600 commits and the reads between them")
	}
	// And a quiet read fills it with the lease it read.
	if _, err := s.Lease(ctx, leases[len(leases)-1]); err != nil {
		t.Fatal(err)
	}
	if _, cached := checkCacheMatchesFile(t, s); cached == 0 {
		t.Fatal("a lease read with nothing else going on was not cached")
	}
}

// checkCacheMatchesFile compares every cached entry with the file, and
// returns how many resources and leases the cache holds.
func checkCacheMatchesFile(t *testing.T, s *Store) (resources, leases int) {
	t.Helper()
	c := s.cache
	c.mu.RLock()
	defer c.mu.RUnlock()
	err := s.db.View(func(tx *bbolt.Tx) error {
		for _, gen := range c.res {
			for name, e := range gen {
				st, err := getResource(tx, name)
				if err != nil {
					return err
				}
				l, err := getLease(tx, st.current)
				if err != nil {
					return err
				}
				if st != e.st || (l == nil) != (e.lease == nil) || (l != nil && leaseText(*l) != leaseText(*e.lease)) {
					return fmt.Errorf("resource %q cached as %+v %v, the file has %+v %v", name, e.st, e.lease, st, l)
				}
				resources++
			}
		}
		for _, gen := range c.leases {
			for id, cl := range gen {
				l, err := getLease(tx, id)
				if err != nil {
					return err
				}
				if l == nil || leaseText(*l) != leaseText(*cl) {
					return fmt.Errorf("lease %s cached as %v, the file has %v", tokens.LeaseHint(id), cl, l)
				}
				leases++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return resources, leases
}

// TestCurrentLeasesFromIndex checks the live-lease index across renewals,
// releases, supersession, expiry and pruning, and its rebuild for a file
// written before it existed.
func TestCurrentLeasesFromIndex(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	opts := Options{Now: clock, CacheEntries: 1}
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), opts)
	ctx := t.Context()
	grant := func(r string, ttl time.Duration) tokens.Lease {
		t.Helper()
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: r, Holder: "h", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ids := func() []string {
		t.Helper()
		ls, err := s.CurrentLeases(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			out = append(out, l.Resource)
		}
		return out
	}
	a := grant("a", 3*time.Minute)
	b := grant("b", time.Minute)
	grant("c", 2*time.Minute)
	if got := ids(); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Fatalf("CurrentLeases = %v, want b c a (soonest expiry first)", got)
	}
	if _, err := s.Renew(ctx, b.ID, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("after renewing b and releasing a: %v, want c b", got)
	}
	now.Add(int64(2*time.Minute + time.Second)) // c expires
	grant("a", time.Minute)
	if got := ids(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after c expired and a was granted again: %v, want a b", got)
	}
	// Pruning: expired entries go as mutations happen.
	now.Add(int64(time.Hour))
	for i := range 10 {
		grant(fmt.Sprint("p", i), time.Minute)
	}
	if n := indexLen(t, s); n != 10 {
		t.Fatalf("index holds %d entries after pruning, want the 10 live ones", n)
	}
	// A file without the index gets it rebuilt at open.
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket(bucketLive) }); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, opts)
	if got := ids(); len(got) != 10 || got[0] != "p0" {
		t.Fatalf("after the index was rebuilt: %v, want p0..p9", got)
	}
}

func indexLen(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	if err := s.db.View(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketLive).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCollectEvictedLeases collects leases the cache no longer holds, and
// one it still holds.
func TestCollectEvictedLeases(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{Now: clock, CacheEntries: 2})
	ctx := context.Background()
	var old []string
	var cur tokens.Lease
	for i := range 2*gcChunk + 10 { // more than one chunk of the scan
		l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r" + fmt.Sprint(i%5), Holder: "h", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		now.Add(int64(time.Second))
		old = append(old, l.ID)
		cur = l
	}
	old = old[:len(old)-5]                          // the last five are their resources' current leases
	if _, err := s.Lease(ctx, old[0]); err != nil { // cached at collection
		t.Fatal(err)
	}
	now.Add(int64(LeaseRetention + time.Minute))
	n, err := s.collectLeases()
	if err != nil || n != len(old) {
		t.Fatalf("collectLeases = %d, %v; want %d", n, err, len(old))
	}
	for _, id := range []string{old[0], old[len(old)/2], old[len(old)-1]} {
		if _, err := s.Lease(ctx, id); !errors.Is(err, tokens.ErrNotFound) {
			t.Fatalf("collected lease %s: %v, want ErrNotFound", tokens.LeaseHint(id), err)
		}
	}
	if _, err := s.Lease(ctx, cur.ID); err != nil {
		t.Fatalf("a current lease was collected: %v", err)
	}
}

// TestFillOrderedAgainstCommits holds a cache fill between its read and its
// insert while a mutation of the same resource tries to commit: the
// mutation must wait for the fill (the shared lock), so the cache ends with
// the mutation's value, never the fill's older one.
func TestFillOrderedAgainstCommits(t *testing.T) {
	for _, what := range []string{"resource", "lease"} {
		t.Run(what, func(t *testing.T) {
			s := openAt(t, filepath.Join(t.TempDir(), "fencegw.db"), Options{CacheEntries: 1})
			ctx := t.Context()
			l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: "r", Holder: "h", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			// Evict r and its lease.
			for i := range 4 {
				if _, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: fmt.Sprint("o", i), Holder: "h", TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			reached, release := make(chan struct{}), make(chan struct{})
			var first atomic.Bool
			s.fillHook = func() {
				if !first.Swap(true) { // later fills (the release's own) pass
					close(reached)
					<-release
				}
			}
			filled := make(chan error, 1)
			go func() {
				var err error
				if what == "resource" {
					_, err = s.Resource(ctx, "r")
				} else {
					_, err = s.Lease(ctx, l.ID)
				}
				filled <- err
			}()
			<-reached
			mutated := make(chan error, 1)
			go func() {
				_, err := s.Release(ctx, l.ID)
				mutated <- err
			}()
			// With the fill ordered, the release waits for it and this
			// times out; unordered, the release commits now and the fill
			// would then put the older value back.
			select {
			case err := <-mutated:
				mutated <- err
			case <-time.After(200 * time.Millisecond):
			}
			close(release)
			if err := <-filled; err != nil {
				t.Fatal(err)
			}
			if err := <-mutated; err != nil {
				t.Fatal(err)
			}
			s.fillHook = nil
			checkCacheMatchesFile(t, s)
			got, err := s.Lease(ctx, l.ID)
			if err != nil || !got.Released() {
				t.Fatalf("Lease after the release = %+v, %v; want it released", got, err)
			}
		})
	}
}

// size is the number of cached resource states and leases.
func (c *cache) size() (resources, leases int) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.res[0]) + len(c.res[1]), len(c.leases[0]) + len(c.leases[1])
}
