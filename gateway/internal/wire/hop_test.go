package wire

import (
	"maps"
	"net/http"
	"slices"
	"testing"
)

// RemoveHopByHop takes the same fields out of a header with fewer fields
// than hop-by-hop names (one pass over its fields, IsHopHeader) as out of
// one with more (a lookup of each name): the hop-by-hop ones, and those
// its Connection field names.
func TestRemoveHopByHopSmallAndLargeAgree(t *testing.T) {
	for _, k := range HopHeaders {
		if !IsHopHeader(k) {
			t.Errorf("IsHopHeader(%q) is false", k)
		}
	}
	small := http.Header{"Connection": {"X-Named, keep-alive"}, "Keep-Alive": {"5"}, "Te": {"trailers"},
		"X-Named": {"1"}, "Content-Type": {"text/plain"}, "Connections": {"kept"}}
	large := small.Clone()
	for _, k := range []string{"A", "B", "C", "D", "E", "F"} {
		large[k] = []string{"kept"}
	}
	if len(small) >= len(HopHeaders) || len(large) < len(HopHeaders) {
		t.Fatalf("the headers (%d, %d fields) do not take both roads", len(small), len(large))
	}
	RemoveHopByHop(small)
	RemoveHopByHop(large)
	for _, k := range []string{"A", "B", "C", "D", "E", "F"} {
		delete(large, k)
	}
	got, want := slices.Sorted(maps.Keys(small)), slices.Sorted(maps.Keys(large))
	if !slices.Equal(got, want) || !slices.Equal(want, []string{"Connections", "Content-Type"}) {
		t.Fatalf("left %q by one pass over the fields, %q by a lookup of each name; want Connections and Content-Type", got, want)
	}
}
