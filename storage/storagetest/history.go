package storagetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fencegw/fencegw/tokens"
)

// testHistory: grants, renewals and the refused renewal and release of an
// expired lease are each an event of the resource's history, listed newest
// first, and a limit keeps the newest.
func testHistory(t *testing.T, h Harness) {
	s := h.Open(t)
	ctx := t.Context()
	name := resourceName(t, "r")
	a := grant(t, s, name, "a", shortTTL)
	if _, err := s.Renew(ctx, a.ID, shortTTL); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	a, _ = s.Lease(ctx, a.ID)
	waitExpired(t, s, a)
	if _, err := s.Renew(ctx, a.ID, 0); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Renew(expired): %v, want ErrLeaseLost", err)
	}
	if _, err := s.Release(ctx, a.ID); !errors.Is(err, tokens.ErrLeaseLost) {
		t.Fatalf("Release(expired): %v, want ErrLeaseLost", err)
	}
	b := grant(t, s, name, "b", longTTL)
	release(t, s, b)
	type ev struct {
		kind   tokens.EventKind
		token  int64
		holder string
	}
	want := []ev{
		{tokens.EventReleased, b.Token, "b"},
		{tokens.EventGranted, b.Token, "b"},
		{tokens.EventReleaseRefused, a.Token, "a"},
		{tokens.EventRenewRefused, a.Token, "a"},
		{tokens.EventRenewed, a.Token, "a"},
		{tokens.EventGranted, a.Token, "a"},
	}
	got, err := s.History(ctx, name, 0)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	var gotEv []ev
	for i, e := range got {
		gotEv = append(gotEv, ev{e.Kind, e.Token, e.Holder})
		if e.Resource != name || e.At.IsZero() {
			t.Fatalf("event %+v: want resource %s and At set", e, name)
		}
		if i > 0 && e.At.After(got[i-1].At.Add(timeSlack)) {
			t.Fatalf("History not newest first: %v after %v", e.At, got[i-1].At)
		}
	}
	if fmt.Sprint(gotEv) != fmt.Sprint(want) {
		t.Fatalf("History = %v\nwant %v", gotEv, want)
	}
	if got, err := s.History(ctx, name, 2); err != nil || len(got) != 2 || got[0].Kind != tokens.EventReleased {
		t.Fatalf("History(limit 2) = %+v, %v; want the 2 newest", got, err)
	}
}
