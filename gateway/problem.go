package gateway

// Problem responses: each error's RFC 9457 document, built from the one
// table in internal/problems, how it is written, and how errors are logged.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/fencegw/fencegw/gateway/internal/framing"
	"github.com/fencegw/fencegw/internal/problems"
	"github.com/fencegw/fencegw/tokens"
)

const (
	problemTypePrefix        = "urn:fencegw:problem:"
	problemContentType       = "application/problem+json"
	problemInstanceByteLimit = 512 // instance (the request path) is cut to this many bytes
)

// problem is an RFC 9457 document with fencegw's extension members.
type problem struct {
	Type         string     `json:"type"`
	Title        string     `json:"title"`
	Status       int        `json:"status"`
	Detail       string     `json:"detail,omitempty"`
	Instance     string     `json:"instance,omitempty"`
	Code         string     `json:"code"`
	Field        string     `json:"field,omitempty"`
	Resource     string     `json:"resource,omitempty"`
	Token        *int64     `json:"token,omitempty"`
	CurrentToken *int64     `json:"current_token,omitempty"`
	Holder       string     `json:"holder,omitempty"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
	// Sent, with fence_lost: whether any byte of the write had reached the
	// upstream's connection when the fence was found lost.
	Sent *bool `json:"sent,omitempty"`

	retryAfter time.Duration
}

// problemOf is the problem that answers kind, a refusal of the one table
// (internal/problems): its status, code, title and Retry-After, no detail.
func problemOf(kind error) problem {
	k, _ := problems.Of(kind)
	return problem{Status: k.Status, Code: k.Code, Title: k.Title, retryAfter: k.RetryAfter}
}

// problemFor turns any error into a problem: the table (internal/problems)
// gives its status, code and title, the error its detail and extension
// members. Errors the table does not know become 500 internal_error, and
// are the only ones worth logging.
func problemFor(err error) (p problem, internal bool) {
	k, known := problems.Of(err)
	p = problem{Status: k.Status, Code: k.Code, Title: k.Title}
	var maxBytes *http.MaxBytesError
	var tunnel *tunnelError
	switch {
	case errors.As(err, &tunnel):
		p.Field, p.Detail = tunnel.field(), tunnel.detail()
		return p, false
	case errors.As(err, &maxBytes):
		p.Detail = "the body exceeds the limit of " + strconv.FormatInt(maxBytes.Limit, 10) + " bytes"
		return p, false
	}
	internal = !known
	if e := tokens.ErrorOf(err); e != nil {
		p.Field = e.Field
		p.Resource = e.Resource
		p.Holder = e.Holder
		if e.Token != 0 {
			p.Token = &e.Token
		}
		if e.CurrentToken != 0 {
			p.CurrentToken = &e.CurrentToken
		}
		if !e.ExpiresAt.IsZero() {
			t := e.ExpiresAt.UTC()
			p.ExpiresAt = &t
		}
		p.retryAfter = e.RetryAfter
		p.Detail = detailOf(e)
	} else if !internal {
		p.Detail = err.Error()
	}
	if p.retryAfter <= 0 {
		p.retryAfter = k.RetryAfter
	}
	return p, internal
}

func detailOf(e *tokens.Error) string {
	switch {
	case e.Field != "" && e.Detail != "":
		return e.Field + ": " + e.Detail
	case e.Kind == tokens.ErrStoreUnavailable && e.Busy:
		return "every connection of this gateway to the token store is in use; nothing was forwarded or granted (the gateway's log says which pool)"
	case e.Kind == tokens.ErrStoreUnavailable && errors.Is(e.Cause, context.DeadlineExceeded):
		return "the token store did not answer within this request's bound (the wait, or the gateway's --grant-wait): a slow disk or database; the change may still be made, unseen (the gateway's log names the slow commit)"
	case e.Kind == tokens.ErrStoreUnavailable:
		return "the token store cannot be reached; nothing was forwarded or granted"
	case e.Detail != "":
		return e.Detail
	}
	switch e.Kind {
	case tokens.ErrStaleToken:
		return "token " + strconv.FormatInt(e.Token, 10) + " was superseded by token " + strconv.FormatInt(e.CurrentToken, 10) + "; the write was not forwarded"
	case tokens.ErrLeaseExpired:
		return "the lease expired; the write was not forwarded"
	case tokens.ErrLeaseReleased:
		return "the lease was released by its holder; the write was not forwarded"
	case tokens.ErrUnknownLease:
		return "no such lease was ever granted; the write was not forwarded"
	case tokens.ErrLeaseNotOwned:
		return "the lease was acquired by another key; nothing was forwarded or changed"
	case tokens.ErrLeaseHeld:
		return "the resource is held by another lease"
	case tokens.ErrLeaseLost:
		return "the lease expired, was released or was superseded"
	}
	return ""
}

// writeProblem answers err as application/problem+json.
func writeProblem(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	p, internal := problemFor(err)
	// A store call the client's cancellation cut short (a half-closed or
	// closed connection, on net/http's server, or seen by the listener's
	// own loop for a call that watches its client: framing.WatchClient) is
	// the client's doing, not the store's: no 503 for that either.
	gone := r.Context().Err() != nil || errors.Is(err, framing.ErrClientGone)
	cancelled := gone && errors.Is(err, context.Canceled)
	if internal || cancelled {
		if gone {
			// The client went away (it cancelled the call, as an SDK does
			// with a renewal it no longer needs, or its connection broke):
			// the store call failed because of that, not because of the
			// gateway. Not an error, and no 500 either: a client that only
			// half-closed its connection, which net/http's server takes for
			// gone, would read it. The connection is closed unanswered, as
			// after any broken exchange (the call may have taken effect: a
			// grant already committing is made; its lease expires).
			log.Debug("request abandoned by its client", "method", r.Method, "path", logPath(r), "err", logErr(err))
			if r.Context().Value(http.ServerContextKey) != nil {
				panic(http.ErrAbortHandler)
			}
		} else {
			log.Error("request failed", "method", r.Method, "path", logPath(r), "err", logErr(err))
		}
		if internal {
			p.Detail = "" // don't leak internals
		}
	}
	sendProblem(w, r, p)
}

func sendProblem(w http.ResponseWriter, r *http.Request, p problem) {
	p.Type = problemTypePrefix + p.Code
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
		if len(p.Instance) > problemInstanceByteLimit {
			p.Instance = p.Instance[:problemInstanceByteLimit]
		}
	}
	if sw, ok := w.(*statusWriter); ok { // tracing.go
		sw.code = p.Code
	}
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Cache-Control", "no-store")
	if p.retryAfter > 0 {
		h.Set("Retry-After", problems.RetryAfterSeconds(p.retryAfter))
	}
	if p.Status == http.StatusRequestTimeout {
		// RFC 9110 15.5.9: the connection is closed after a 408.
		h.Set("Connection", "close")
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// logPath is r's path as logs may hold it: lease ids (renew, release and
// lookup paths carry them) cut to their hints. Lease ids never reach a
// log, at any level.
func logPath(r *http.Request) string { return tokens.RedactLeaseIDs(r.URL.Path) }

// logErr is err's message with any lease id in it cut to its hint.
func logErr(err error) string {
	if err == nil {
		return ""
	}
	return tokens.RedactLeaseIDs(err.Error())
}
