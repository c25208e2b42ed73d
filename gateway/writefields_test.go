package gateway

import (
	"net/http"
	"slices"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/wire"
)

// wantWriteFields is writeFields as lookups of each field read it.
func wantWriteFields(h http.Header) writeFields {
	var wf writeFields
	wf.lease = h[HeaderLease]
	wf.connection, wf.forward.hasConnection = h["Connection"]
	wf.idempotencyKey, wf.hasKey = h[HeaderIdempotencyKey]
	wf.upgrade = len(h["Upgrade"]) > 0
	wf.expect = len(h["Expect"]) > 0
	wf.forward.teTrailers = httpguts.HeaderValuesContainsToken(h["Te"], "trailers")
	_, wf.forward.userAgent = h["User-Agent"]
	return wf
}

// FuzzReadWriteFields holds the one pass to a lookup of each field, to
// lookalikeHeader, and to the fields the forward would copy: any header of
// up to three fields (names as the client sent them, canonicalized as Go's
// server does), read from the map, from its fields as the own loop lists
// them (in the order sent, reversed here), and from a list the header no
// longer matches (a field added since), which must be read as the map.
func FuzzReadWriteFields(f *testing.F) {
	f.Add("Fencing-Lease", "l1", "fencing-lease", "l2", "Connection", "close, upgrade")
	f.Add("Upgrade", "", "Expect", "100-continue", "TE", "gzip, trailers")
	f.Add("Idempotency-Key", "", "User-Agent", "", "X_Forwarded_For", "1.2.3.4")
	f.Add("Fencing_Token", "1", "Content_Length", "5", "My_Header", "x")
	f.Add("Te", "trailersx", "Connection", "", "Upgrade", "h2c")
	f.Add("Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic eA==", "X-Forwarded-For", "1.2.3.4")
	f.Add("Content-Length", "5", "Fencing-Token", "9", "Accept", "a")
	f.Fuzz(func(t *testing.T, n1, v1, n2, v2, n3, v3 string) {
		h := http.Header{}
		for _, kv := range [][2]string{{n1, v1}, {n2, v2}, {n3, v3}} {
			if kv[0] == "" {
				continue
			}
			k := http.CanonicalHeaderKey(kv[0])
			if kv[1] == "" && len(h[k]) == 0 {
				h[k] = []string{} // present with no value
				continue
			}
			h[k] = append(h[k], kv[1])
		}
		var sent []wire.Field // the order of the map's walk reversed: not the order walked
		for k, vv := range h {
			sent = slices.Insert(sent, 0, wire.Field{Name: k, Values: vv})
		}
		stale := append(slices.Clip(sent), wire.Field{Name: "X-Gone", Values: []string{"1"}})
		for _, list := range [][]wire.Field{nil, sent, stale} {
			checkReadWriteFields(t, h, list)
		}
	})
}

// checkReadWriteFields checks what readWriteFields reads of h, given sent.
func checkReadWriteFields(t *testing.T, h http.Header, sent []wire.Field) {
	t.Helper()
	var got writeFields
	readWriteFields(h, sent, &got)
	want := wantWriteFields(h)
	if got.lookalike != "" && !lookalikeName(got.lookalike) {
		t.Fatalf("%v: look-alike %q is not one", h, got.lookalike)
	}
	if (got.lookalike == "") != (lookalikeHeader(h) == "") {
		t.Fatalf("%v: look-alike %q, lookalikeHeader %q", h, got.lookalike, lookalikeHeader(h))
	}
	// The list is the fields the forward would copy itself: each
	// the client's, but Content-Length, the hop-by-hop fields and
	// the ones the gateway sets; its values' capacity clipped.
	want.nUpstream = 0
	for k, vv := range h {
		if k != "Content-Length" && !slices.Contains(wire.HopHeaders, k) && !forwardingHeader(k) {
			want.nUpstream++
			i := slices.IndexFunc(got.listed(), func(f wire.Field) bool { return f.Name == k })
			if i < 0 || !slices.Equal(got.upstream[i].Values, vv) || cap(got.upstream[i].Values) != len(vv) {
				t.Fatalf("%v: %q listed as %+v", h, k, got.listed())
			}
		}
	}
	if got.nUpstream != want.nUpstream {
		t.Fatalf("%v: listed %+v, want %d fields", h, got.listed(), want.nUpstream)
	}
	got.lookalike = ""
	if !slices.Equal(got.lease, want.lease) || !slices.Equal(got.connection, want.connection) ||
		!slices.Equal(got.idempotencyKey, want.idempotencyKey) || got.forward != want.forward ||
		got.hasKey != want.hasKey || got.upgrade != want.upgrade || got.expect != want.expect {
		t.Fatalf("%v: read %+v, want %+v", h, got, want)
	}
}
