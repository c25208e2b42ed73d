package bolt

import (
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// A rejection keeps its Principal (codec version 3); one written by version
// 2, before principals were recorded, still decodes, without one.
func TestRejectionPrincipalCodec(t *testing.T) {
	r := tokens.Rejection{At: time.Unix(1, 0), Resource: "r", Code: tokens.CodeLeaseNotOwned, Token: 1, CurrentToken: 1,
		Holder: "w2", LeaseHint: "fl_abc", Method: "PUT", Upstream: "u", Path: "/p", Principal: "w1"}
	r.Repeats, r.FirstAt = 3, time.Unix(0, 5)
	got, err := decodeRejection(7, encodeRejection(&r))
	r.ID = 7
	if err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	r.Principal, r.Repeats, r.FirstAt = "", 0, time.Time{}
	v2 := encodeRejection(&r)
	v2 = v2[:len(v2)-5] // the empty principal's length, version 6's would-refuse and empty trace id, version 7's repeats 0 and first_at 0
	v2[0] = 2
	r.Repeats, r.FirstAt = 1, r.At // what a version before 7 decodes as
	got, err = decodeRejection(7, v2)
	if err != nil || got != r {
		t.Fatalf("version 2: %+v %v", got, err)
	}
}

// A rejection keeps its WouldRefuse and TraceID (codec version 6); one
// written by version 5 still decodes, with neither.
func TestRejectionObservedCodec(t *testing.T) {
	r := tokens.Rejection{At: time.Unix(1, 0), Resource: "r", Code: tokens.CodeStaleToken, Token: 1, CurrentToken: 2,
		Holder: "w", LeaseHint: "fl_abc", Method: "PUT", Upstream: "u", Path: "/p", WouldRefuse: true,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	got, err := decodeRejection(7, encodeRejection(&r))
	r.ID = 7
	if err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	r.WouldRefuse, r.TraceID = false, ""
	v5 := encodeRejection(&r)
	v5 = v5[:len(v5)-4] // would-refuse, trace id; version 7's repeats 0 and first_at 0
	v5[0] = 5
	r.Repeats, r.FirstAt = 1, r.At // what a version before 7 decodes as
	got, err = decodeRejection(7, v5)
	if err != nil || got != r {
		t.Fatalf("version 5: %+v %v", got, err)
	}
}
