package gateway

import (
	"net/http"

	"golang.org/x/net/http/httpguts"
)

// writeFields is what a fenced write's road asks of the client's header
// fields, found in one pass over the header (readWriteFields). Each
// question was a lookup of its own, a dozen a write: a lookup in a small
// map costs about as much as the pass over its few fields, which the
// look-alike check makes anyway.
type writeFields struct {
	lease          []string // Fencing-Lease
	connection     []string
	idempotencyKey []string
	lookalike      string // a name CGI reads as one the gateway sets or drops (lookalike.go)
	hasKey         bool   // an Idempotency-Key field, even with no value
	upgrade        bool   // an Upgrade field with a value
	expect         bool   // an Expect field with a value
	forward        forwardFields
}

// forwardFields is what the direct forward asks of the client's header
// (direct.go), kept in the write's state: a few bits, where the whole of
// writeFields would take the state to the next size class.
type forwardFields struct {
	hasConnection bool // a Connection field, even with no value
	teTrailers    bool // a Te field naming trailers
	userAgent     bool // a User-Agent field
}

// readWriteFields reads what writeFields holds from h.
func readWriteFields(h http.Header) writeFields {
	var wf writeFields
	for k, vv := range h {
		switch k {
		case HeaderLease:
			wf.lease = vv
		case "Connection":
			wf.connection, wf.forward.hasConnection = vv, true
		case HeaderIdempotencyKey:
			wf.idempotencyKey, wf.hasKey = vv, true
		case "Upgrade":
			wf.upgrade = len(vv) > 0
		case "Expect":
			wf.expect = len(vv) > 0
		case "Te":
			wf.forward.teTrailers = httpguts.HeaderValuesContainsToken(vv, "trailers")
		case "User-Agent":
			wf.forward.userAgent = true
		default:
			if wf.lookalike == "" && lookalikeName(k) {
				wf.lookalike = k
			}
		}
	}
	return wf
}
