package gateway

import (
	"net/http"

	"golang.org/x/net/http/httpguts"

	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/gateway/internal/wire"
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
	// upstream lists the fields that go upstream as the client sent them
	// (goesUpstream), for the direct forward, which walked the header
	// again to find them: listed in this pass, a write costs about 600
	// instructions fewer. It is here, on serveProxy's stack, and not in
	// the write's state, which it would take to the next size class. A
	// header with more such fields than it holds is walked again
	// (listed).
	upstream  [8]wire.Field
	nUpstream int // may pass len(upstream): then they did not fit
}

// listed returns the fields that go upstream, as readWriteFields listed
// them; nil (not empty) if there were too many to list.
func (wf *writeFields) listed() []wire.Field {
	if wf.nUpstream > len(wf.upstream) {
		return nil
	}
	return wf.upstream[:wf.nUpstream]
}

// forwardFields is what the direct forward asks of the client's header
// (direct.go), kept in the write's state: a few bits, where the whole of
// writeFields would take the state to the next size class.
type forwardFields struct {
	hasConnection bool // a Connection field, even with no value
	teTrailers    bool // a Te field naming trailers
	userAgent     bool // a User-Agent field
}

// readWriteFields reads what writeFields holds from h into wf, zero.
// sent is h's fields as the client sent them, if the listener's own loop
// parsed its head (framing.Verdict.Fields, kept in the request's scope):
// walked in their order rather than the map, whose walk starts at a
// random place (about 250 instructions before its first field), and whose
// order the upstream's head then sorted from random. Nothing in the
// gateway changes a request's header; a count that differs from the map's
// says something did, and the map is walked.
func readWriteFields(h http.Header, sent []wire.Field, wf *writeFields) {
	if framing.VerifyLists && sent != nil && len(sent) == len(h) {
		framing.Verify(sent, h, &framing.Taken.Request, "request")
	}
	if sent == nil || len(sent) != len(h) {
		var fields [16]wire.Field // a header of more is listed on the heap
		sent = fields[:0]
		for k, vv := range h {
			sent = append(sent, wire.Field{Name: k, Values: vv})
		}
	}
	for _, f := range sent {
		k, vv := f.Name, f.Values
		// The fields named here that go upstream fall out of the switch
		// to be listed; the others continue. The rest go by goesUpstream's
		// rule, its parts inline (a call of it cost 45 instructions a
		// field).
		switch k {
		case HeaderLease:
			wf.lease = vv
			continue
		case "Connection":
			wf.connection, wf.forward.hasConnection = vv, true
			continue
		case "Content-Length":
			continue
		case HeaderIdempotencyKey:
			wf.idempotencyKey, wf.hasKey = vv, true
		case "Upgrade":
			wf.upgrade = len(vv) > 0
			continue
		case "Expect":
			wf.expect = len(vv) > 0
		case "Te":
			wf.forward.teTrailers = httpguts.HeaderValuesContainsToken(vv, "trailers")
			continue
		case "User-Agent":
			wf.forward.userAgent = true
		default:
			if wf.lookalike == "" && lookalikeName(k) {
				wf.lookalike = k
			}
			if wire.IsHopHeader(k) || forwardingHeader(k) {
				continue
			}
		}
		if n := wf.nUpstream; n < len(wf.upstream) {
			// Capacity clipped: an append to the upstream's field never
			// writes into the client's array.
			wf.upstream[n] = wire.Field{Name: k, Values: vv[:len(vv):len(vv)]}
		}
		wf.nUpstream++
	}
}

// goesUpstream reports whether a client's field named k (canonical) is
// copied into the upstream's request as it is, when no Connection field
// names more that go: not Content-Length, which the engine writes from
// the body's length (writeHead, Request.Write both leave the field out),
// nor a hop-by-hop field, nor one the gateway sets itself (rewrite).
func goesUpstream(k string) bool {
	return k != "Content-Length" && !wire.IsHopHeader(k) && !forwardingHeader(k)
}
