package storagetest

import (
	"sync"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

// testWriteCounts: batches add up per (resource, token), concurrent
// batches (two replicas flushing) lose nothing, and the counts survive a
// restart.
func testWriteCounts(t *testing.T, h Harness) {
	s := h.Open(t)
	wc, ok := s.(tokens.WriteCounter)
	if !ok {
		t.Fatalf("%T is not a tokens.WriteCounter", s)
	}
	a, b := resourceName(t, "a"), resourceName(t, "b")
	ctx := t.Context()
	if got, err := wc.Writes(ctx, a, []int64{1, 2}); err != nil || len(got) != 0 {
		t.Fatalf("Writes before any: %v, %v; want none", got, err)
	}
	if err := wc.AddWrites(ctx, []tokens.TokenWrites{{Resource: a, Token: 1, N: 3}, {Resource: a, Token: 2, N: 1}, {Resource: b, Token: 1, N: 7}}); err != nil {
		t.Fatalf("AddWrites: %v", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			// Overlapping batches in opposite orders, as two replicas send.
			if err := wc.AddWrites(ctx, []tokens.TokenWrites{{Resource: b, Token: 1, N: 1}, {Resource: a, Token: 2, N: 2}}); err != nil {
				t.Errorf("AddWrites: %v", err)
			}
			if err := wc.AddWrites(ctx, []tokens.TokenWrites{{Resource: a, Token: 2, N: 1}, {Resource: b, Token: 1, N: 1}}); err != nil {
				t.Errorf("AddWrites: %v", err)
			}
		})
	}
	wg.Wait()
	check := func(s tokens.Store, when string) {
		t.Helper()
		wc := s.(tokens.WriteCounter)
		got, err := wc.Writes(ctx, a, []int64{1, 2, 3})
		if err != nil || len(got) != 2 || got[1] != 3 || got[2] != 1+8*3 {
			t.Fatalf("%s: Writes(a) = %v, %v; want {1: 3, 2: 25}", when, got, err)
		}
		if got, err := wc.Writes(ctx, b, []int64{1}); err != nil || got[1] != 7+8*2 {
			t.Fatalf("%s: Writes(b) = %v, %v; want {1: 23}", when, got, err)
		}
	}
	check(s, "after the batches")
	if h.Reopen != nil {
		check(h.Reopen(t, s), "after a restart")
	}
}
