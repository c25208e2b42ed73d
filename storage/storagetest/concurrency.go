package storagetest

// The store suite's tests of concurrent grants, of a store reopened
// (restart), and of Ping.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

func testConcurrency(t *testing.T, h Harness) {
	s := h.Open(t)
	resources := []string{resourceName(t, "a"), resourceName(t, "b"), resourceName(t, "c")}
	const workers = 12
	const grantsPerWorker = 8
	var (
		mu      sync.Mutex
		granted = map[string][]int64{} // per resource, in grant order
		leases  = map[string]bool{}
		held    = map[string]bool{} // per resource: a worker holds it
	)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			deadline := time.Now().Add(20 * time.Second)
			for n := 0; n < grantsPerWorker; {
				name := resources[(w+n)%len(resources)]
				l, err := s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: name, Holder: fmt.Sprint("w", w), TTL: 5 * time.Second})
				if errors.Is(err, tokens.ErrLeaseHeld) {
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("worker %d starved", w)
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("Grant: %w", err)
					return
				}
				// The resource is ours until we release it, so appends
				// happen in grant order.
				mu.Lock()
				granted[name] = append(granted[name], l.Token)
				dup, overlap := leases[l.ID], held[name]
				leases[l.ID], held[name] = true, true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("lease id granted twice")
					return
				}
				if overlap {
					errs <- fmt.Errorf("%s: token %d granted while another lease was held and unreleased", name, l.Token)
					return
				}
				if n%2 == 0 {
					if _, err := s.Renew(ctx, l.ID, 0); err != nil {
						errs <- fmt.Errorf("Renew of a held lease: %w", err)
						return
					}
				}
				mu.Lock()
				held[name] = false // before Release: a grant may follow it at once
				mu.Unlock()
				if _, err := s.Release(ctx, l.ID); err != nil {
					errs <- fmt.Errorf("Release of a held lease: %w", err)
					return
				}
				n++
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, name := range resources {
		toks := granted[name]
		total += len(toks)
		for i := 1; i < len(toks); i++ {
			if toks[i] <= toks[i-1] {
				t.Fatalf("%s: token %d granted after %d (all: %v)", name, toks[i], toks[i-1], toks)
			}
		}
		if r := resource(t, s, name); len(toks) > 0 && r.Token != toks[len(toks)-1] {
			t.Fatalf("%s: Resource.Token = %d, last granted %d", name, r.Token, toks[len(toks)-1])
		}
	}
	if total != workers*grantsPerWorker {
		t.Fatalf("%d grants recorded, want %d", total, workers*grantsPerWorker)
	}
}

func testRestart(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("backend does not support restarts")
	}
	s := h.Open(t)
	ctx := t.Context()
	held, super, freed := resourceName(t, "held"), resourceName(t, "super"), resourceName(t, "freed")
	a := grant(t, s, held, "a", longTTL)
	old := grant(t, s, super, "old", shortTTL)
	waitExpired(t, s, old)
	cur := grant(t, s, super, "cur", longTTL)
	f := grant(t, s, freed, "f", longTTL)
	release(t, s, f)
	rej := record(t, s, rejection(held, 7))

	s = h.Reopen(t, s)

	got, err := s.Lease(ctx, a.ID)
	if err != nil || got.Token != a.Token || !near(got.ExpiresAt, a.ExpiresAt) || got.Released() {
		t.Fatalf("after restart Lease(a) = %+v, %v; want token %d expiring at %v", got, err, a.Token, a.ExpiresAt)
	}
	r := resource(t, s, held)
	if h := r.Holder(storeNow(r)); h == nil || h.ID != a.ID {
		t.Fatalf("after restart the current lease of %s is %+v, want a", held, r.Lease)
	}
	_, err = s.Grant(ctx, tokens.GrantRequest{LeaseID: tokens.NewLeaseID(), Resource: held, Holder: "b", TTL: longTTL})
	wantErr(t, err, tokens.ErrLeaseHeld, "Grant of a held resource after restart")
	if _, err := s.Renew(ctx, old.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("after restart Renew(superseded): %v, want ErrLeaseLost", err)
	}
	if _, err := s.Release(ctx, old.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("after restart Release(superseded): %v, want ErrLeaseLost", err)
	}
	if r := resource(t, s, super); r.Holder(storeNow(r)) == nil || r.Lease.ID != cur.ID {
		t.Fatalf("after restart %s is held by %+v, want cur", super, r.Lease)
	}
	if _, err := s.Renew(ctx, cur.ID, 0); err != nil {
		t.Fatalf("after restart Renew(current): %v", err)
	}
	if again := release(t, s, f); !again.Released() {
		t.Fatalf("after restart the released lease is %+v, want released", again)
	}
	if next := grant(t, s, freed, "g", longTTL); next.Token <= f.Token {
		t.Fatalf("after restart token %d, want > %d", next.Token, f.Token)
	}
	list := rejections(t, s, tokens.RejectionQuery{Resource: held})
	if len(list) != 1 || !sameRejection(list[0], rej) {
		t.Fatalf("after restart rejections = %+v, want [%+v]", list, rej)
	}
	if next := record(t, s, rejection(held, 8)); next.ID <= rej.ID {
		t.Fatalf("after restart rejection ID %d, want > %d", next.ID, rej.ID)
	}
	if hist, err := s.History(ctx, held, 0); err != nil || len(hist) == 0 {
		t.Fatalf("after restart History = %v, %v; want the grant", hist, err)
	}
}

func testPing(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
