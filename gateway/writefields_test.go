package gateway

import (
	"net/http"
	"slices"
	"testing"

	"golang.org/x/net/http/httpguts"
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

// FuzzReadWriteFields holds the one pass to a lookup of each field, and
// to lookalikeHeader: any header of up to three fields (names as the
// client sent them, canonicalized as Go's server does).
func FuzzReadWriteFields(f *testing.F) {
	f.Add("Fencing-Lease", "l1", "fencing-lease", "l2", "Connection", "close, upgrade")
	f.Add("Upgrade", "", "Expect", "100-continue", "TE", "gzip, trailers")
	f.Add("Idempotency-Key", "", "User-Agent", "", "X_Forwarded_For", "1.2.3.4")
	f.Add("Fencing_Token", "1", "Content_Length", "5", "My_Header", "x")
	f.Add("Te", "trailersx", "Connection", "", "Upgrade", "h2c")
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
		got, want := readWriteFields(h), wantWriteFields(h)
		if got.lookalike != "" && !lookalikeName(got.lookalike) {
			t.Fatalf("%v: look-alike %q is not one", h, got.lookalike)
		}
		if (got.lookalike == "") != (lookalikeHeader(h) == "") {
			t.Fatalf("%v: look-alike %q, lookalikeHeader %q", h, got.lookalike, lookalikeHeader(h))
		}
		got.lookalike = ""
		if !slices.Equal(got.lease, want.lease) || !slices.Equal(got.connection, want.connection) ||
			!slices.Equal(got.idempotencyKey, want.idempotencyKey) || got.forward != want.forward ||
			got.hasKey != want.hasKey || got.upgrade != want.upgrade || got.expect != want.expect {
			t.Fatalf("%v: read %+v, want %+v", h, got, want)
		}
	})
}
