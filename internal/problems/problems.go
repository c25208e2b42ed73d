// Package problems is the one table of refusals: for every code an answer
// of fencegw can carry (api/openapi.yaml's ProblemCode), its HTTP status,
// its title and the Retry-After it is sent with when the error names no
// time. The gateway's problem documents and the dashboard's error pages
// both ask it; nothing else decides a status.
//
// A refusal is a sentinel error, a tokens.Kind that carries its code (the
// domain's are in tokens, the HTTP layer's below, auth.ErrUnauthenticated
// in auth), or an error wrapping one; Of finds its row by that code. The
// codes are contract: never change one, a status or a title the spec
// shows (gateway's TestProblemCodesMatchSpec keeps the table equal to the
// spec).
package problems

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fencegw/fencegw/tokens"
)

// Problem is how one kind of refusal is answered.
type Problem struct {
	Code   string
	Status int
	Title  string
	// RetryAfter is sent as Retry-After when the error names no time of
	// its own (0: none).
	RetryAfter time.Duration
}

// retry is the Retry-After of every refusal that may pass if repeated a
// little later: a held lease, a rate limit, a store or fence that is busy
// or unreachable, a replica shutting down.
const retry = time.Second

// table is every refusal, by code. The domain's codes are tokens'; the
// HTTP layer's are below; unauthorized is auth.ErrUnauthenticated's
// (HTTP's name for 401).
var table = []Problem{
	// The request.
	{tokens.CodeInvalidRequest, http.StatusBadRequest, "Invalid request", 0},
	{CodeMissingLease, http.StatusBadRequest, "Missing lease", 0},
	{CodeRequestTimeout, http.StatusRequestTimeout, "Request timeout", 0},
	{CodeBodyTooLarge, http.StatusRequestEntityTooLarge, "Body too large", 0},
	{CodeUnsupportedMediaType, http.StatusUnsupportedMediaType, "Unsupported media type", 0},
	{CodeMethodNotAllowed, http.StatusMethodNotAllowed, "Method not allowed", 0},
	{tokens.CodeNotFound, http.StatusNotFound, "Not found", 0},
	{CodeUnknownUpstream, http.StatusNotFound, "Unknown upstream", 0},

	// The caller.
	{CodeUnauthorized, http.StatusUnauthorized, "Unauthorized", 0},
	{CodeForbidden, http.StatusForbidden, "Forbidden", 0},
	{CodeRateLimited, http.StatusTooManyRequests, "Too many requests", retry},
	{tokens.CodeTooManyLeases, http.StatusTooManyRequests, "Too many leases", retry},

	// Leases: acquire, renew, release.
	{tokens.CodeLeaseHeld, http.StatusConflict, "Lease held", retry},
	{tokens.CodeLeaseLost, http.StatusConflict, "Lease lost", 0},

	// Fenced writes refused (the rejection codes, tokens.RejectionCodes).
	{tokens.CodeStaleToken, http.StatusConflict, "Stale fencing token", 0},
	{tokens.CodeLeaseExpired, http.StatusConflict, "Lease expired", 0},
	{tokens.CodeLeaseReleased, http.StatusConflict, "Lease released", 0},
	{tokens.CodeUnknownLease, http.StatusForbidden, "Unknown lease", 0},
	{tokens.CodeLeaseNotOwned, http.StatusForbidden, "Lease not owned", 0},
	{tokens.CodeResourceMismatch, http.StatusForbidden, "Resource mismatch", 0},

	// Idempotency keys.
	{tokens.CodeKeyMismatch, http.StatusUnprocessableEntity, "Idempotency key mismatch", 0},
	{tokens.CodeKeyInProgress, http.StatusConflict, "Idempotency key in progress", 0},
	{tokens.CodeOutcomeUnknown, http.StatusConflict, "Outcome unknown", 0},

	// The upstream.
	{CodeUpstreamUnreachable, http.StatusBadGateway, "Upstream unreachable", 0},
	{CodeUpstreamTimeout, http.StatusGatewayTimeout, "Upstream timeout", 0},

	// The gateway and its store: fail closed.
	{tokens.CodeFenceBusy, http.StatusServiceUnavailable, "Fence busy", retry},
	{tokens.CodeFenceLost, http.StatusServiceUnavailable, "Fence lost", retry},
	{tokens.CodeStoreUnavailable, http.StatusServiceUnavailable, "Store unavailable", retry},
	{CodeShuttingDown, http.StatusServiceUnavailable, "Shutting down", retry},
	{CodeInternalError, http.StatusInternalServerError, "Internal error", 0},
}

// Codes of the HTTP layer's refusals.
const (
	CodeMissingLease         = "missing_lease"
	CodeRequestTimeout       = "request_timeout"
	CodeBodyTooLarge         = "body_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeUnknownUpstream      = "unknown_upstream"
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = tokens.CodeForbidden
	CodeRateLimited          = "rate_limited"
	CodeUpstreamUnreachable  = "upstream_unreachable"
	CodeUpstreamTimeout      = "upstream_timeout"
	CodeShuttingDown         = "shutting_down"
	CodeInternalError        = "internal_error"
)

// Sentinels of the HTTP layer's refusals. A body larger than its limit is
// net/http's *http.MaxBytesError, which Of answers as body_too_large.
var (
	// ErrMissingLease: a fenced write without a Fencing-Lease header.
	ErrMissingLease = tokens.NewKind(CodeMissingLease, "missing lease")
	// ErrRequestTimeout: the request body did not arrive within the body
	// timeout.
	ErrRequestTimeout = tokens.NewKind(CodeRequestTimeout, "request body timeout")
	// ErrUnsupportedMediaType: a control call whose body is not JSON.
	ErrUnsupportedMediaType = tokens.NewKind(CodeUnsupportedMediaType, "unsupported media type")
	// ErrMethodNotAllowed: a method the endpoint does not take (CONNECT on
	// the proxy).
	ErrMethodNotAllowed = tokens.NewKind(CodeMethodNotAllowed, "method not allowed")
	// ErrUnknownUpstream: a fenced write to an upstream name that is not
	// configured.
	ErrUnknownUpstream = tokens.NewKind(CodeUnknownUpstream, "unknown upstream")
	// ErrForbidden: the caller's role, Host or Origin does not allow the
	// call.
	ErrForbidden = tokens.NewKind(CodeForbidden, "forbidden")
	// ErrRateLimited: the caller's request budget is spent.
	ErrRateLimited = tokens.NewKind(CodeRateLimited, "rate limited")
	// ErrUpstreamUnreachable: the upstream could not be reached, or the
	// connection broke.
	ErrUpstreamUnreachable = tokens.NewKind(CodeUpstreamUnreachable, "upstream unreachable")
	// ErrUpstreamTimeout: the upstream did not answer within the forward
	// timeout.
	ErrUpstreamTimeout = tokens.NewKind(CodeUpstreamTimeout, "upstream timeout")
	// ErrShuttingDown: this replica takes no new requests.
	ErrShuttingDown = tokens.NewKind(CodeShuttingDown, "shutting down")
	// ErrInternal: a failure of the gateway itself (a panic). It is
	// answered as any error the table does not know is: Of reports it
	// unknown.
	ErrInternal = tokens.NewKind(CodeInternalError, "internal error")
)

var byCode = func() map[string]Problem {
	m := make(map[string]Problem, len(table))
	for _, p := range table {
		if _, dup := m[p.Code]; dup {
			panic("problems: code " + p.Code + " is in the table twice")
		}
		m[p.Code] = p
	}
	return m
}()

// Of returns the problem that answers err: the row of the code of the kind
// err wraps (tokens.CodeOf: the kind the error was made with, not one its
// cause may wrap), or body_too_large for a *http.MaxBytesError. known is
// false for an error the table does not know, which is internal_error's
// and the only kind worth logging.
func Of(err error) (p Problem, known bool) {
	if maxBytes := (*http.MaxBytesError)(nil); errors.As(err, &maxBytes) {
		return byCode[CodeBodyTooLarge], true
	}
	if p, ok := byCode[tokens.CodeOf(err)]; ok && p.Code != CodeInternalError {
		return p, true
	}
	return byCode[CodeInternalError], false
}

// ByCode returns the problem of code.
func ByCode(code string) (Problem, bool) {
	p, ok := byCode[code]
	return p, ok
}

// RetryAfterSeconds renders d as a Retry-After value: whole seconds,
// rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// All returns the table, in its order.
func All() []Problem { return append([]Problem(nil), table...) }
