package problems_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fencegw/fencegw/auth"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

// Every sentinel of every layer has a row: the one its code names. (The
// gateway's TestProblemCodesMatchSpec holds the table to the spec.)
func TestEverySentinelHasARow(t *testing.T) {
	sentinels := []*tokens.Kind{
		tokens.ErrInvalid, tokens.ErrNotFound, tokens.ErrLeaseHeld, tokens.ErrLeaseLost,
		tokens.ErrStaleToken, tokens.ErrLeaseExpired, tokens.ErrLeaseReleased, tokens.ErrUnknownLease,
		tokens.ErrLeaseNotOwned, tokens.ErrResourceMismatch, tokens.ErrFenceBusy, tokens.ErrStoreUnavailable,
		tokens.ErrFenceLost, tokens.ErrKeyMismatch, tokens.ErrKeyInProgress, tokens.ErrOutcomeUnknown,
		auth.ErrUnauthenticated,
		problems.ErrMissingLease, problems.ErrRequestTimeout, problems.ErrUnsupportedMediaType,
		problems.ErrMethodNotAllowed, problems.ErrUnknownUpstream, problems.ErrForbidden,
		problems.ErrRateLimited, tokens.ErrTooManyLeases, problems.ErrUpstreamUnreachable,
		problems.ErrUpstreamTimeout, problems.ErrShuttingDown,
	}
	if got := auth.ErrUnauthenticated.Code(); got != problems.CodeUnauthorized {
		t.Errorf("auth.ErrUnauthenticated carries %q, the table's row is %q", got, problems.CodeUnauthorized)
	}
	for _, k := range sentinels {
		p, known := problems.Of(k)
		if !known || p.Code != k.Code() || p.Status == 0 || p.Title == "" {
			t.Errorf("%v (%s): Of = %+v, %v", k, k.Code(), p, known)
		}
		if q, ok := problems.ByCode(k.Code()); !ok || q != p {
			t.Errorf("ByCode(%s) = %+v, %v; Of gave %+v", k.Code(), q, ok, p)
		}
	}
	for _, p := range problems.All() {
		if (p.Status == http.StatusServiceUnavailable || p.Status == http.StatusTooManyRequests || p.Code == tokens.CodeLeaseHeld) != (p.RetryAfter > 0) {
			t.Errorf("%s (%d): Retry-After %v; every 503 and 429 and lease_held, and only they, say when to retry", p.Code, p.Status, p.RetryAfter)
		}
	}
}

// An error is answered as the kind it was made with, wrapped however
// deeply; a kind in its cause does not change the answer (a lease whose
// resource the store lost is store_unavailable, not not_found).
func TestOfTakesTheKindTheErrorWasMadeWith(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
	}{
		{tokens.Invalid("ttl_ms", "too long"), tokens.CodeInvalidRequest},
		{fmt.Errorf("renew: %w", &tokens.Error{Kind: tokens.ErrLeaseLost}), tokens.CodeLeaseLost},
		{tokens.Unavailable("resource state", &tokens.Error{Kind: tokens.ErrNotFound}), tokens.CodeStoreUnavailable},
		{fmt.Errorf("read: %w", &http.MaxBytesError{Limit: 10}), problems.CodeBodyTooLarge},
		{&tokens.Error{Kind: problems.ErrRequestTimeout, Cause: &http.MaxBytesError{Limit: 10}}, problems.CodeBodyTooLarge},
	} {
		if p, known := problems.Of(tc.err); !known || p.Code != tc.code {
			t.Errorf("Of(%v) = %s, %v; want %s", tc.err, p.Code, known, tc.code)
		}
	}
}

// What the table does not know, and a failure of the gateway itself, is
// 500 internal_error, reported unknown (the one kind worth logging).
func TestUnknownIsInternal(t *testing.T) {
	for _, err := range []error{nil, errors.New("disk on fire"), context.Canceled, problems.ErrInternal} {
		if p, known := problems.Of(err); known || p.Code != problems.CodeInternalError || p.Status != http.StatusInternalServerError {
			t.Errorf("Of(%v) = %+v, %v; want internal_error, unknown", err, p, known)
		}
	}
	if _, ok := problems.ByCode("no_such_code"); ok {
		t.Error("ByCode knows a code the table lacks")
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", time.Minute: "60"} {
		if got := problems.RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %s, want %s", d, got, want)
		}
	}
}
