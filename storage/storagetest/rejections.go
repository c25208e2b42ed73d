package storagetest

// The store suite's tests of the rejection log: recording, queries (since,
// limit, cursor) and repeats counted on one entry.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

func rejection(resource string, i int) tokens.Rejection {
	r := tokens.Rejection{
		Resource: resource, Code: tokens.CodeStaleToken, Token: int64(i), CurrentToken: int64(i + 1),
		Holder: fmt.Sprintf("holder-%d", i), LeaseHint: "fl_abcdef…", Method: "PUT", Upstream: "up",
		Path: fmt.Sprintf("/items/%d", i),
	}
	if i%2 == 1 { // who presented the lease, when there is authentication
		r.Code, r.Principal = tokens.CodeLeaseNotOwned, fmt.Sprintf("key-%d", i)
	}
	if i%3 == 0 { // an observing upstream's, forwarded
		r.WouldRefuse = true
	}
	if i%4 == 0 { // a traced write's
		r.TraceID = fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02d", i%100)
	}
	return r
}

func record(t *testing.T, s tokens.Store, r tokens.Rejection) tokens.Rejection {
	t.Helper()
	got, err := s.RecordRejection(t.Context(), r)
	if err != nil {
		t.Fatalf("RecordRejection: %v", err)
	}
	if got.ID <= 0 || got.At.IsZero() {
		t.Fatalf("RecordRejection = %+v, want ID and At set", got)
	}
	want := r
	want.ID, want.At = got.ID, got.At
	if !r.At.IsZero() {
		want.At = r.At
	}
	want.Repeats, want.FirstAt = 1, want.At
	if !sameRejection(got, want) {
		t.Fatalf("RecordRejection returned %+v, want %+v", got, want)
	}
	return got
}

func sameRejection(a, b tokens.Rejection) bool {
	if !near(a.At, b.At) || !near(a.LeaseEndedAt, b.LeaseEndedAt) || !near(a.FirstAt, b.FirstAt) {
		return false
	}
	a.At, b.At, a.LeaseEndedAt, b.LeaseEndedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	a.FirstAt, b.FirstAt = time.Time{}, time.Time{}
	return a == b
}

func rejections(t *testing.T, s tokens.Store, q tokens.RejectionQuery) []tokens.Rejection {
	t.Helper()
	got, err := s.Rejections(t.Context(), q)
	if err != nil {
		t.Fatalf("Rejections(%+v): %v", q, err)
	}
	for i := 1; i < len(got); i++ {
		if got[i].ID >= got[i-1].ID {
			t.Fatalf("Rejections(%+v) not newest first: id %d after %d", q, got[i].ID, got[i-1].ID)
		}
	}
	return got
}

func ids(rs []tokens.Rejection) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func testRejections(t *testing.T, h Harness) {
	s := h.Open(t)
	ra, rb := resourceName(t, "a"), resourceName(t, "b")
	var all, onlyA []tokens.Rejection // oldest first
	for i := range 10 {
		name := ra
		if i%3 == 2 {
			name = rb
		}
		r := rejection(name, i)
		if i == 4 {
			r.LeaseEndedAt = time.Now().Add(-time.Second)
		}
		got := record(t, s, r)
		if len(all) > 0 && got.ID <= all[len(all)-1].ID {
			t.Fatalf("rejection ID %d after %d: not increasing", got.ID, all[len(all)-1].ID)
		}
		all = append(all, got)
		if name == ra {
			onlyA = append(onlyA, got)
		}
	}
	newest := func(rs []tokens.Rejection) []int64 {
		out := ids(rs)
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		return out
	}
	got := rejections(t, s, tokens.RejectionQuery{})
	if !equalIDs(ids(got), newest(all)) {
		t.Fatalf("Rejections() ids = %v, want %v", ids(got), newest(all))
	}
	for i, r := range got {
		if want := all[len(all)-1-i]; !sameRejection(r, want) {
			t.Fatalf("listed rejection %+v, recorded %+v", r, want)
		}
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: ra}); !equalIDs(ids(got), newest(onlyA)) {
		t.Fatalf("Rejections(resource a) ids = %v, want %v", ids(got), newest(onlyA))
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: resourceName(t, "none")}); len(got) != 0 {
		t.Fatalf("Rejections(unknown resource) = %v, want none", ids(got))
	}
	if got := rejections(t, s, tokens.RejectionQuery{Limit: 3}); !equalIDs(ids(got), newest(all)[:3]) {
		t.Fatalf("Rejections(limit 3) ids = %v, want %v", ids(got), newest(all)[:3])
	}
	// Cursor pagination, with and without a resource filter: the pages
	// concatenate to the whole list, without duplicates or gaps.
	for _, q := range []tokens.RejectionQuery{{Limit: 3}, {Resource: ra, Limit: 2}} {
		want := newest(all)
		if q.Resource != "" {
			want = newest(onlyA)
		}
		var paged []int64
		for range len(want) + 2 {
			page := rejections(t, s, q)
			if len(page) == 0 {
				break
			}
			if len(page) > q.Limit {
				t.Fatalf("page of %d rejections over limit %d", len(page), q.Limit)
			}
			paged = append(paged, ids(page)...)
			q.Before = page[len(page)-1].ID
		}
		if !equalIDs(paged, want) {
			t.Fatalf("paged ids (resource %q) = %v, want %v", q.Resource, paged, want)
		}
	}
	// Before is exclusive.
	mid := all[5].ID
	if got := rejections(t, s, tokens.RejectionQuery{Before: mid, Limit: 1}); len(got) != 1 || got[0].ID != all[4].ID {
		t.Fatalf("Rejections(before %d, limit 1) = %v, want [%d]", mid, ids(got), all[4].ID)
	}
}

func testRejectionsSince(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	first := record(t, s, rejection(name, 1))
	// Both ends of the interval come from the store's clock.
	deadline := time.Now().Add(waitLimit)
	var second tokens.Rejection
	for {
		time.Sleep(20 * time.Millisecond)
		second = record(t, s, rejection(name, 2))
		if second.At.After(first.At.Add(timeSlack)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock did not advance")
		}
	}
	third := record(t, s, rejection(name, 3))
	for _, q := range []tokens.RejectionQuery{{Since: second.At}, {Resource: name, Since: second.At}} {
		got := rejections(t, s, q)
		want := []int64{third.ID, second.ID}
		if !equalIDs(ids(got), want) {
			t.Fatalf("Rejections(resource %q, since the second) ids = %v, want %v", q.Resource, ids(got), want)
		}
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: name}); len(got) < 3 {
		t.Fatalf("Rejections() = %v, want all of %d, %d, %d", ids(got), third.ID, second.ID, first.ID)
	}
}

func testRejectionsLimit(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	const n = 120
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := s.RecordRejection(t.Context(), rejection(name, i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("RecordRejection: %v", err)
	}
	got := rejections(t, s, tokens.RejectionQuery{Resource: name})
	if len(got) != 100 {
		t.Fatalf("Rejections(limit 0) returned %d, want the default 100", len(got))
	}
	got = rejections(t, s, tokens.RejectionQuery{Resource: name, Limit: 5000})
	if len(got) != n {
		t.Fatalf("Rejections(limit 5000) returned %d, want all %d", len(got), n)
	}
	seen := map[int64]bool{}
	for _, r := range got {
		if seen[r.ID] {
			t.Fatalf("rejection ID %d assigned twice", r.ID)
		}
		seen[r.ID] = true
	}
}

func testRejectionAtKept(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	r := rejection(name, 1)
	r.At = time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	got := record(t, s, r)
	if !near(got.At, r.At) {
		t.Fatalf("RecordRejection changed a given At %v to %v", r.At, got.At)
	}
	if list := rejections(t, s, tokens.RejectionQuery{Resource: name}); len(list) != 1 || !near(list[0].At, r.At) {
		t.Fatalf("listed %+v, want one rejection at %v", list, r.At)
	}
}

// A write with a lease id that was never granted has no resource; it is
// still recorded and listed.
func testRejectionUnknownLease(t *testing.T, h Harness) {
	s := h.Open(t)
	r := rejection("", 0)
	r.Code = tokens.CodeUnknownLease
	r.Path = resourceName(t, "/forged")
	got := record(t, s, r)
	found := false
	for _, it := range rejections(t, s, tokens.RejectionQuery{Limit: 1000}) {
		if it.ID == got.ID && it.Path == r.Path && it.Resource == "" {
			found = true
		}
	}
	if !found {
		t.Fatalf("rejection without a resource not listed")
	}
}

// testRejectionRepeats: n refusals of one lease with one code, recorded
// concurrently (so in batches, and racing), are one entry counting n, while
// another code, another lease, or an unknown lease (token 0) are entries of
// their own, and an incident recorded before the flood is still next to it.
func testRejectionRepeats(t *testing.T, h Harness) {
	s := h.Open(t)
	name := resourceName(t, "r")
	incident := record(t, s, tokens.Rejection{Resource: name, Code: tokens.CodeStaleToken, Token: 1, CurrentToken: 3, Holder: "a", LeaseHint: "fl_aaaaaa…", Method: "PUT", Path: "/real"})
	flood := tokens.Rejection{Resource: name, Code: tokens.CodeLeaseReleased, Token: 2, CurrentToken: 3, Holder: "b", LeaseHint: "fl_bbbbbb…", Method: "PUT", Path: "/flood"}
	const n = 300
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			if _, err := s.RecordRejection(t.Context(), flood); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("RecordRejection: %v", err)
	}
	got := rejections(t, s, tokens.RejectionQuery{Resource: name, Limit: 1000})
	if len(got) != 2 {
		t.Fatalf("after %d repeats of one refusal, Rejections = %d entries, want 2 (the incident and the flood)", n, len(got))
	}
	f := got[0]
	if f.ID == incident.ID {
		f = got[1]
	}
	if f.Repeats != n || f.FirstAt.IsZero() || f.At.Before(f.FirstAt) || f.Path != "/flood" {
		t.Fatalf("flood entry = %+v, want repeats %d and first_at <= at", f, n)
	}
	if !sameRejection(rejections(t, s, tokens.RejectionQuery{Resource: name, Before: f.ID + 1, Limit: 1000})[0], f) {
		t.Fatal("the flood entry reads differently through a cursor")
	}
	var kept bool
	for _, r := range got {
		kept = kept || (r.ID == incident.ID && r.Repeats == 1)
	}
	if !kept {
		t.Fatalf("the incident recorded before the flood is gone: %+v", got)
	}

	// One more repeat returns the counted entry.
	again, err := s.RecordRejection(t.Context(), flood)
	if err != nil {
		t.Fatalf("RecordRejection: %v", err)
	}
	if again.ID != f.ID || again.Repeats != n+1 || !near(again.FirstAt, f.FirstAt) || again.At.Before(f.At) {
		t.Fatalf("another repeat returned %+v, want entry %d with repeats %d, first_at %v", again, f.ID, n+1, f.FirstAt)
	}

	// Another code, lease, token or principal, or no known lease: new entries.
	others := []tokens.Rejection{flood, flood, flood, flood, {Resource: "", Code: tokens.CodeUnknownLease, LeaseHint: "fl_cccccc…"}}
	others[0].Code = tokens.CodeLeaseExpired
	others[1].LeaseHint = "fl_dddddd…"
	others[2].Token = 5
	others[3].Principal = "key-x"
	for _, o := range others {
		if r := record(t, s, o); r.ID == f.ID {
			t.Fatalf("%+v was counted on the flood's entry", o)
		}
	}
	u := record(t, s, others[4])
	if r := record(t, s, others[4]); r.ID == u.ID || r.Repeats != 1 {
		t.Fatalf("an unknown lease's refusal was counted on an entry: %+v", r)
	}
	if got := rejections(t, s, tokens.RejectionQuery{Resource: name, Limit: 1000}); len(got) != 6 {
		t.Fatalf("Rejections = %d entries, want 6", len(got))
	}
}
