package tokens

// The domain's errors: the sentinel kinds with their wire codes, and Error,
// which carries a kind with its details.

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Kind is the type of the sentinel errors: a message for logs, and the code
// that names the failure on the wire, in problem documents and in the
// rejection log (api/openapi.yaml's ProblemCode: a code is contract and
// never changes). Every error returned by a Service or a store wraps
// exactly one kind, so callers match with errors.Is and CodeOf names it.
// internal/problems holds the one table that gives each code its HTTP
// status and title.
type Kind struct{ code, msg string }

// NewKind returns a sentinel error named by code. The layers above the
// domain declare their refusals with it too (internal/problems, auth), so
// that every refusal carries its code the same way.
func NewKind(code, msg string) *Kind { return &Kind{code: code, msg: msg} }

func (k *Kind) Error() string { return k.msg }

// Code is k's wire code.
func (k *Kind) Code() string { return k.code }

// CodeOf returns the code of the kind err wraps, or "" if it wraps none.
func CodeOf(err error) string {
	var k *Kind
	if errors.As(err, &k) {
		return k.code
	}
	return ""
}

// Codes of the domain's kinds. The rejection codes (RejectionCodes) are
// those of the refusals a write can get.
const (
	CodeInvalidRequest   = "invalid_request"
	CodeNotFound         = "not_found"
	CodeLeaseHeld        = "lease_held"
	CodeLeaseLost        = "lease_lost"
	CodeStaleToken       = "stale_token"
	CodeLeaseExpired     = "lease_expired"
	CodeLeaseReleased    = "lease_released"
	CodeUnknownLease     = "unknown_lease"
	CodeLeaseNotOwned    = "lease_not_owned"
	CodeFenceBusy        = "fence_busy"
	CodeStoreUnavailable = "store_unavailable"
	CodeFenceLost        = "fence_lost"
	CodeTooManyLeases    = "too_many_leases"
)

// Sentinel errors of the domain.
var (
	// ErrInvalid: the request itself is malformed (see *Error.Field).
	ErrInvalid = NewKind(CodeInvalidRequest, "invalid request")
	// ErrNotFound: no such lease or resource.
	ErrNotFound = NewKind(CodeNotFound, "not found")
	// ErrLeaseHeld: acquire found another unexpired, unreleased lease.
	ErrLeaseHeld = NewKind(CodeLeaseHeld, "lease held")
	// ErrLeaseLost: renew or release of a lease that expired or was superseded.
	ErrLeaseLost = NewKind(CodeLeaseLost, "lease lost")
	// ErrStaleToken: a write under a lease that a newer grant superseded.
	ErrStaleToken = NewKind(CodeStaleToken, "stale token")
	// ErrLeaseExpired: a write under an expired lease, nothing newer granted yet.
	ErrLeaseExpired = NewKind(CodeLeaseExpired, "lease expired")
	// ErrLeaseReleased: a write under a lease its holder released.
	ErrLeaseReleased = NewKind(CodeLeaseReleased, "lease released")
	// ErrUnknownLease: a write naming a lease id that was never granted.
	ErrUnknownLease = NewKind(CodeUnknownLease, "unknown lease")
	// ErrLeaseNotOwned: a write, renewal or release by a principal other than
	// the one that acquired the lease. Nothing is forwarded or changed.
	ErrLeaseNotOwned = NewKind(CodeLeaseNotOwned, "lease not owned by the caller")
	// ErrFenceBusy: a grant waited too long for in-flight writes or a drain period.
	ErrFenceBusy = NewKind(CodeFenceBusy, "fence busy")
	// ErrStoreUnavailable: the store that holds tokens cannot be reached; fail closed.
	ErrStoreUnavailable = NewKind(CodeStoreUnavailable, "store unavailable")
	// ErrTooManyLeases: a grant that would give the lease's owner more live
	// leases than its cap (GrantRequest.MaxLeases). The store decides it,
	// in the step that writes the lease.
	ErrTooManyLeases = NewKind(CodeTooManyLeases, "too many leases")
	// ErrFenceLost: an admitted write can no longer prove that its replica
	// holds the resource's fence (its lock session died or was not
	// confirmed alive lately), so no more of it may be sent (Permit.Check).
	ErrFenceLost = NewKind(CodeFenceLost, "fence lost")
)

// Error carries the facts of a domain failure. It wraps one of the sentinel
// errors above (Kind) and optionally the underlying cause.
type Error struct {
	Kind         error
	Field        string // ErrInvalid: the offending field
	Detail       string
	Resource     string
	Token        int64 // the token the caller presented or held
	CurrentToken int64 // the resource's last granted token
	Holder       string
	ExpiresAt    time.Time
	RetryAfter   time.Duration // when retrying later may succeed
	// Busy, with ErrStoreUnavailable: the store answers, but every connection
	// this process may open to it is in use (see Busy).
	Busy  bool
	Cause error
}

func (e *Error) Error() string {
	msg := e.Kind.Error()
	if e.Field != "" {
		msg += ": " + e.Field
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Resource != "" {
		msg += fmt.Sprintf(" (resource %q)", e.Resource)
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is matches e's sentinel without Unwrap's slice: errors.Is(err,
// ErrNotFound) on every fresh resource's grant allocated one.
func (e *Error) Is(target error) bool {
	k, ok := target.(*Kind)
	return ok && e.Kind == error(k)
}

// Unwrap exposes both the sentinel and the cause to errors.Is/As.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Kind, e.Cause}
	}
	return []error{e.Kind}
}

// Invalid returns an ErrInvalid naming the field and what is wrong with it.
func Invalid(field, detail string) error {
	return &Error{Kind: ErrInvalid, Field: field, Detail: detail}
}

// LeaseHeld is the ErrLeaseHeld that refuses a grant: holder is the live
// lease in the way (its Resource at least; Holder, Token and ExpiresAt when
// known), retryAfter its remaining time. Every store and the Service build
// the refusal here, so that it carries the same facts whoever decides it.
func LeaseHeld(holder Lease, retryAfter time.Duration) error {
	return &Error{Kind: ErrLeaseHeld, Resource: holder.Resource, Holder: holder.Holder, CurrentToken: holder.Token,
		ExpiresAt: holder.ExpiresAt, RetryAfter: retryAfter}
}

// TooManyLeases is the ErrTooManyLeases that refuses a grant to owner,
// which holds max live leases already. A slot frees at the latest when one
// of them expires; Retry-After says a second, the refusal not knowing when.
func TooManyLeases(resource, owner string, max int) error {
	return &Error{Kind: ErrTooManyLeases, Resource: resource, RetryAfter: time.Second,
		Detail: "key " + strconv.Quote(owner) + " holds " + strconv.Itoa(max) + " live leases, its cap"}
}

// Unavailable wraps a backend failure as ErrStoreUnavailable, so that the gateway
// fails closed (503) instead of guessing.
func Unavailable(op string, cause error) error {
	return &Error{Kind: ErrStoreUnavailable, Detail: op, Cause: cause, RetryAfter: time.Second}
}

// Busy is Unavailable for a store that is reachable but whose connections
// from this process are all in use: the answer must not say "cannot be
// reached", and the operator's fix is a pool size, not the network.
func Busy(op string, cause error) error {
	return &Error{Kind: ErrStoreUnavailable, Detail: op, Cause: cause, RetryAfter: time.Second, Busy: true}
}

// ErrorOf returns the *Error inside err (errors.As), or nil.
func ErrorOf(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}
