package bolt

import (
	"testing"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// A rejection keeps its Principal (codec version 3); one written by version
// 2, before principals were recorded, still decodes, without one.
func TestRejectionPrincipalCodec(t *testing.T) {
	r := tokens.Rejection{At: time.Unix(1, 0), Resource: "r", Code: tokens.CodeNotOwner, Token: 1, CurrentToken: 1,
		Holder: "w2", LeaseHint: "fl_abc", Method: "PUT", Upstream: "u", Path: "/p", Principal: "w1"}
	r.Repeats, r.FirstAt = 3, time.Unix(0, 5)
	got, err := decodeRejection(7, encodeRejection(&r))
	r.ID = 7
	if err != nil || got != r {
		t.Fatalf("%+v %v", got, err)
	}
	r.Principal, r.Repeats, r.FirstAt = "", 0, time.Time{}
	v2 := encodeRejection(&r)
	v2 = v2[:len(v2)-3] // the empty principal's length, repeats 0, first_at 0
	v2[0] = 2
	r.Repeats, r.FirstAt = 1, r.At // what a version before 6 decodes as
	got, err = decodeRejection(7, v2)
	if err != nil || got != r {
		t.Fatalf("version 2: %+v %v", got, err)
	}
}
