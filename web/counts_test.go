package web

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencegw/fencegw/storage/bolt"
)

// Counts kept in a real store survive a restart, and writes counted while
// the flusher runs and retires idle entries are all stored, exactly once.
func TestCountsPersist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fencegw.db")
	store, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounts()
	c.Accepted("stmt:1", 1) // before Persist: stored at the first flush
	stop := c.Persist(store, time.Hour, nil)
	const writers, each = 4, 3000
	var flushed atomic.Int64 // flushes done
	// afterFlushes waits until n more flushes have run: long enough for an
	// entry nobody writes to retire, however slow the disk makes a flush.
	afterFlushes := func(n int64) {
		until, deadline := flushed.Load()+n, time.Now().Add(10*time.Second)
		for flushed.Load() < until && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				// Tokens 1..8 of two resources, some going idle and
				// retiring between bursts: half the writers change token
				// each write, half write bursts under one (counted in the
				// resource's last entry, which may retire meanwhile).
				res := []string{"stmt:1", "stmt:2"}[w%2]
				tok := int64(1 + i%8)
				if w >= writers/2 {
					tok = int64(1 + i/50%8)
				}
				c.Accepted(res, tok)
				if i%300 == 0 {
					// Token 99 is written rarely: it retires between
					// writes, and a write may race its retirement.
					afterFlushes(idleFlushes + 1)
					c.Accepted(res, 99)
				}
			}
		})
	}
	writing, flushes := make(chan struct{}), make(chan struct{})
	retired := 0
	go func() {
		defer close(flushes)
		for {
			select {
			case <-writing:
				return
			default:
			}
			n := c.nEntries.Load()
			if err := c.flush(t.Context()); err != nil {
				t.Errorf("flush: %v", err)
				return
			}
			flushed.Add(1)
			if c.nEntries.Load() < n {
				retired++
			}
		}
	}()
	wg.Wait()
	close(writing)
	<-flushes
	if retired == 0 {
		t.Error("no entry retired while the writers ran: the test does not test that")
	}
	before, err := c.Writes(t.Context(), "stmt:1", []int64{1, 2, 8})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	// A new process on the same file.
	store, err = bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c2 := NewCounts()
	defer c2.Persist(store, time.Hour, nil)()
	all := []int64{1, 2, 3, 4, 5, 6, 7, 8, 99}
	total := uint64(0)
	for _, res := range []string{"stmt:1", "stmt:2"} {
		got, err := c2.Writes(t.Context(), res, all)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range got {
			total += n
		}
	}
	if want := uint64(writers*each + writers*each/300 + 1); total != want {
		t.Fatalf("after a restart the store counts %d writes, want %d", total, want)
	}
	after, _ := c2.Writes(t.Context(), "stmt:1", []int64{1, 2, 8})
	for tok, n := range before {
		if after[tok] != n {
			t.Errorf("token %d: %d before the restart, %d after", tok, n, after[tok])
		}
	}
	if !c2.Durable() || NewCounts().Durable() {
		t.Error("Durable")
	}
}

// A write under the token of a resource's last entry, which the flusher
// retired meanwhile, is counted in a fresh entry, not in the retired one
// (whose later counts no flush stores).
func TestCountsLastEntryRetired(t *testing.T) {
	store, err := bolt.Open(filepath.Join(t.TempDir(), "fencegw.db"), bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := NewCounts()
	defer c.Persist(store, time.Hour, nil)()
	c.Accepted("r", 5)
	v, _ := c.res.Load("r")
	rc := v.(*resourceCounts)
	last := rc.last.Load()
	if last == nil || last.token != 5 {
		t.Fatalf("the last entry is %+v, want token 5's", last)
	}
	// Token 6 keeps the resource alive while token 5's entry retires.
	for range idleFlushes + 1 {
		c.Accepted("r", 6)
		if err := c.flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if last.e.n.Load()&closedBit == 0 {
		t.Fatal("token 5's entry did not retire")
	}
	rc.last.Store(last) // as a writer that last counted under token 5 left it
	c.Accepted("r", 5)
	if err := c.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	got, err := c.Writes(t.Context(), "r", []int64{5, 6})
	if err != nil {
		t.Fatal(err)
	}
	if got[5] != 2 || got[6] != idleFlushes+1 {
		t.Fatalf("counted %v, want 2 writes under token 5 and %d under 6", got, idleFlushes+1)
	}
}
