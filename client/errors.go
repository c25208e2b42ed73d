package client

// The SDK's errors: sentinels, the gateway's problem documents as *Error,
// and transport failures.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors. Every error the SDK returns for a gateway answer or an
// unreachable gateway is an *Error; match it with errors.Is against these,
// and use errors.As for the facts.
var (
	// ErrStale: the gateway refused a fenced write because the lease it
	// carried is not the resource's current one (problem codes stale_token,
	// lease_expired, lease_released, unknown_lease). The write did not reach
	// the upstream, and the gateway recorded the refusal. Every ErrStale is
	// also an ErrLeaseLost.
	ErrStale = errors.New("fencegw: stale lease")
	// ErrLeaseHeld: Acquire found the resource held by another lease
	// (lease_held); *Error.Holder, ExpiresAt and RetryAfter say by whom and
	// for how long.
	ErrLeaseHeld = errors.New("fencegw: lease held")
	// ErrLeaseLost: the lease is no longer held: the gateway said so
	// (lease_lost, not_found on renew or release, or any ErrStale), or its
	// TTL ran out on the local monotonic clock without a successful renewal.
	// It is the cause of a lost Lease's Context and what its Err returns.
	ErrLeaseLost = errors.New("fencegw: lease lost")
	// ErrUnavailable: the gateway could not serve the call: 503
	// (store_unavailable, fence_busy; see *Error.RetryAfter), or no answer
	// at all (connection refused, broken, timed out by an intermediary).
	// Nothing was granted or forwarded by the gateway that answered 503;
	// without an answer the SDK cannot know.
	ErrUnavailable = errors.New("fencegw: gateway unavailable")
	// ErrUpstream: the gateway admitted a fenced write but got no answer from
	// the upstream (upstream_unreachable, 502; upstream_timeout, 504). After
	// a timeout or a connection broken mid-request the write may still land.
	ErrUpstream = errors.New("fencegw: upstream failed")
	// ErrOutcomeUnknown: a fenced write with an Idempotency-Key was
	// forwarded once and its outcome is unknown (the upstream timed out, a
	// connection broke, the gateway stopped with it in flight); the gateway
	// never forwards that key again (idempotency_outcome_unknown). It may
	// have been applied: the caller decides, typically by reading the
	// upstream's state. DoIdempotent returns it after retrying.
	ErrOutcomeUnknown = errors.New("fencegw: outcome unknown")
	// ErrReleased is the cause of a Lease's Context after Release succeeded.
	ErrReleased = errors.New("fencegw: lease released")
)

// Problem codes of the gateway: the known values of the spec's ProblemCode
// (api/openapi.yaml, the one list; codes_test.go fails when these and the
// spec disagree). The set is open: a newer gateway may answer a code not
// listed here, which *Error.Code then carries as is; match the codes you
// know and treat any other by *Error.Status.
const (
	CodeInvalidRequest   = "invalid_request"    // 400: malformed input; *Error.Field names it
	CodeMissingLease     = "missing_lease"      // 400: a fenced write without Fencing-Lease
	CodeUnauthorized     = "unauthorized"       // 401: no API key, or a wrong one
	CodeForbidden        = "forbidden"          // 403: the key's role or resource prefixes do not allow the call
	CodeUnknownLease     = "unknown_lease"      // 403: a write under a lease never granted (an ErrStale)
	CodeLeaseNotOwned    = "lease_not_owned"    // 403: the lease was acquired with another API key
	CodeResourceMismatch = "resource_mismatch"  // 403: the lease is for another resource than the path's route binds
	CodeNotFound         = "not_found"          // 404: no such lease, resource or endpoint
	CodeUnknownUpstream  = "unknown_upstream"   // 404: no upstream of that name is configured
	CodeMethodNotAllowed = "method_not_allowed" // 405
	// CodeRequestTimeout (408): the request body did not arrive within the
	// gateway's body timeout. If the write's headers had reached the
	// upstream its outcome is unknown and the resource drains.
	CodeRequestTimeout = "request_timeout"
	CodeLeaseHeld      = "lease_held"     // 409: another holder has the resource (ErrLeaseHeld)
	CodeLeaseLost      = "lease_lost"     // 409: renew or release of a lease no longer current (ErrLeaseLost)
	CodeStaleToken     = "stale_token"    // 409: a newer grant exists (ErrStale)
	CodeLeaseExpired   = "lease_expired"  // 409: the write's lease expired (ErrStale)
	CodeLeaseReleased  = "lease_released" // 409: the write's lease was released or revoked (ErrStale)
	CodeBodyTooLarge   = "body_too_large" // 413
	// CodeKeyInProgress (409): the first write with this Idempotency-Key
	// is still in flight; see *Error.RetryAfter.
	CodeKeyInProgress = "idempotency_key_in_progress"
	// CodeOutcomeUnknown (409): the first write with this Idempotency-Key
	// was forwarded and its outcome is unknown (ErrOutcomeUnknown).
	CodeOutcomeUnknown = "idempotency_outcome_unknown"
	// CodeKeyMismatch (422): the Idempotency-Key was first used for a
	// request with another method, path, query or body.
	CodeKeyMismatch          = "idempotency_key_mismatch"
	CodeUnsupportedMediaType = "unsupported_media_type" // 415: control calls take application/json
	CodeRateLimited          = "rate_limited"           // 429: the key is over its request rate; see *Error.RetryAfter
	CodeTooManyLeases        = "too_many_leases"        // 429: the key holds as many live leases as it may; see *Error.RetryAfter
	CodeInternalError        = "internal_error"         // 500: a bug in the gateway
	CodeUpstreamUnreachable  = "upstream_unreachable"   // 502 (ErrUpstream)
	CodeFenceBusy            = "fence_busy"             // 503: in-flight writes or a drain period held the grant up (ErrUnavailable)
	CodeStoreUnavailable     = "store_unavailable"      // 503: the token store cannot be reached (ErrUnavailable)
	CodeShuttingDown         = "shutting_down"          // 503, /readyz only: the replica is shutting down
	CodeUpstreamTimeout      = "upstream_timeout"       // 504: the write's outcome is unknown (ErrUpstream)

	// CodeFenceLost (503, ErrUnavailable): the gateway replica could no
	// longer prove it held the resource's fence (its database session was
	// lost) before sending the write, or the rest of it. The upstream never
	// got a complete request; if part of it had been sent (the problem's
	// "sent"), the upstream may have acted on that part, and the resource
	// drains as for an unknown outcome.
	CodeFenceLost = "fence_lost"
)

// Operations named in *Error.Op.
const (
	OpAcquire = "acquire"
	OpRenew   = "renew"
	OpRelease = "release"
	OpWrite   = "write"
)

// problemTypePrefix starts the `type` of every problem the gateway itself
// answers; an upstream's own problem documents do not have it.
const problemTypePrefix = "urn:fencegw:problem:"

// maxProblemBody bounds how much of a problem+json body is read to decide
// whether the gateway or the upstream wrote it.
const maxProblemBody = 64 << 10

// Error is a gateway problem answer (Status != 0), or the failure to get
// any answer from the gateway (Status == 0, Err set).
type Error struct {
	Op     string // OpAcquire, OpRenew, OpRelease or OpWrite
	Status int    // HTTP status; 0 if the gateway did not answer
	Code   string // the problem's code, e.g. "stale_token"; "" if the answer was not a gateway problem
	Title  string
	Detail string
	// The problem's facts, where they apply.
	Field        string // invalid_request: the offending field
	Resource     string
	Token        int64 // the token the refused write or lease carried
	CurrentToken int64 // the resource's current token
	Holder       string
	ExpiresAt    time.Time
	RetryAfter   time.Duration // from Retry-After; 0 if absent
	// Err is the transport error when the gateway did not answer.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("fencegw: ")
	b.WriteString(e.Op)
	if e.Status == 0 {
		b.WriteString(": gateway unreachable")
		if e.Err != nil {
			b.WriteString(": ")
			b.WriteString(e.Err.Error())
		}
		return b.String()
	}
	b.WriteString(": ")
	b.WriteString(strconv.Itoa(e.Status))
	if e.Code != "" {
		b.WriteString(" ")
		b.WriteString(e.Code)
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	} else if e.Title != "" {
		b.WriteString(": ")
		b.WriteString(e.Title)
	}
	if e.Resource != "" && !strings.Contains(e.Detail, e.Resource) {
		b.WriteString(" (resource ")
		b.WriteString(strconv.Quote(e.Resource))
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the transport error, if any.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinels: see each one's documentation.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrStale:
		return isStaleCode(e.Code)
	case ErrLeaseHeld:
		return e.Code == CodeLeaseHeld
	case ErrLeaseLost:
		return e.Code == CodeLeaseLost || isStaleCode(e.Code) ||
			(e.Code == CodeNotFound && (e.Op == OpRenew || e.Op == OpRelease))
	case ErrUnavailable:
		switch {
		case e.Status == http.StatusServiceUnavailable:
			return true
		case e.Status == 0:
			// The caller's own cancellation is not the gateway's fault.
			return !errors.Is(e.Err, context.Canceled) && !errors.Is(e.Err, context.DeadlineExceeded)
		case e.Code == "" && e.Op != OpWrite && (e.Status == http.StatusBadGateway || e.Status == http.StatusGatewayTimeout):
			// Not the gateway's answer: an intermediary could not reach it.
			return true
		}
		return false
	case ErrUpstream:
		return e.Code == CodeUpstreamUnreachable || e.Code == CodeUpstreamTimeout
	case ErrOutcomeUnknown:
		return e.Code == CodeOutcomeUnknown
	}
	return false
}

func isStaleCode(code string) bool {
	switch code {
	case CodeStaleToken, CodeLeaseExpired, CodeLeaseReleased, CodeUnknownLease:
		return true
	}
	return false
}

// problemJSON is the gateway's RFC 9457 document with its extension members.
type problemJSON struct {
	Type         string     `json:"type"`
	Title        string     `json:"title"`
	Status       int        `json:"status"`
	Detail       string     `json:"detail"`
	Code         string     `json:"code"`
	Field        string     `json:"field"`
	Resource     string     `json:"resource"`
	Token        *int64     `json:"token"`
	CurrentToken *int64     `json:"current_token"`
	Holder       string     `json:"holder"`
	ExpiresAt    *time.Time `json:"expires_at"`
}

// isProblemContentType reports whether h declares application/problem+json.
func isProblemContentType(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "application/problem+json"
}

// gatewayProblem turns an answer into an *Error if it is a problem document
// written by the gateway itself (problem+json with a urn:fencegw:problem:
// type); ok is false for anything else, such as an upstream's own 409.
func gatewayProblem(op string, status int, h http.Header, body []byte) (e *Error, ok bool) {
	if !isProblemContentType(h) {
		return nil, false
	}
	var p problemJSON
	if err := json.Unmarshal(bytes.TrimSpace(body), &p); err != nil || !strings.HasPrefix(p.Type, problemTypePrefix) {
		return nil, false
	}
	e = &Error{
		Op:         op,
		Status:     status,
		Code:       p.Code,
		Title:      p.Title,
		Detail:     p.Detail,
		Field:      p.Field,
		Resource:   p.Resource,
		Holder:     p.Holder,
		RetryAfter: retryAfter(h),
	}
	if e.Code == "" {
		e.Code = strings.TrimPrefix(p.Type, problemTypePrefix)
	}
	if p.Token != nil {
		e.Token = *p.Token
	}
	if p.CurrentToken != nil {
		e.CurrentToken = *p.CurrentToken
	}
	if p.ExpiresAt != nil {
		e.ExpiresAt = *p.ExpiresAt
	}
	return e, true
}

// answerError is the error for a control call's unexpected answer: the
// gateway's problem if it is one, else a bare status.
func answerError(op string, resp *http.Response, body []byte) *Error {
	if resp == nil {
		return &Error{Op: op, Err: errors.New("no response")}
	}
	if e, ok := gatewayProblem(op, resp.StatusCode, resp.Header, body); ok {
		return e
	}
	return &Error{Op: op, Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode), RetryAfter: retryAfter(resp.Header)}
}

// transportError wraps a failure to get an answer from the gateway.
func transportError(op string, err error) *Error {
	return &Error{Op: op, Err: err}
}

// retryAfter parses Retry-After (seconds or an HTTP date); 0 if absent.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}
