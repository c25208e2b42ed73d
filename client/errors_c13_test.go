package client

import (
	"errors"
	"net/http"
	"testing"
)

// TestC13UnknownCodeCarriedAsData: a gateway problem with a code this SDK
// does not know is still an *Error carrying the code and status, matched
// by status (a 503 is ErrUnavailable) and by no other sentinel.
func TestC13UnknownCodeCarriedAsData(t *testing.T) {
	h := http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"2"}}
	body := []byte(`{"type":"urn:fencegw:problem:brand_new","title":"New","status":418,"code":"brand_new","detail":"d"}`)
	e, ok := gatewayProblem(OpWrite, 418, h, body)
	if !ok || e.Code != "brand_new" || e.Status != 418 || e.Detail != "d" {
		t.Fatalf("unknown code: %+v %v", e, ok)
	}
	for _, s := range []error{ErrStale, ErrLeaseLost, ErrLeaseHeld, ErrUnavailable, ErrUpstream, ErrOutcomeUnknown} {
		if errors.Is(e, s) {
			t.Fatalf("an unknown 418 matches %v", s)
		}
	}
	e, ok = gatewayProblem(OpWrite, 503, h, []byte(`{"type":"urn:fencegw:problem:brand_new_503","status":503,"code":"brand_new_503"}`))
	if !ok || e.Code != "brand_new_503" || !errors.Is(e, ErrUnavailable) || e.RetryAfter.Seconds() != 2 {
		t.Fatalf("unknown 503: %+v", e)
	}
	if _, ok := gatewayProblem(OpWrite, 409, h, []byte(`{"type":"https://statements.example/problems/duplicate","status":409}`)); ok {
		t.Fatal("an upstream's own problem document became a gateway error")
	}
}
