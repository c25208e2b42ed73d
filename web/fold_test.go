package web

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// A folded entry stands where its refusals happened: listed at its last
// one, above entries of older activity whatever its id, and charted with
// its first and last refusals in their own bars.
func TestFoldedEntryListedAndChartedByWhenItHappened(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	r := rangeOf("1h")
	first, last := now.Add(-50*time.Minute), now.Add(-10*time.Second)
	src := &fakeSource{now: now, rejs: []tokens.Rejection{
		// The fake lists by id, newest first, as the stores do.
		{ID: 1, At: last, FirstAt: first, Repeats: 2, Resource: "folded", Code: tokens.CodeStaleToken, Token: 3, CurrentToken: 4, Holder: "w1"},
		{ID: 2, At: now.Add(-20 * time.Minute), Resource: "single", Code: tokens.CodeStaleToken, Token: 5, CurrentToken: 6, Holder: "w2"},
	}}
	// The fake's Since stops at the first entry older than the range, in id
	// order; an entry's last refusal is what a store filters on.
	ov, err := overview(context.Background(), src, nil, Filter{Range: r})
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Recent) != 2 || ov.Recent[0].ID != 1 {
		t.Fatalf("feed order %v, want the entry refused 10 s ago first", ids(ov.Recent))
	}
	if ov.Total != 3 {
		t.Fatalf("total %d, want 3 (2 folded + 1)", ov.Total)
	}
	bar := func(at time.Time) int {
		for _, b := range ov.Buckets {
			if !at.Before(b.Start) && at.Before(b.Start.Add(r.Bucket)) {
				return b.Count
			}
		}
		t.Fatalf("%v is in no bar", at)
		return 0
	}
	if bar(first) != 1 || bar(last) != 1 || bar(now.Add(-20*time.Minute)) != 1 {
		t.Fatalf("bars at the first repeat, the last and the single refusal: %d, %d, %d; want 1 each", bar(first), bar(last), bar(now.Add(-20*time.Minute)))
	}
	sum := 0
	for _, b := range ov.Buckets {
		sum += b.Count
	}
	if sum != ov.Total {
		t.Fatalf("the chart holds %d refusals, the cards %d", sum, ov.Total)
	}
}

// Repeats between the first and last are spread over that span, and only
// those in the range count; a flood of a million repeats is counted without
// a loop over each.
func TestFoldedEntrySpreadCountsOnlyTheRange(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := rangeOf("15m")
	ov := Overview{}
	end := now.Truncate(r.Bucket).Add(r.Bucket)
	n := int(r.Span / r.Bucket)
	ov.Buckets = make([]Bucket, n)
	for i := range ov.Buckets {
		ov.Buckets[i].Start = end.Add(-time.Duration(n-i) * r.Bucket)
	}
	// 1,000,001 refusals, one per ms over 1,000 s: the range holds the
	// last 15 min (+ the partial bar) of them.
	rej := tokens.Rejection{Repeats: 1_000_001, FirstAt: now.Add(-1000 * time.Second), At: now}
	got := ov.spread(rej, r.Bucket)
	from := ov.Buckets[0].Start
	want := int(now.Sub(from)/time.Millisecond) + 1
	if got < want-1 || got > want+1 {
		t.Fatalf("in range %d, want %d ± 1", got, want)
	}
	if c := ov.Buckets[n/2].Count; c < 14_999 || c > 15_001 {
		t.Fatalf("a middle bar holds %d, want 15,000 ± 1 (one per ms)", c)
	}
}

// A refusal without a token (an unknown lease) shows no token comparison,
// and the chart's label says "per 1 min", not "per 1 min 0 s".
func TestFeedRowWithoutTokenAndBucketLabel(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	src := &fakeSource{now: now, rejs: []tokens.Rejection{
		{ID: 1, At: now.Add(-time.Minute), Code: tokens.CodeUnknownLease, Method: "POST", Upstream: "statements", Path: "/x"},
	}}
	_, page := get(t, Handler(src, nil), "/ui/?range=1h")
	row := page[strings.Index(page, `<tr data-id="1"`):]
	row = row[:strings.Index(row, "</tr>")]
	if strings.Contains(row, "vs") || strings.Contains(row, `class="stale"`) {
		t.Errorf("an unknown_lease row compares tokens:\n%s", row)
	}
	if !strings.Contains(page, "per 1 min<") || strings.Contains(page, "1 min 0 s") {
		t.Errorf("the chart's label does not say per 1 min")
	}
	for d, want := range map[time.Duration]string{time.Minute: "1 min", 90 * time.Second: "1 min 30 s", time.Hour: "1 h", 90 * time.Minute: "1 h 30 min", 30 * time.Minute: "30 min"} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}

func ids(rs []tokens.Rejection) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}
