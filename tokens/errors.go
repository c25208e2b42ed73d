package tokens

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors of the domain. Every error returned by a Service or a
// store wraps exactly one of them, so callers match with errors.Is and the
// HTTP layer maps each to one problem code.
var (
	// ErrInvalid: the request itself is malformed (see *Error.Field).
	ErrInvalid = errors.New("invalid request")
	// ErrNotFound: no such lease or resource.
	ErrNotFound = errors.New("not found")
	// ErrLeaseHeld: acquire found another unexpired, unreleased lease.
	ErrLeaseHeld = errors.New("lease held")
	// ErrLeaseLost: renew or release of a lease that expired or was superseded.
	ErrLeaseLost = errors.New("lease lost")
	// ErrStaleToken: a write under a lease that a newer grant superseded.
	ErrStaleToken = errors.New("stale token")
	// ErrLeaseExpired: a write under an expired lease, nothing newer granted yet.
	ErrLeaseExpired = errors.New("lease expired")
	// ErrLeaseReleased: a write under a lease its holder released.
	ErrLeaseReleased = errors.New("lease released")
	// ErrUnknownLease: a write naming a lease id that was never granted.
	ErrUnknownLease = errors.New("unknown lease")
	// ErrNotOwner: a write, renewal or release by a principal other than
	// the one that acquired the lease. Nothing is forwarded or changed.
	ErrNotOwner = errors.New("lease not owned by the caller")
	// ErrFenceBusy: a grant waited too long for in-flight writes or a drain period.
	ErrFenceBusy = errors.New("fence busy")
	// ErrUnavailable: the store that holds tokens cannot be reached; fail closed.
	ErrUnavailable = errors.New("store unavailable")
	// ErrFenceLost: an admitted write can no longer prove that its replica
	// holds the resource's fence (its lock session died or was not
	// confirmed alive lately), so no more of it may be sent (Permit.Check).
	ErrFenceLost = errors.New("fence lost")
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
	// Busy, with ErrUnavailable: the store answers, but every connection
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

// Unavailable wraps a backend failure as ErrUnavailable, so that the gateway
// fails closed (503) instead of guessing.
func Unavailable(op string, cause error) error {
	return &Error{Kind: ErrUnavailable, Detail: op, Cause: cause, RetryAfter: time.Second}
}

// Busy is Unavailable for a store that is reachable but whose connections
// from this process are all in use: the answer must not say "cannot be
// reached", and the operator's fix is a pool size, not the network.
func Busy(op string, cause error) error {
	return &Error{Kind: ErrUnavailable, Detail: op, Cause: cause, RetryAfter: time.Second, Busy: true}
}

// ErrorOf returns the *Error inside err (errors.As), or nil.
func ErrorOf(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}
